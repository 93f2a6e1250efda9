"""The interface between cost models and the planners.

A cost model answers two questions:
1. ``layer_costs``: for one layer and many candidate strategies, vectorised numpy arrays of what the
   layer costs per micro-batch and per step, and of its memory. The hybrid planner's dynamic program
   works on these arrays only.
2. ``evaluate``: the full estimate of a whole plan, with breakdowns.

Contract between the two (the planner's exactness relies on it): ``evaluate(plan)`` equals what one gets
by aggregating ``layer_costs`` (+ ``transition_s`` between consecutive layers) per stage and feeding the
stage totals to ``pipeline_step_time`` and ``stage_memory``. A cost model may add terms that do not depend
on the per-layer choices (embedding/head, fixed buffers) through ``stage_fixed``.
That aggregation is written once, in ``solvers.cost_model.aggregate`` (``evaluate_plan``); cost models
call it from ``evaluate`` and planners may call its pieces (``stage_context``, ``stage_memory_bytes``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from solvers.documents.hybrid import HybridEstimate
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Schedule


@dataclass(frozen=True)
class StageContext:
    """Everything about the pipeline that a layer's cost depends on."""

    pp: int
    stage: int
    micro_batches: int
    micro_batch_samples: float  # global_batch_size / micro_batches (whole stage, all dp replicas)
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    # The plan's embedding / LM-head strategy (first and last stage); None = the model's default.
    embedding: EmbeddingStrategy | None = None


Parts = dict[str, np.ndarray]


@dataclass
class LayerCosts:
    """Per-candidate costs of one layer (arrays aligned with the candidate list)."""

    time_s: np.ndarray  # forward+backward (+recompute, +TP/SP/CP comm) of one micro-batch, seconds
    step_time_s: np.ndarray  # once per step: exposed gradient sync / ZeRO gathers not hidden per micro-batch
    state_bytes: np.ndarray  # parameters + gradients + optimizer states resident per GPU
    activation_bytes: np.ndarray  # activations kept per in-flight micro-batch per GPU
    peak_extra_bytes: np.ndarray  # transient working memory (e.g. ZeRO-3 gathered weights, comm buffers)
    # Optional breakdowns (for explaining an estimate; the planner needs only the totals above):
    # parts_s sums to time_s (keys: compute, recompute, tp_comm, cp_comm, ...), step_parts_s to step_time_s
    # (dp_comm_exposed, optimizer, ...), memory_parts_bytes to state_bytes (parameters, gradients, optimizer).
    parts_s: Parts = field(default_factory=dict)
    step_parts_s: Parts = field(default_factory=dict)
    memory_parts_bytes: Parts = field(default_factory=dict)


@dataclass
class StageFixed:
    time_s: float = 0.0  # per micro-batch (e.g. embedding / LM head on first / last stage)
    step_time_s: float = 0.0
    state_bytes: float = 0.0
    activation_bytes: float = 0.0  # per in-flight micro-batch
    other_bytes: float = 0.0  # framework/context reserve, buffers
    parts_s: dict[str, float] = field(default_factory=dict)  # sums to time_s
    step_parts_s: dict[str, float] = field(default_factory=dict)  # sums to step_time_s
    memory_parts_bytes: dict[str, float] = field(default_factory=dict)  # sums to state_bytes + other_bytes


# A plan's estimate is the hybrid document's: the cost model fills in what the API, the dashboard and the exports read
Estimate = HybridEstimate


@dataclass(frozen=True)
class PipelineTraits:
    """What the planner may assume about a cost model's ``pipeline_step_time`` beyond monotonicity (t_s, u_s: stage
    s's time per micro-batch and per step; m: the micro-batches the formula counts, ``pipeline_micro_batches``).
    The planner's bounds rely on each trait declared: one declared that does not hold makes its certificate
    claim more than is true. Declaring none is safe; the search then solves what generic bounds cannot rule out."""

    linear: bool = False
    """The step is exactly ``pipeline.step_time_s``, (m - 1/v) max t + Σ t / v + max u: a single stage costs
    m t + u, which the weight-m DP table optimises exactly, and the linear formula's bounds hold as they are."""
    at_least_slowest_stage: bool = False
    """The step is at least m × the slowest stage's time (true of the linear formula as well)."""
    bounded_by_linear: bool = False
    """``step_bound_from_linear`` turns lower bounds on the linear formula's step and on the stages' mean work
    Σ_s (m t_s + u_s) / p into a lower bound on this model's step (a formula that grows with both, such as ranks
    sharing a host's cores); the planner lifts the linear formula's bounds through it."""
    at_least_chain: bool = False
    """The step is at least every stage's time once plus (m - 1) × the last stage's: Σ_s t_s + (m - 1) t_last."""
    adds_first_stage_sync: bool = False
    """On top of its pipelined part the step adds the first stage's step time less its fixed time (the gradient
    sync its compute leaves unhidden), never less than 0."""


class CostModel(Protocol):
    """Cost models subclass it explicitly: they inherit the defaults below and state their own where they differ."""

    num_layers: int
    num_gpus: int
    memory_limit_bytes: float

    def layer_costs(self, layer: int, candidates: Sequence[LayerStrategy], ctx: StageContext) -> LayerCosts: ...

    def layer_costs_key(self, ctx: StageContext) -> Hashable:
        """What of ``ctx`` ``layer_costs`` reads: two contexts of one pipeline configuration with equal keys get
        equal layer costs, which the planner then asks for once (default: the context less its embedding
        strategy, which no layer's cost depends on: every stage apart)."""
        return replace(ctx, embedding=None)

    def transition_s(
        self, prev: Sequence[LayerStrategy], nxt: Sequence[LayerStrategy], ctx: StageContext
    ) -> np.ndarray:
        """Matrix [len(prev), len(nxt)] of per-micro-batch re-layout time between consecutive layers."""
        ...

    def stage_fixed(self, ctx: StageContext) -> StageFixed:
        """A stage's terms outside its layers (embedding, LM head, pipeline hand-overs, reserves). The embedding
        strategy enters the first and last stage's terms alone: a middle stage's are the same under every
        embedding (the planner asks about the edge stages alone when it bounds a configuration's variants)."""
        ...

    def in_flight_micro_batches(self, ctx: StageContext) -> float:
        """How many micro-batches' activations a stage holds at its peak under the schedule."""
        ...

    def pipeline_step_time(self, stage_time_s: Sequence[float], stage_step_time_s: Sequence[float],
                           ctx: StageContext) -> float:
        """Step time from per-stage per-micro-batch times and per-step times; monotone in each input."""
        ...

    def evaluate(self, plan: PlanStrategy) -> Estimate: ...

    @property
    def pipeline_traits(self) -> PipelineTraits:
        """What ``pipeline_step_time`` guarantees the planner's bounds (default: nothing beyond monotonicity)."""
        return PipelineTraits()

    def pipeline_micro_batches(self, ctx: StageContext) -> int:
        """The micro-batches ``pipeline_step_time`` counts for the context's configuration: the m of the bounds
        ``pipeline_traits`` declares (default: the configuration's own)."""
        return ctx.micro_batches

    def step_bound_from_linear(self, linear_s: float, mean_work_s: float) -> float:
        """A lower bound on the step from a lower bound on the linear formula's step and one on the stages' mean
        work per step; asked only where ``pipeline_traits.bounded_by_linear`` is declared (default: 0, true of
        every step and of no use to the bounds)."""
        return 0.0
