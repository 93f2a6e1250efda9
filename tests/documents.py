"""Result documents made by hand, for the tests of a reader (summary, exports, worker) on a given plan."""

from __future__ import annotations

from typing import Any

from solvers.documents import HybridResult
from solvers.documents.hybrid import HybridEstimate
from solvers.strategy import PlanStrategy

_ZEROS: dict[str, Any] = {"step_time_s": 0.0, "throughput_samples_per_s": 0.0, "tokens_per_s": 0.0, "mfu": 0.0,
                          "peak_memory_gib": 0.0, "memory_gib_per_stage": [], "breakdown_s": {}}


def hybrid_result(strategy: PlanStrategy | dict[str, Any], estimate: dict[str, Any] | None = None) -> HybridResult:
    """A result of ``strategy`` with ``estimate``'s numbers (those it lacks zero; what only an estimate's answer
    has, its strategy and cost model, dropped), no baselines and none of the search's optional fields."""
    numbers = {k: v for k, v in (estimate or {}).items() if k in HybridEstimate.model_fields}
    return HybridResult.model_validate({
        "strategy": strategy.to_dict() if isinstance(strategy, PlanStrategy) else strategy,
        "estimate": {**_ZEROS, **numbers}, "search": {"time_s": 0.0, "solver": "test"}})
