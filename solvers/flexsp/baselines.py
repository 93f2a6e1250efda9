"""What FlexSP is measured against, computed in the same run: static SP degrees and a lower bound.

Static SP ``d``: every micro-batch is N/d groups of d GPUs. Sequences are packed into groups by
best-fit-decreasing on tokens, the groups fill micro-batches in order, and a micro-batch takes its slowest
group — the reference's baseline, including its 10 % memory headroom per group (``fill``), so the figures
compare 1:1 with the paper's. The last micro-batch's sequences are spread over all its groups.

Lower bound: every sequence costs at least its least GPU-time (work) over the degrees it fits, the
cluster does at most N GPU-ms per ms, and each micro-batch pays the fixed cost once; there are at least
ceil(tokens / cluster token capacity) micro-batches.
"""

from __future__ import annotations

import bisect
import heapq
import math

import numpy as np

from solvers.flexsp.cost import CostTable
from solvers.flexsp.plan import Group, MicroBatch

REFERENCE_FILL = 0.9


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins (lists of indices) of total length ≤ capacity; each item goes to the fullest bin it fits."""
    order = np.lexsort((np.arange(len(lengths)), -lengths))
    bins: list[list[int]] = []
    # (remaining room, bin id) kept sorted: the best fit is the first room ≥ the item.
    rooms: list[tuple[int, int]] = []
    for i in order:
        s = int(lengths[i])
        k = bisect.bisect_left(rooms, (s, -1))
        if k == len(rooms):
            bins.append([int(i)])
            bisect.insort(rooms, (capacity - s, len(bins) - 1))
        else:
            room, b = rooms.pop(k)
            bins[b].append(int(i))
            bisect.insort(rooms, (room - s, b))
    return bins


def _spread(table: CostTable, rows: list[int], d: int, k: int) -> list[list[int]] | None:
    """Longest-processing-time over k groups of size d: each sequence to the least-loaded group with room
    (None if at some point no group has room: the caller keeps its packing)."""
    j = table.size_index(d)
    cap = int(table.capacity[j])
    tokens = [0] * k
    out: list[list[int]] = [[] for _ in range(k)]
    heap = [(0.0, q) for q in range(k)]  # (load, group)
    for i in sorted(rows, key=lambda r: (-table.lengths[r], r)):
        s = int(table.lengths[i])
        skipped = []
        while heap and tokens[heap[0][1]] + s > cap:
            skipped.append(heapq.heappop(heap))
        if not heap:
            return None
        load, q = heapq.heappop(heap)
        out[q].append(i)
        tokens[q] += s
        heapq.heappush(heap, (load + float(table.time_ms[i, j]), q))
        for item in skipped:
            heapq.heappush(heap, item)
    return out


def static_sp_plan(table: CostTable, d: int, num_gpus: int, fill: float = REFERENCE_FILL) -> list[MicroBatch] | None:
    """The static-SP-``d`` plan, or None when some sequence or bin does not fit a group of ``d``."""
    j = table.size_index(d)
    if j >= len(table.sizes) or table.sizes[j] != d or num_gpus % d:
        return None
    cap = int(table.capacity[j])
    if int(table.lengths.max()) > cap:
        return None
    bins = best_fit_decreasing(table.lengths, max(int(fill * cap), int(table.lengths.max())))
    k = num_gpus // d
    plan = []
    for m in range(0, len(bins), k):
        chunk = bins[m : m + k]
        if len(chunk) < k:
            chunk = _spread(table, [i for b in chunk for i in b], d, k) or chunk + [[]] * (k - len(chunk))
        plan.append(MicroBatch([Group(d, sorted(b)) for b in chunk]))
    return plan


def min_micro_batches(table: CostTable, num_gpus: int) -> int:
    per_gpu = int(table.capacity[0] // table.sizes[0])
    return max(1, math.ceil(int(table.lengths.sum()) / (num_gpus * per_gpu)))


def lower_bound_ms(table: CostTable, num_gpus: int) -> float:
    work = np.where(table.fits, table.work_ms, np.inf).min(axis=1).sum()
    return float(work / num_gpus + min_micro_batches(table, num_gpus) * table.beta_ms)
