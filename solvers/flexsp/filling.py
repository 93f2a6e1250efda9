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

    ``objective`` picks each micro-batch: ``"ratio"`` maximises work done per second of it;
    ``"lookahead"`` minimises its time plus a lower bound of the rest (the fixed cost of the micro-batches
    the remaining tokens need at least, and their least work spread over the cluster), which favours
    filling memory when the batch is tight on it.
    """
    table = ctx.table
    remaining = longest_first(table, list(range(len(table.lengths))) if rows is None else list(rows))
    min_work = _min_work(ctx)
    beta = table.beta_ms
    n = ctx.num_gpus
    cluster_tokens = n * ctx.capacity[0] // ctx.sizes[0]
    plan: list[MicroBatch] = []

    while remaining:
        first = remaining[0]
        total_work = sum(min_work[i] for i in remaining)
        total_tokens = sum(ctx.lengths[i] for i in remaining)

        def value(p: Packing, work: float = total_work, tokens: int = total_tokens) -> float:
            """Higher is better."""
            done = sum(min_work[i] for i in p.taken)
            if objective == "ratio":
                return done / (beta + max(p.loads))
            left = tokens - sum(ctx.lengths[i] for i in p.taken)
            rest = (-(-left // cluster_tokens)) * beta + (work - done) / n
            return -(beta + max(p.loads) + rest)

        def bound(target: float, work: float = total_work, tokens: int = total_tokens) -> float:
            """No packing under ``target`` does better: it does at most min(all work, N·target) of work."""
            done = min(work, n * target)
            if objective == "ratio":
                return done / (beta + target)
            rest = (-(-max(0, tokens - cluster_tokens) // cluster_tokens)) * beta + (work - done) / n
            return -(beta + rest)

        # Paces: the longest sequence on each degree it fits, and the remaining work spread over
        # k micro-batches (short sequences alone would otherwise pay beta once per tiny target).
        spread = total_work / n
        paces = [ctx.time[first][j] for j in range(len(ctx.sizes)) if ctx.fits[first][j]]
        paces += [spread / k for k in (1, 2, 3, 4)]
        targets = sorted({pace * (1 + eps) for pace in paces for eps in slack})
        best: Packing | None = None
        best_value = -np.inf
        # Most promising targets first; stop once a target's bound cannot beat the best packing found.
        for target in sorted(targets, key=lambda x: (-bound(x), x)):
            if bound(target) <= best_value:
                break
            p = pack(ctx, remaining, target, select=True)
            # The longest sequence must be in: a micro-batch of only shorter ones would leave it to a
            # later micro-batch of its own, paying the fixed cost for one sequence.
            if p is not None and p.taken and p.taken[0] == first and value(p) > best_value:
                best, best_value = p, value(p)
        if best is None:  # the longest sequence fits no group: the caller validated this cannot happen
            raise ValueError(f"sequence of {ctx.lengths[first]} tokens fits no SP group")
        plan.append(finish(ctx, best))
        taken = set(best.taken)
        remaining = [i for i in remaining if i not in taken]
    return plan
