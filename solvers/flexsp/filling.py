"""Micro-batch filling: build the step one micro-batch at a time, each as full of useful work as it can be.

The longest remaining sequence sets the pace of the next micro-batch: for each SP degree it fits, its
time on that degree is a target load, and every other remaining sequence (longest first) joins a group
while that group stays under the target and within memory. Among the targets (and a few slightly looser
ones) the filler keeps the micro-batch that does the most work per second — work measured at each
sequence's cheapest degree, so a packing that buys speed with all-to-all volume does not look better than
it is. Long sequences thereby share a micro-batch with the short ones that fit in their shadow, instead
of the reference's sorted chunks where every micro-batch is uniform.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solvers.flexsp.packing import Packing, PackingContext, finish, longest_first, pack
from solvers.flexsp.plan import MicroBatch

DEFAULT_SLACK = (0.0, 0.03, 0.1, 0.3)


def _min_work(ctx: PackingContext) -> list[float]:
    t = ctx.table
    return np.where(t.fits, t.work_ms, np.inf).min(axis=1).tolist()


def fill_micro_batches(
    ctx: PackingContext, rows: Sequence[int] | None = None, slack: Sequence[float] = DEFAULT_SLACK
) -> list[MicroBatch]:
    table = ctx.table
    remaining = longest_first(table, list(range(len(table.lengths))) if rows is None else list(rows))
    min_work = _min_work(ctx)
    beta = table.beta_ms
    plan: list[MicroBatch] = []

    def score(p: Packing) -> float:
        return sum(min_work[i] for i in p.taken) / (beta + max(p.loads))

    while remaining:
        first = remaining[0]
        best: Packing | None = None
        best_score = -1.0
        # Paces: the longest sequence on each degree it fits, and the remaining work spread over
        # k micro-batches (short sequences alone would otherwise pay beta once per tiny target).
        total_work = sum(min_work[i] for i in remaining)
        spread = total_work / ctx.num_gpus
        paces = [ctx.time[first][j] for j in range(len(ctx.sizes)) if ctx.fits[first][j]]
        paces += [spread / k for k in (1, 2, 3, 4)]
        targets = sorted({pace * (1 + eps) for pace in paces for eps in slack})

        # No packing under target T does more than min(all work, N·T) of work: try the most promising
        # targets first and skip those whose bound cannot beat the best packing found.
        def bound(target: float, work: float = total_work) -> float:
            return min(work, ctx.num_gpus * target) / (beta + target)

        for target in sorted(targets, key=lambda x: -bound(x)):
            if bound(target) <= best_score:
                break
            p = pack(ctx, remaining, target, select=True)
            # The longest sequence must be in: a micro-batch of only shorter ones would leave it to a
            # later micro-batch of its own, paying the fixed cost for one sequence.
            if p is not None and p.taken and p.taken[0] == first and score(p) > best_score:
                best, best_score = p, score(p)
        if best is None:  # the longest sequence fits no group: the caller validated this cannot happen
            raise ValueError(f"sequence of {ctx.lengths[first]} tokens fits no SP group")
        plan.append(finish(ctx, best))
        taken = set(best.taken)
        remaining = [i for i in remaining if i not in taken]
    return plan
