"""The few physically meaningful constants of the analytic model, and where they come from.

Every value is a property of the hardware/software stack, never of a configuration: a GEMM efficiency
curve, the memory-bound share of a layer (elementwise kernels: LayerNorm, GeLU, softmax, dropout), the
per-kernel overheads, link efficiencies and latencies, and how much gradient communication overlaps.
The defaults were fitted on the vTrain A100 measurements and Megatron's SC21 table (``bench/fidelity.py --fit``,
a local coordinate search). The current set was reached from a physical start, the GEMM plateau at 80 % of peak
(what cuBLAS reaches on A100) and 10 us per NVLink ring step, instead of the previous optimum at the 90 % ceiling
with 29 us steps: fit loss 9.19 % -> 8.88 %, and rank correlation per model size up (README, Fidelity). They are
overridable per request: ``"cost_model": {"kind": "analytic", "calibration": {"gemm_eta_max": 0.7}}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from solvers.cost_model.efficiency import GemmEfficiency
from solvers.errors import FieldProblem, SpecError, shown
from solvers.unknown_keys import unknown_key_problems

# Constants the model divides by (an override of 0 would make every estimate infinite), and fractions.
_DIVISORS = ("gemm_eta_max", "hbm_efficiency", "intra_efficiency", "inter_efficiency")
_FRACTIONS = ("dp_overlap", "tp_overlap", "zero_overlap", "cp_overlap")
# Beyond any constant of the model (seconds, bytes, GEMM sizes); near the float limit the times overflowed to inf.
_MAX_OVERRIDE = 1e9


# Former constants that describe the software stack, not how well it runs: where they went.
_MOVED = {"flash_attention": 'the attention kernel is part of the stack now: training.stack.attention = '
                             '"fused" (the default) or "unfused"'}


def _override_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot override the constant ``key`` (None: it can)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        return f"must be a finite non-negative number, got {shown(value)}"
    if value > _MAX_OVERRIDE:
        return f"must be at most {_MAX_OVERRIDE:g}, got {shown(value)}"
    if key in _DIVISORS and value == 0:
        return "must be positive (the model divides by it)"
    if key in _FRACTIONS and value > 1:
        return f"is a fraction: must be within 0..1, got {shown(value)}"
    return None


@dataclass(frozen=True)
class AnalyticCalibration:
    # large-GEMM fraction of tensor-core peak on the A100 (cuBLAS bf16 plateaus at ~80-85%); other GPUs scale it
    # by their measured matmul share over the A100's (matmul.py)
    gemm_eta_max: float = 0.8
    gemm_d_half: float = 48.0  # GEMM output dimension (m, n) at which that axis alone halves efficiency
    gemm_k_half: float = 40.0  # the same for the reduction dimension k
    hbm_efficiency: float = 0.80  # achievable fraction of HBM bandwidth for memory-bound kernels
    elementwise_traffic: float = 2.3  # HBM bytes moved by non-GEMM kernels per byte of stored activation
    kernel_overhead_s: float = 0.00084  # host time to issue one layer's forward kernels (backward: twice)
    microbatch_overhead_s: float = 0.001632  # per micro-batch and stage: batch broadcast, loss, schedule bookkeeping
    intra_efficiency: float = 1.0  # NVLink: achieved / nominal bus bandwidth of large collectives
    inter_efficiency: float = 0.71  # network: achieved / nominal
    intra_latency_s: float = 1.2e-05  # per ring step
    inter_latency_s: float = 1.1088e-05  # per ring step across nodes
    dp_overlap: float = 1.0  # fraction of the last backward that hides the per-step gradient sync
    tp_overlap: float = 1.0  # fraction of the weight-gradient GEMMs that hides the backward TP all-reduce
    zero_overlap: float = 0.7  # fraction of a micro-batch's compute that hides its ZeRO-2/3 traffic
    cp_overlap: float = 0.9  # fraction of the attention core that hides the ring-attention KV exchange
    grad_comm_bytes: float = 4.0  # bytes per gradient element on the wire (fp32 grads, Megatron's default)
    optimizer_traffic_bytes: float = 36.0  # HBM bytes per parameter for one Adam step on the local shard
    step_overhead_s: float = 0.0  # per step: data loading, logging, launch of the step
    reserve_gib: float = 1.5  # CUDA context, cuBLAS/NCCL workspaces (a GPU's: none on a CPU host)
    fragmentation: float = 0.08  # allocator fragmentation, as a fraction of activations

    @property
    def gemm(self) -> GemmEfficiency:
        return GemmEfficiency(eta_max=self.gemm_eta_max, d_half=self.gemm_d_half, k_half=self.gemm_k_half)

    def with_overrides(self, overrides: dict[str, Any] | None, loc: tuple[str | int, ...] = ()) -> AnalyticCalibration:
        if not overrides:
            return self
        if not isinstance(overrides, dict):
            raise SpecError.at(loc, "must be an object of calibration constants")
        known = {f.name: f for f in fields(self)}
        problems = []
        clean: dict[str, Any] = {}
        for key, value in overrides.items():
            if key in _MOVED:
                problems.append(FieldProblem((*loc, key), _MOVED[key]))
            elif key not in known:
                problems += unknown_key_problems([key], known, loc)
            elif (why := _override_problem(key, value)) is not None:
                problems.append(FieldProblem((*loc, key), why))
            else:
                clean[key] = float(value)
        if problems:
            raise SpecError(problems)
        return replace(self, **clean)


DEFAULT_CALIBRATION = AnalyticCalibration()
