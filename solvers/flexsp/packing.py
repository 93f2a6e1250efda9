"""Greedy packings of sequences into SP groups under a target load: the fast path and the MILPs' warm start.

``pack`` places sequences, longest first, into open groups whose load stays under the target (least
extra work first, then tightest fit), opening the smallest group that can take a sequence when none can.
In ``select`` mode a sequence that fits nowhere is left out (the micro-batch filler uses this); otherwise
the packing fails. ``finish`` spends leftover GPUs doubling the slowest groups and covers the rest with
idle SP-1 groups, so the groups always tile the cluster.
"""

from __future__ import annotations

import bisect
import heapq
import math
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


MAX_WALK = 64  # groups examined per size when the busiest ones are full in tokens


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
        # Per sequence, the sizes in order of the GPU-time the sequence costs there (ties: smaller first).
        order = np.lexsort((np.broadcast_to(np.arange(len(self.sizes)), table.work_ms.shape), table.work_ms))
        self.work_order: list[list[int]] = order.tolist()


def pack(ctx: PackingContext, rows: list[int], target_ms: float, select: bool = False) -> Packing | None:
    """Pack ``rows`` (already sorted, longest first) under ``target_ms``; see the module docstring.

    Open groups are kept per size, sorted by load, so placing a sequence costs a bisection per size
    (not a scan of every group: a 1,024-GPU cluster has up to 1,024 groups of one GPU).
    """
    sizes, cap, time, lengths, fits = ctx.sizes, ctx.capacity, ctx.time, ctx.lengths, ctx.fits
    p = Packing([], [], [], [], [])
    by_size: list[list[tuple[float, int]]] = [[] for _ in sizes]  # (load, group) ascending, per size
    used = 0
    n = ctx.num_gpus
    shortest = lengths[rows[-1]] if rows else 0
    # Per size, a max-heap of token room left in its groups, with lazy deletion of stale entries: a
    # sequence longer than every group's room skips the size without walking its groups.
    rooms: list[list[tuple[int, int]]] = [[] for _ in sizes]  # (-room, group)
    for i in rows:
        s = lengths[i]
        ti = time[i]
        placed = False
        # Least extra work first (usually the smallest groups), then the busiest group it still fits.
        for j in ctx.work_order[i]:
            groups = by_size[j]
            if not groups or groups[0][0] + ti[j] > target_ms:
                continue
            heap = rooms[j]
            while cap[j] - p.tokens[heap[0][1]] != -heap[0][0]:
                heapq.heappop(heap)
            if s > -heap[0][0]:
                continue
            k = bisect.bisect_right(groups, (target_ms - ti[j], math.inf)) - 1
            # Groups too full in tokens are passed over; the walk is bounded so a memory-bound
            # micro-batch of many small groups stays linear (it then tries the next size).
            stop = max(-1, k - MAX_WALK)
            while k > stop:
                load, q = groups[k]
                if load + ti[j] <= target_ms and p.tokens[q] + s <= cap[j]:
                    break
                k -= 1
            if k == stop:
                continue
            del groups[k]
            p.loads[q] = load + ti[j]
            p.members[q].append(i)
            p.tokens[q] += s
            p.taken.append(i)
            heapq.heappush(heap, (p.tokens[q] - cap[j], q))
            # A group that cannot take even the shortest sequence leaves the search for good.
            if p.tokens[q] + shortest <= cap[j]:
                bisect.insort(groups, (p.loads[q], q))
            placed = True
            break
        if placed:
            continue
        fi = fits[i]
        for j in range(len(sizes)):
            if fi[j] and used + sizes[j] <= n and ti[j] <= target_ms:
                if s + shortest <= cap[j]:
                    bisect.insort(by_size[j], (ti[j], len(p.sizes)))
                    heapq.heappush(rooms[j], (s - cap[j], len(p.sizes)))
                p.sizes.append(sizes[j])
                p.members.append([i])
                p.loads.append(ti[j])
                p.tokens.append(s)
                p.taken.append(i)
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
