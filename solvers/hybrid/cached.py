"""A cost model's per-stage answers cached by stage context for one request.

The baselines, the embedding-variant filter, the bounds and the DP all ask ``stage_fixed`` and
``in_flight_micro_batches`` for the same (pipeline configuration, stage, embedding) contexts; the analytic
model recomputes communication times on every call (a third of a 64-GPU search's CPU time). Everything
else is delegated unchanged, so plans and estimates are the model's own."""

from __future__ import annotations

from typing import Any

from solvers.cost_model.base import CostModel, StageContext, StageFixed


class CachedStages:
    """Wraps ``cm``: same answers, each stage context computed once."""

    def __init__(self, cm: CostModel):
        self._cm = cm
        self._fixed: dict[StageContext, StageFixed] = {}
        self._in_flight: dict[StageContext, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cm, name)

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
