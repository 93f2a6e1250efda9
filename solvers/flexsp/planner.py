"""FlexSP planning of one global batch: candidate micro-batchings, moves between them, MILP polish.

Candidates: the micro-batch filler (two ladders of target slack), the sorted blaster for a few
micro-batch counts, and whatever the caller adds (the static-SP plans: FlexSP must never lose to them).
Light micro-batches are dissolved into the others; the two best candidates then get sequences moved off
their slowest groups and every micro-batch re-packed by the bisecting greedy (kept if faster). The
winner's micro-batches furthest above their own lower bound go to the MILP, warm-started from the greedy
packing, under deterministic limits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solvers.flexsp.blaster import blast
from solvers.flexsp.filling import fill_micro_batches
from solvers.flexsp.milp import MilpSettings, model_size, solve_micro_batch
from solvers.flexsp.packing import PackingContext, best_greedy, lower_bound_ms, peak_ms
from solvers.flexsp.plan import MicroBatch, step_time_ms
from solvers.flexsp.rebalance import dissolve_light_micro_batches, move_off_slowest_groups

Progress = Callable[[float, str], None]
REPACKED = 2
FINE_SLACK = (0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.3, 0.5)
MILP_GAP = 0.01  # polish micro-batches whose load is > 1 % above their own lower bound


@dataclass
class SearchReport:
    # name -> step time (s) of each candidate once light micro-batches are dissolved (before the final moves)
    candidates: dict[str, float] = field(default_factory=dict)
    chosen: str = ""
    milp_runs: int = 0
    milp_improved: int = 0
    milp_gain_s: float = 0.0
    milp_models: list[tuple[int, int]] = field(default_factory=list)  # (buckets, slots)

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidates_s": self.candidates,
            "chosen": self.chosen,
            "milp": {"runs": self.milp_runs, "improved": self.milp_improved, "gain_s": self.milp_gain_s,
                     "largest_model": max(self.milp_models, default=(0, 0), key=lambda m: m[0] * m[1])},
        }


def _repack(ctx: PackingContext, plan: list[MicroBatch]) -> list[MicroBatch]:
    out = []
    for mb in plan:
        again = best_greedy(ctx, mb.rows())
        better = again is not None and peak_ms(ctx, again) < peak_ms(ctx, mb)
        out.append(again if better and again is not None else mb)
    return out


def _polish(ctx: PackingContext, plan: list[MicroBatch], settings: MilpSettings, report: SearchReport,
            progress: Progress | None) -> list[MicroBatch]:
    """MILP on the micro-batches furthest above their own lower bound (at most ``settings.max_runs``)."""
    t = ctx.table
    gaps = []
    for m, mb in enumerate(plan):
        rows = mb.rows()
        bound = lower_bound_ms(t, np.asarray(rows), ctx.num_gpus)
        gap = peak_ms(ctx, mb) / bound - 1 if bound > 0 else 0.0
        if gap > MILP_GAP and len(rows) <= settings.max_sequences:
            gaps.append((-gap, m))
    out = list(plan)
    chosen = sorted(gaps)[: settings.max_runs]
    for n, (_, m) in enumerate(chosen):
        mb = out[m]
        rows = mb.rows()
        load = peak_ms(ctx, mb)
        report.milp_runs += 1
        report.milp_models.append(model_size(ctx, rows, settings))
        better = solve_micro_batch(ctx, rows, settings, warm=mb)
        if better is not None and peak_ms(ctx, better) < load - 1e-6:
            report.milp_improved += 1
            report.milp_gain_s += (load - peak_ms(ctx, better)) / 1e3
            out[m] = better
        if progress:
            progress(0.5 + 0.5 * (n + 1) / len(chosen), f"MILP {n + 1}/{len(chosen)}")
    return out


def plan_batch(ctx: PackingContext, settings: MilpSettings | None, progress: Progress | None = None,
               extra: dict[str, list[MicroBatch]] | None = None) -> tuple[list[MicroBatch], SearchReport]:
    """The best plan over the candidates (plus ``extra`` ones, e.g. the static-SP plans), MILP-polished."""
    report = SearchReport()
    t = ctx.table
    candidates: dict[str, list[MicroBatch]] = {
        "fill": fill_micro_batches(ctx),
        "fill-fine": fill_micro_batches(ctx, slack=FINE_SLACK),
        "fill-lookahead": fill_micro_batches(ctx, objective="lookahead"),
    }
    if progress:
        progress(0.2, "micro-batch filling")
    for k, plan in blast(ctx).items():
        candidates[f"blaster-{k}"] = plan
    candidates.update(extra or {})
    if progress:
        progress(0.4, "sequence blaster")
    candidates = {name: dissolve_light_micro_batches(ctx, plan) for name, plan in candidates.items()}
    totals = {name: step_time_ms(t, plan) for name, plan in candidates.items()}
    report.candidates = {name: v / 1e3 for name, v in totals.items()}
    # Re-packing and moving between micro-batches rarely reorders the candidates; only the best two get it.
    best_name, best_plan, best_time = "", [], np.inf
    for name in sorted(totals, key=lambda k: (totals[k], k))[:REPACKED]:
        plan = _repack(ctx, move_off_slowest_groups(ctx, candidates[name]))
        total = step_time_ms(t, plan)
        if total < best_time - 1e-9:
            best_name, best_plan, best_time = name, plan, total
    report.chosen = best_name
    if settings is not None:
        best_plan = _polish(ctx, best_plan, settings, report, progress)
    # Longest micro-batches first: a stable, readable order (the step time does not depend on it).
    best_plan.sort(key=lambda mb: (-peak_ms(ctx, mb), mb.rows()))
    return best_plan, report
