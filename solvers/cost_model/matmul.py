"""How much of a GPU's tensor-core peak its GEMMs reach, relative to the GPU the constants were fitted on.

The GEMM curve (``efficiency.GemmEfficiency``) and its plateau ``gemm_eta_max`` were fitted on A100 measurements
(vTrain, SC21): they describe how an A100's GEMMs fall short of its peak. Newer GPUs fall shorter. The largest
dense matmul measured on an A100 SXM runs at 86.9 % of its bf16 peak; on an H100 SXM at 80.3 % of bf16 and 70.9 %
of FP8; on a B200 at 77.6 % and 76.3 % (maximum achievable matmul FLOPS, MAMF; the presets name the table).
Priced with the A100's share, an H100's FP8 GEMMs came out 18 % fast.

So a GPU's GEMMs are priced with the curve's plateau scaled by the GPU's measured share over the A100's:
``cluster.gpu.matmul_tflops / peak_tflops`` for 16-bit GEMMs, ``matmul_tflops_fp8 / peak_tflops_fp8`` for FP8
ones. A GPU without the figure is priced at the A100's share (scale 1), and the estimate says that this was
assumed. The HBM roofline of a GEMM is not scaled: the figures measure tensor-core throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

from solvers.presets import GPU_PRESETS
from solvers.specs import GPUSpec, Precision

# The GPU the shipped constants describe: the A100 SXM's bf16 MAMF over its peak (the a100 presets' figures).
REFERENCE_NAME = "A100 SXM bf16"
REFERENCE_SHARE = GPU_PRESETS["a100-80gb"]["matmul_tflops"] / GPU_PRESETS["a100-80gb"]["peak_tflops"]


@dataclass(frozen=True)
class MatmulScale:
    """The shares of the peak a GPU's GEMMs are priced at: ``linear_share`` for the linear layers' GEMMs (at the
    training precision), ``sixteen_bit_share`` for the GEMMs that stay 16-bit under FP8 (attention core, LM head);
    each measured, or the reference's where assumed."""

    linear_share: float
    sixteen_bit_share: float
    measured: bool  # every share priced comes from the GPU's own figure
    note: str

    @property
    def linear(self) -> float:
        """The multiplier of the GEMM curve's plateau for the linear layers' GEMMs."""
        return self.linear_share / REFERENCE_SHARE

    @property
    def sixteen_bit(self) -> float:
        return self.sixteen_bit_share / REFERENCE_SHARE


def _share(measured_tflops: float | None, peak_tflops: float | None) -> float | None:
    if measured_tflops is None or not peak_tflops:
        return None
    return measured_tflops / peak_tflops


def matmul_scale(gpu: GPUSpec, precision: Precision) -> MatmulScale:
    """How ``gpu``'s GEMMs compare with the reference's, at ``precision`` (fp32 GEMMs have no figure)."""
    bf16 = _share(gpu.matmul_tflops, gpu.peak_tflops)
    if precision == "fp8":
        linear, field = _share(gpu.matmul_tflops_fp8, gpu.peak_tflops_fp8), "cluster.gpu.matmul_tflops_fp8"
    elif precision == "fp32":
        linear, field = None, "fp32 matmul figure in the GPU spec"
    else:
        linear, field = bf16, "cluster.gpu.matmul_tflops"
    parts = [(precision, linear, field)]
    if precision == "fp8":  # the attention core and the LM head stay 16-bit
        parts.append(("bf16", bf16, "cluster.gpu.matmul_tflops"))

    def said(peak: str, share: float | None, where: str) -> str:
        if share is not None:
            return f"{100 * share:.1f} % of the {peak} peak (measured: {where})"
        return f"{100 * REFERENCE_SHARE:.1f} % of the {peak} peak (assumed: no {where} for the {gpu.name})"

    lin = REFERENCE_SHARE if linear is None else linear
    six = lin if precision != "fp8" else REFERENCE_SHARE if bf16 is None else bf16
    note = ("GEMMs priced at " + "; 16-bit ones (attention core, LM head) at ".join(said(*x) for x in parts)
            + f"; the constants describe {100 * REFERENCE_SHARE:.1f} % on the {REFERENCE_NAME}")
    return MatmulScale(linear_share=lin, sixteen_bit_share=six,
                       measured=all(share is not None for _, share, _ in parts), note=note)


def linear_gemm_flops(gpu: GPUSpec, precision: Precision) -> float:
    """The FLOP/s the GEMM curve prices ``gpu``'s linear layers against: its peak at ``precision`` scaled by its
    measured matmul share (the cost model's, and what ranks the GPU types of a mixed fleet by speed)."""
    return gpu.peak_flops(precision) * matmul_scale(gpu, precision).linear
