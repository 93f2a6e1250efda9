"""What a framework's writer reads: the plan and its request's batch, model and cluster, taken once from the
result document and the parsed request by ``solvers.exports.export`` so that the writers never read those."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from solvers.specs import ModelSpec, Precision, StackSpec, TrainingSpec
from solvers.strategy import PlanStrategy

# The plan's request as the cost model takes it: forwarded whole to price what a framework runs, never read.
Request = dict[str, Any]


@dataclass(frozen=True)
class UniformPlan:
    """The result's best uniform Megatron-style plan where it fits: what Megatron-LM runs as it is."""

    plan: PlanStrategy
    step_time_s: float


@dataclass(frozen=True)
class ExportInput:
    """One export's plan and what its documents say about it; the writers take this and nothing else."""

    plan: PlanStrategy
    batch: int  # global batch, in samples
    seq: int
    model: ModelSpec | None  # None without the request's model: the model arguments are left out
    num_gpus: int | None  # the request's cluster; None without a request
    request: Request | None  # None: nothing to price the framework's run with
    training: TrainingSpec | None  # the request's, parsed; None without a request
    plan_step_time_s: float  # the plan's own estimated step; 0 where the result has none
    uniform: UniformPlan | None

    @property
    def expert_layers(self) -> list[bool] | None:
        """Which layers are MoE, by the model; None for a dense model or without one."""
        m = self.model
        return [m.is_moe_layer(i) for i in range(m.num_layers)] if m is not None and m.moe else None

    @property
    def precision(self) -> Precision:
        """The request's training precision (the cost model's default, bf16, without one)."""
        return self.training.precision if self.training is not None else "bf16"

    @property
    def stack(self) -> StackSpec:
        """The request's software stack (the default stack without one)."""
        return self.training.stack if self.training is not None else StackSpec()
