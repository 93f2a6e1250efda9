"""Greedy packings of sequences into SP groups under a target load: the fast path and the MILPs' warm start.

``pack`` places sequences, longest first, into open groups whose load stays under the target (least
extra work first, then tightest fit), opening the smallest group that can take a sequence when none can.
In ``select`` mode a sequence that fits nowhere is left out (the micro-batch filler uses this); otherwise
the packing fails. ``finish`` spends leftover GPUs doubling the slowest groups and covers the rest with
idle SP-1 groups, so the groups always tile the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.flexsp.cost import CostTable
from solvers.flexsp.plan import Group, MicroBatch


@dataclass
class Packing:
    sizes: list[int]
    members: list[list[int]]
    loads: list[float]
    tokens: list[int]
    taken: list[int]

    @property
    def used_gpus(self) -> int:
        return sum(self.sizes)


class PackingContext:
    """Python-list views of a cost table: the packer's inner loop is scalar and short."""

    def __init__(self, table: CostTable, num_gpus: int) -> None:
        self.table = table
        self.num_gpus = num_gpus
        self.sizes = [int(d) for d in table.sizes]
        self.capacity = [int(c) for c in table.capacity]
        self.time = table.time_ms.tolist()
        self.lengths = [int(s) for s in table.lengths]
        self.fits = table.fits.tolist()
        self.index = {d: j for j, d in enumerate(self.sizes)}


def pack(ctx: PackingContext, rows: list[int], target_ms: float, select: bool = False) -> Packing | None:
    """Pack ``rows`` (already sorted, longest first) under ``target_ms``; see the module docstring."""
    sizes, cap, time, lengths, fits = ctx.sizes, ctx.capacity, ctx.time, ctx.lengths, ctx.fits
    p = Packing([], [], [], [], [])
    gj: list[int] = []
    used = 0
    n = ctx.num_gpus
    for i in rows:
        s = lengths[i]
        ti = time[i]
        best = -1
        best_work = best_load = 0.0
        for q in range(len(gj)):
            j = gj[q]
            load = p.loads[q] + ti[j]
            if load <= target_ms and p.tokens[q] + s <= cap[j]:
                work = ti[j] * sizes[j]
                if best < 0 or work < best_work or (work == best_work and load > best_load):
                    best, best_work, best_load = q, work, load
        if best >= 0:
            p.members[best].append(i)
            p.loads[best] = best_load
            p.tokens[best] += s
            p.taken.append(i)
            continue
        fi = fits[i]
        for j in range(len(sizes)):
            if fi[j] and used + sizes[j] <= n and ti[j] <= target_ms:
                p.sizes.append(sizes[j])
                p.members.append([i])
                p.loads.append(ti[j])
                p.tokens.append(s)
                p.taken.append(i)
                gj.append(j)
                used += sizes[j]
                break
        else:
            if not select:
                return None
    return p


def finish(ctx: PackingContext, p: Packing) -> MicroBatch:
    """Double the slowest groups while GPUs are free and it helps; idle SP-1 groups cover the rest."""
    sizes = list(p.sizes)
    loads = list(p.loads)
    free = ctx.num_gpus - sum(sizes)
    while free > 0 and sizes:
        k = max(range(len(sizes)), key=lambda q: (loads[q], -q))
        d = sizes[k]
        if 2 * d not in ctx.index or d > free:
            break
        j2 = ctx.index[2 * d]
        new_load = sum(ctx.time[i][j2] for i in p.members[k])
        if new_load >= loads[k]:
            break
        sizes[k], loads[k] = 2 * d, new_load
        free -= d
    groups = [Group(d, sorted(m)) for d, m in zip(sizes, p.members, strict=True)]
    for d in sorted(ctx.sizes, reverse=True):
        while free >= d:
            groups.append(Group(d, []))
            free -= d
    return MicroBatch(groups)


def lower_bound_ms(table: CostTable, rows: np.ndarray, num_gpus: int) -> float:
    """Load lower bound of one micro-batch: its slowest sequence alone, and its least work spread evenly."""
    t = np.where(table.fits[rows], table.time_ms[rows], np.inf)
    w = np.where(table.fits[rows], table.work_ms[rows], np.inf)
    return float(max(t.min(axis=1).max(), w.min(axis=1).sum() / num_gpus))


def max_load_ms(table: CostTable, mb: MicroBatch) -> float:
    return max(float(table.time_ms[g.sequences, table.size_index(g.size)].sum()) for g in mb.groups)


def group_loads(ctx: PackingContext, mb: MicroBatch) -> list[float]:
    """Each group's load (ms), with the context's Python lists: the hot loops' version of max_load_ms."""
    return [sum(ctx.time[i][ctx.index[g.size]] for i in g.sequences) for g in mb.groups]


def peak_ms(ctx: PackingContext, mb: MicroBatch) -> float:
    return max(group_loads(ctx, mb))


def longest_first(table: CostTable, rows: np.ndarray | list[int]) -> list[int]:
    r = np.asarray(rows, dtype=np.int64)
    return [int(i) for i in r[np.lexsort((r, -table.lengths[r]))]]


def best_greedy(ctx: PackingContext, rows: np.ndarray | list[int], rel_tol: float = 4e-3) -> MicroBatch | None:
    """Bisect the target load of ``pack`` for one micro-batch; the best packing found (None if none fits)."""
    table = ctx.table
    order = longest_first(table, rows)
    lo = lower_bound_ms(table, np.asarray(order), ctx.num_gpus)
    if not np.isfinite(lo):
        return None
    p = pack(ctx, order, np.inf)
    if p is None:
        return None
    best = finish(ctx, p)
    hi = peak_ms(ctx, best)
    while hi - lo > rel_tol * hi:
        mid = (lo + hi) / 2
        p = pack(ctx, order, mid)
        if p is None:
            lo = mid
            continue
        mb = finish(ctx, p)
        load = peak_ms(ctx, mb)
        if load < peak_ms(ctx, best):
            best = mb
        hi = min(mid, load)
    return best
