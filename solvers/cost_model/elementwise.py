"""HBM traffic that PyTorch's eager mode adds to a layer's elementwise ops, counted from the ops it runs.

The calibrated elementwise term (``AnalyticCalibration.elementwise_traffic``) prices a layer whose elementwise ops
run fused: Megatron's and Transformer Engine's fused kernels, or torch.compile's generated ones. In eager mode
(``training.stack.elementwise = "eager"``: torchtitan without torch.compile) each op is its own kernel, reading
its inputs from HBM and writing its output there. The bytes below are what that adds per token of a layer's
forward, at 2-byte activations and 4-byte upcasts, against the same computation fused (one read of each input,
one write of each output). The backward of each op is its own kernels too; the model prices it as twice the
forward, as it does the fused ops.

A gated (SwiGLU) layer is counted as the Llama layer that torchtitan runs; the model spec names no norm or
position-embedding kind, so the gated MLP stands for the family:
- RMSNorm (two a layer), decomposed with an fp32 upcast: cast (read 2, write 4 bytes an element), square (4, 4),
  mean (4), scale (4, 4), cast back (4, 2), times the weight (2, 2): 36 bytes an element against 4 fused.
- rotary embeddings on q and k: cast to fp32 (2, 4), complex multiply (4, 4), cast back (4, 2): 20 bytes an
  element against 4 fused.
- SwiGLU: silu (2, 2) and the product with the up projection (4, 2): 10 bytes an element of the FFN width
  against 6 fused.
The residual adds, the attention output's transpose and the GQA key/value copies cost the same either way.

A GeLU layer (GPT: LayerNorm, a single kernel in eager mode too; GeLU one kernel; biases in the GEMMs' epilogue)
differs only where it has hidden dropout: dropout and the residual add run as two kernels (read 2 and 2, write 2
and 2 bytes an element besides the mask) instead of one, 4 bytes an element more, twice a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from solvers.cost_model.shapes import LayerShape

RMSNORM_EAGER, RMSNORM_FUSED = 36.0, 4.0
ROPE_EAGER, ROPE_FUSED = 20.0, 4.0
SWIGLU_EAGER, SWIGLU_FUSED = 10.0, 6.0
DROPOUT_ADD_EXTRA = 4.0


@dataclass(frozen=True)
class EagerExtraBytes:
    """Bytes per token of a layer's forward that eager mode adds, grouped by how they shrink under parallelism."""

    replicated: float  # on hidden-wide tensors: whole on every tensor-parallel rank unless sequence parallel
    split: float  # on tensors split over tensor-parallel ranks as their weights are (q, k, the FFN's)


def eager_extra_bytes(shape: LayerShape) -> EagerExtraBytes:
    h = shape.hidden
    if shape.gated:
        return EagerExtraBytes(
            replicated=2 * (RMSNORM_EAGER - RMSNORM_FUSED) * h,
            split=(ROPE_EAGER - ROPE_FUSED) * (shape.q_width + shape.kv_width)
            + (SWIGLU_EAGER - SWIGLU_FUSED) * shape.ffn * shape.top_k)
    return EagerExtraBytes(replicated=2 * DROPOUT_ADD_EXTRA * h if shape.hidden_dropout else 0.0, split=0.0)
