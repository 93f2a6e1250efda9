"""Dissolving small micro-batches: every micro-batch pays the fixed cost, so a light one is often worth
spreading over the others' spare memory and time.

For the lightest micro-batch, each of its sequences (longest first) goes to the group of another
micro-batch where it raises that micro-batch's time least (idle groups count: they are GPUs with memory);
if the raises sum to less than the micro-batch's own time (fixed cost included), the move is kept and
the next lightest is tried, else the search stops.
"""

from __future__ import annotations

import copy

from solvers.flexsp.packing import PackingContext, group_loads, longest_first
from solvers.flexsp.plan import MicroBatch


def _try_dissolve(ctx: PackingContext, plan: list[MicroBatch], victim: int) -> list[MicroBatch] | None:
    others = [copy.deepcopy(mb) for k, mb in enumerate(plan) if k != victim]
    loads = [group_loads(ctx, mb) for mb in others]
    tokens = [[sum(ctx.lengths[i] for i in g.sequences) for g in mb.groups] for mb in others]
    peak = [max(ls) for ls in loads]
    victim_mb = plan[victim]
    saved = ctx.table.beta_ms + max(group_loads(ctx, victim_mb))
    added = 0.0
    for i in longest_first(ctx.table, [r for g in victim_mb.groups for r in g.sequences]):
        best: tuple[float, int, int] | None = None
        for m, mb in enumerate(others):
            for q, g in enumerate(mb.groups):
                j = ctx.index[g.size]
                if tokens[m][q] + ctx.lengths[i] > ctx.capacity[j]:
                    continue
                raise_ms = max(0.0, loads[m][q] + ctx.time[i][j] - peak[m])
                if best is None or raise_ms < best[0]:
                    best = (raise_ms, m, q)
        if best is None:
            return None
        raise_ms, m, q = best
        added += raise_ms
        if added >= saved:
            return None
        g = others[m].groups[q]
        g.sequences = sorted([*g.sequences, i])
        loads[m][q] += ctx.time[i][ctx.index[g.size]]
        tokens[m][q] += ctx.lengths[i]
        peak[m] = max(peak[m], loads[m][q])
    return others


def dissolve_light_micro_batches(ctx: PackingContext, plan: list[MicroBatch]) -> list[MicroBatch]:
    while len(plan) > 1:
        victim = min(range(len(plan)), key=lambda k: (max(group_loads(ctx, plan[k])), k))
        merged = _try_dissolve(ctx, plan, victim)
        if merged is None:
            return plan
        plan = merged
    return plan
