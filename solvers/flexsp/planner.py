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
    milp_backend: str | None = None  # None: the request turned the MILP off
    milp_runs: int = 0
    milp_improved: int = 0
    milp_gain_s: float = 0.0
    milp_models: list[tuple[int, int]] = field(default_factory=list)  # (buckets, slots)
    milp_failures: list[dict[str, Any]] = field(default_factory=list)  # MilpFailure documents
    milp_above_gap: int = 0  # micro-batches more than MILP_GAP above their own lower bound
    milp_too_large: int = 0  # ... of which hold more sequences than the MILP takes

    def solver(self) -> str:
        """What produced the plan: the heuristic family of the winning candidate, and the MILP backend only
        when it improved at least one micro-batch (a MILP that ran and improved nothing produced nothing)."""
        family = next(f for f in ("fill", "blaster", "static-sp", "") if self.chosen.startswith(f)) or self.chosen
        return f"{family}+{self.milp_backend}" if self.milp_improved and self.milp_backend else family

    def milp_outcome(self) -> str:
        if self.milp_backend is None:
            return "off"
        if self.milp_runs == 0:
            return "not_run"
        if self.milp_failures:
            return "failed" if len(self.milp_failures) == self.milp_runs else "partly_failed"
        return "improved" if self.milp_improved else "no_improvement"

    def milp_not_run_reason(self) -> str | None:
        if self.milp_backend is None or self.milp_runs:
            return None
        if self.milp_above_gap == 0:
            return f"every micro-batch is within {MILP_GAP:.0%} of its own lower bound"
        return (f"the {self.milp_too_large} micro-batch(es) above their lower bound hold more sequences than "
                "solver.max_sequences")

    def failure_note(self) -> str | None:
        """The result's note when MILP runs failed: said, never read as "no improvement"."""
        if not self.milp_failures:
            return None
        first = self.milp_failures[0]["detail"]
        return (f"MILP ({self.milp_backend}) failed on {len(self.milp_failures)} of its {self.milp_runs} "
                f"micro-batch(es) ({first}); those keep their greedy packing")

    def to_dict(self) -> dict[str, Any]:
        return {
            "solver": self.solver(),
            "candidates_s": self.candidates,
            "chosen": self.chosen,
            "milp": {"backend": self.milp_backend, "outcome": self.milp_outcome(),
                     "not_run_reason": self.milp_not_run_reason(), "runs": self.milp_runs,
                     "improved": self.milp_improved, "failed": len(self.milp_failures),
                     "failures": self.milp_failures, "gain_s": self.milp_gain_s,
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
        if gap <= MILP_GAP:
            continue
        report.milp_above_gap += 1
        if len(rows) <= settings.max_sequences:
            gaps.append((-gap, m))
        else:
            report.milp_too_large += 1
    out = list(plan)
    chosen = sorted(gaps)[: settings.max_runs]
    for n, (_, m) in enumerate(chosen):
        mb = out[m]
        rows = mb.rows()
        load = peak_ms(ctx, mb)
        report.milp_runs += 1
        report.milp_models.append(model_size(ctx, rows, settings))
        outcome = solve_micro_batch(ctx, rows, settings, warm=mb)
        better = outcome.plan
        if better is None:
            report.milp_failures.append({"status": outcome.status, "detail": outcome.failure,
                                         "sequences": len(rows)})
        elif peak_ms(ctx, better) < load - 1e-6:
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
        report.milp_backend = settings.backend
        best_plan = _polish(ctx, best_plan, settings, report, progress)
    # Longest micro-batches first: a stable, readable order (the step time does not depend on it).
    best_plan.sort(key=lambda mb: (-peak_ms(ctx, mb), mb.rows()))
    return best_plan, report
