"""The approximations every export that writes one strategy for all layers states: layers that use another
strategy and uneven pipeline stages."""

from __future__ import annotations

from collections import Counter

from solvers.hybrid.baselines import without_experts
from solvers.strategy import LayerStrategy, PlanStrategy


def describe(s: LayerStrategy) -> str:
    """A layer strategy in one short line (expert fields aside)."""
    sp = f" sp={s.sp}" if s.sp else ""
    return f"tp{s.tp} cp{s.cp} dp{s.dp}{sp} zero{s.zero} recompute={s.recompute}"


def layout_notes(plan: PlanStrategy, main: LayerStrategy, framework: str) -> list[str]:
    """What writing ``main`` on every layer changes, and the uneven stages, for a ``framework`` that takes one
    layer strategy."""
    notes: list[str] = []
    other = [i for i, s in enumerate(plan.layers) if without_experts(s) != main]
    if other:
        kinds = Counter(without_experts(plan.layers[i]) for i in other)
        desc = "; ".join(f"{n} x {describe(s)}" for s, n in kinds.most_common())
        notes.append(f"per-layer strategy not expressible in {framework}: {len(other)} of {len(plan.layers)} layers "
                     f"use another strategy ({desc}); all layers get {describe(main)}")
    if len(set(plan.stage_layers)) > 1:
        notes.append(f"uneven pipeline stages {list(plan.stage_layers)}")
    return notes
