"""The terminal's reading of a plan result: each kind's summary (``solvers.<kind>.summary``, through the kind
registry) and what the CLI adds to it, the commands that say more (``--json`` gives it all)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from solvers.documents import HybridEstimateResult, PlanResult
from solvers.hybrid.summary import summarise_estimate
from solvers.kinds import solver_kind


def render_estimate(request: Mapping[str, Any], estimate: HybridEstimateResult) -> str:
    """Text for an estimate of a given hybrid strategy (what-if)."""
    return "\n".join([*summarise_estimate(request, estimate), "(the whole estimate: --json)"])


def render(request: dict[str, Any], result: PlanResult) -> str:
    """Text for a solved request: its kind's summary, and for a hybrid plan how to launch it."""
    lines = solver_kind(result.kind).summarise(request, result)
    if result.kind == "hybrid":
        from solvers.exports import FORMATS

        lines.append(f"(to launch it: --export {', '.join(FORMATS[:-1])} or {FORMATS[-1]}; each says what it "
                     "changes; --export-of megatron for the best uniform plan)")
    return "\n".join([*lines, "(the whole result: --json)"])
