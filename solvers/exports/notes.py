"""The approximations every export that writes one strategy for all layers states: layers that use another
strategy and uneven pipeline stages."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from solvers.hybrid.baselines import without_experts
from solvers.strategy import LayerStrategy, PlanStrategy


def describe(s: LayerStrategy, recompute: bool = True) -> str:
    """A layer strategy in one short line (expert fields aside; recomputation unless ``recompute`` is False)."""
    sp = f" sp={s.sp}" if s.sp else ""
    rc = f" recompute={s.recompute}" if recompute else ""
    return f"tp{s.tp} cp{s.cp} dp{s.dp}{sp} zero{s.zero}{rc}"


def layout_notes(plan: PlanStrategy, main: LayerStrategy, framework: str, recompute: bool = True) -> list[str]:
    """What writing ``main`` on every layer changes, and the uneven stages, for a ``framework`` that takes one
    layer strategy. ``recompute`` False: the layers are compared without their recomputation (for a framework
    that sets recomputation apart from the layout, whose note on it is its own)."""
    notes: list[str] = []

    def key(s: LayerStrategy) -> LayerStrategy:
        s = without_experts(s)
        return s if recompute else replace(s, recompute=main.recompute)

    other = [i for i, s in enumerate(plan.layers) if key(s) != main]
    if other:
        kinds = Counter(key(plan.layers[i]) for i in other)
        desc = "; ".join(f"{n} x {describe(s, recompute)}" for s, n in kinds.most_common())
        notes.append(f"per-layer strategy not expressible in {framework}: {len(other)} of {len(plan.layers)} layers "
                     f"use another strategy ({desc}); all layers get {describe(main, recompute)}")
    if len(set(plan.stage_layers)) > 1:
        notes.append(f"uneven pipeline stages {list(plan.stage_layers)}")
    return notes
