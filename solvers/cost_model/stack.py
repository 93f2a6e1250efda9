"""What the software stack (``training.stack``) means in the analytic model's numbers.

The calibration constants describe how well a mechanism works where the stack runs it (how much of the
weight-gradient GEMMs hides the TP all-reduce, how much of the last backward hides the gradient sync); the
stack says whether it runs at all. So one set of constants prices the Megatron-LM of 2021 (no asynchronous
TP all-reduce, unfused attention) and today's Megatron-core alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from solvers.cost_model.calibration import AnalyticCalibration
from solvers.specs import Fp8Recipe, ModelSpec, StackSpec, TrainingSpec

# HBM bytes per element of a GEMM input to quantise it to FP8: read bf16 (2), write fp8 (1). Current (per-tensor)
# scaling reads the tensor once more for its amax before the cast; block-scaled recipes (MXFP8: 32 elements per
# scale, DeepSeek-style 128-blocks) write a scale per block besides.
FP8_CAST_BYTES: dict[Fp8Recipe, float] = {"delayed": 3.0, "tensorwise": 5.0, "mxfp8": 3.0 + 1 / 32,
                                          "blockwise": 3.0 + 4 / 128}


@dataclass(frozen=True)
class StackTerms:
    """The stack as the model's formulas read it."""

    fused_attention: bool  # no s^2 scores kept; only the unmasked half of causal scores computed
    causal_fraction: float  # share of the s x s score matrix the attention kernels compute
    tp_overlap_backward: float  # share of the weight-gradient GEMMs hiding the backward TP collectives
    tp_overlap_forward: float  # share of the forward GEMMs hiding the forward TP collectives
    dp_overlap: float  # share of the last backward hiding the per-step gradient sync
    fp8_cast_bytes: float  # HBM bytes per GEMM-input element spent on FP8 quantisation (0: no FP8)
    zero_allowed: bool  # whether layers may shard states over data-parallel ranks (ZeRO >= 1)
    selective_per_op: bool  # "selective" recompute is torchtitan's per-op policy, not Megatron's attention core
    eager_elementwise: bool  # each elementwise op its own kernel (solvers.cost_model.elementwise)


def stack_terms(model: ModelSpec, training: TrainingSpec, cal: AnalyticCalibration) -> StackTerms:
    stack: StackSpec = training.stack
    fused = stack.attention == "fused"
    overlap = stack.tp_overlap
    recipe = training.fp8_recipe
    return StackTerms(
        fused_attention=fused,
        causal_fraction=0.5 if (fused and model.causal) else 1.0,
        tp_overlap_backward=cal.tp_overlap if overlap in ("backward", "full") else 0.0,
        tp_overlap_forward=cal.tp_overlap if overlap == "full" else 0.0,
        dp_overlap=cal.dp_overlap if stack.dp_sync_overlapped else 0.0,
        fp8_cast_bytes=FP8_CAST_BYTES[recipe] if recipe is not None else 0.0,
        zero_allowed=stack.distributed_optimizer,
        selective_per_op=stack.framework == "torchtitan",
        eager_elementwise=stack.elementwise_kernels == "eager",
    )
