"""A cost model's per-stage answers cached by stage context for one request.

The baselines, the embedding-variant filter, the bounds and the DP all ask ``stage_fixed`` and
``in_flight_micro_batches`` for the same (pipeline configuration, stage, embedding) contexts; the analytic
model recomputes communication times on every call (a third of a 64-GPU search's CPU time). The rest of the
interface is passed through unchanged, so plans and estimates are the model's own."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from solvers.cost_model.base import CostModel, Estimate, LayerCosts, PipelineTraits, StageContext, StageFixed
from solvers.strategy import LayerStrategy, PlanStrategy


class CachedStages(CostModel):
    """Wraps ``cm``: same answers, each stage context computed once."""

    def __init__(self, cm: CostModel):
        self._cm = cm
        self.num_layers, self.num_gpus, self.memory_limit_bytes = cm.num_layers, cm.num_gpus, cm.memory_limit_bytes
        self._fixed: dict[StageContext, StageFixed] = {}
        self._in_flight: dict[StageContext, float] = {}

    def stage_fixed(self, ctx: StageContext) -> StageFixed:
        hit = self._fixed.get(ctx)
        if hit is None:
            hit = self._fixed[ctx] = self._cm.stage_fixed(ctx)
        return hit

    def in_flight_micro_batches(self, ctx: StageContext) -> float:
        hit = self._in_flight.get(ctx)
        if hit is None:
            hit = self._in_flight[ctx] = float(self._cm.in_flight_micro_batches(ctx))
        return hit

    def layer_costs(self, layer: int, candidates: Sequence[LayerStrategy], ctx: StageContext) -> LayerCosts:
        return self._cm.layer_costs(layer, candidates, ctx)

    def layer_costs_key(self, ctx: StageContext) -> Hashable:
        return self._cm.layer_costs_key(ctx)

    def transition_s(self, prev: Sequence[LayerStrategy], nxt: Sequence[LayerStrategy], ctx: StageContext
                     ) -> np.ndarray:
        return self._cm.transition_s(prev, nxt, ctx)

    def pipeline_step_time(self, stage_time_s: Sequence[float], stage_step_time_s: Sequence[float],
                           ctx: StageContext) -> float:
        return self._cm.pipeline_step_time(stage_time_s, stage_step_time_s, ctx)

    def evaluate(self, plan: PlanStrategy) -> Estimate:
        return self._cm.evaluate(plan)

    @property
    def pipeline_traits(self) -> PipelineTraits:
        return self._cm.pipeline_traits

    def pipeline_micro_batches(self, ctx: StageContext) -> int:
        return self._cm.pipeline_micro_batches(ctx)

    def step_bound_from_linear(self, linear_s: float, mean_work_s: float) -> float:
        return self._cm.step_bound_from_linear(linear_s, mean_work_s)
