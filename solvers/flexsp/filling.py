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
from typing import Literal

import numpy as np

from solvers.flexsp.packing import Packing, PackingContext, finish, longest_first, pack
from solvers.flexsp.plan import MicroBatch

DEFAULT_SLACK = (0.0, 0.03, 0.1, 0.3)
LOOKAHEAD_BAND = 0.1


def _min_work(ctx: PackingContext) -> list[float]:
    t = ctx.table
    return np.where(t.fits, t.work_ms, np.inf).min(axis=1).tolist()


def fill_micro_batches(
    ctx: PackingContext,
    rows: Sequence[int] | None = None,
    slack: Sequence[float] = DEFAULT_SLACK,
    objective: Literal["ratio", "lookahead"] = "ratio",
) -> list[MicroBatch]:
    """Fill micro-batches one by one (see the module docstring).

    ``objective`` picks each micro-batch: ``"ratio"`` maximises the work it does per second;
    ``"lookahead"`` takes, among the packings within ``LOOKAHEAD_BAND`` of the best ratio, the one that
    minimises its time plus a lower bound of the rest (the fixed cost of the micro-batches the remaining
    tokens need at least, and their least work spread over the cluster) — it prefers filling memory when
    the batch is tight on it. (Minimising that sum alone would be indifferent to cutting the batch into
    many thin micro-batches, as the bound counts the fixed cost of the rest only by its tokens.)
    """
    table = ctx.table
    remaining = longest_first(table, list(range(len(table.lengths))) if rows is None else list(rows))
    min_work = _min_work(ctx)
    beta = table.beta_ms
    n = ctx.num_gpus
    cluster_tokens = n * ctx.capacity[0] // ctx.sizes[0]
    band = LOOKAHEAD_BAND if objective == "lookahead" else 0.0
    plan: list[MicroBatch] = []

    while remaining:
        first = remaining[0]
        total_work = sum(min_work[i] for i in remaining)
        total_tokens = sum(ctx.lengths[i] for i in remaining)

        # Paces: the longest sequence on each degree it fits, and the remaining work spread over
        # k micro-batches (short sequences alone would otherwise pay beta once per tiny target).
        spread = total_work / n
        paces = [ctx.time[first][j] for j in range(len(ctx.sizes)) if ctx.fits[first][j]]
        paces += [spread / k for k in (1, 2, 3, 4)]
        targets = sorted({pace * (1 + eps) for pace in paces for eps in slack})
        # No packing under target T does more than min(all work, N·T) of work: the ratio's bound. Most
        # promising targets first; stop once a bound cannot reach the band below the best ratio found.
        found: list[tuple[float, Packing]] = []
        best_ratio = 0.0
        for target in sorted(targets, key=lambda x: (-min(total_work, n * x) / (beta + x), x)):
            if min(total_work, n * target) / (beta + target) <= best_ratio * (1 - band):
                break
            p = pack(ctx, remaining, target, select=True)
            # The longest sequence must be in: a micro-batch of only shorter ones would leave it to a
            # later micro-batch of its own, paying the fixed cost for one sequence.
            if p is None or not p.taken or p.taken[0] != first:
                continue
            ratio = sum(min_work[i] for i in p.taken) / (beta + max(p.loads))
            found.append((ratio, p))
            best_ratio = max(best_ratio, ratio)
        if not found:  # the longest sequence fits no group: the caller validated this cannot happen
            raise ValueError(f"sequence of {ctx.lengths[first]} tokens fits no SP group")

        def lookahead(p: Packing, work: float = total_work, tokens: int = total_tokens) -> float:
            left = tokens - sum(ctx.lengths[i] for i in p.taken)
            rest = (-(-left // cluster_tokens)) * beta + (work - sum(min_work[i] for i in p.taken)) / n
            return beta + max(p.loads) + rest

        if objective == "ratio":
            best = max(found, key=lambda rp: rp[0])[1]  # first of equals: targets are tried in a fixed order
        else:
            best = min((p for r, p in found if r >= best_ratio * (1 - band)), key=lookahead)
        plan.append(finish(ctx, best))
        taken = set(best.taken)
        remaining = [i for i in remaining if i not in taken]
    return plan
