"""A FlexSP plan in a few lines of text: its step, how far from the lower bound, each micro-batch's
sequence-parallel groups (SP degree, ranks, sequences), and the static SP degrees it is compared with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from solvers.documents.flexsp import FlexSPResult, MicroBatchDoc
from solvers.text import baseline_line, capped, seconds, within_bound

MAX_GROUPS_SHOWN = 40  # (a step of a thousand sequences has hundreds; --json has them all)


def group_lines(micro_batches: Sequence[MicroBatchDoc]) -> list[str]:
    """Per micro-batch its time, then one line per group: SP degree, rank block, sequences and tokens."""
    rows = []
    for k, mb in enumerate(micro_batches):
        rows.append(f"  micro-batch {k + 1}: {seconds(mb.time_s)}, {len(mb.groups)} group"
                    f"{'s' if len(mb.groups) != 1 else ''}")
        for g in mb.groups:
            tokens = f", {g.tokens:,} tokens" if g.tokens is not None else ""
            took = f", {seconds(g.time_s)}" if g.time_s is not None else ""
            n = len(g.sequences)
            rows.append(f"    sp {g.sp} on ranks {g.ranks[0]}-{g.ranks[1]}: {n} sequence{'s' if n != 1 else ''}"
                        f"{tokens}{took}")
    return capped(rows, MAX_GROUPS_SHOWN, "lines")


def summarise(request: Mapping[str, Any], result: FlexSPResult) -> list[str]:
    step = result.estimate.step_time_s
    base = result.baselines
    lines = [f"flexsp: step {seconds(step)}", *within_bound(step, result.lower_bound_s),
             f"groups ({len(result.micro_batches)} micro-batch{'es' if len(result.micro_batches) != 1 else ''}):",
             *group_lines(result.micro_batches), "baselines (same cost model):"]
    lines += [baseline_line(f"static sp {degree}", t, step) for degree, t in base.static_sp.items()]
    # no static degree fits: nothing is best
    lines.append(f"  best static sp: {base.best_static_sp if base.best_static_sp is not None else 'none fits'}")
    if base.static_sp_rule is not None:
        lines.append(f"  static sp rule: {base.static_sp_rule}")
    return lines
