"""Pipeline partition search (Galvatron-BMW's bi-objective partition, plus an exact mode for small cases).

Input: for every stage a table of its best (time, step time) for each layer count (and start layer when
layers differ). Output: the layer counts per stage that minimise the pipeline step time.

- Few partitions (≤ ``exhaustive_limit``): all are tried, so the result is exact.
- Otherwise BMW's idea: start from the memory-balanced partition (later stages hold fewer in-flight
  micro-batches, so they take more layers), and also from the time-bottleneck-optimal one (a min-max DP);
  move one layer at a time across a stage boundary while the step time improves; keep the best feasible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

INF = math.inf

# (stage, start layer, layer count) -> (per-micro-batch time, per-step time); inf when infeasible
StageLookup = Callable[[int, int, int], tuple[float, float]]
# (stage times, stage step times) -> step time
PipelineTime = Callable[[Sequence[float], Sequence[float]], float]


@dataclass
class PartitionResult:
    step_time_s: float
    parts: tuple[int, ...]
    evaluated: int


def compositions(total: int, k: int) -> int:
    return math.comb(total - 1, k - 1) if total >= k >= 1 else 0


def _all_compositions(total: int, k: int) -> list[tuple[int, ...]]:
    if k == 1:
        return [(total,)]
    out = []
    for first in range(1, total - k + 2):
        out.extend((first, *rest) for rest in _all_compositions(total - first, k - 1))
    return out


class _Scorer:
    def __init__(self, lookup: StageLookup, pipe: PipelineTime):
        self.lookup, self.pipe, self.count = lookup, pipe, 0
        self.memo: dict[tuple[int, ...], float] = {}

    def __call__(self, parts: tuple[int, ...]) -> float:
        hit = self.memo.get(parts)
        if hit is not None:
            return hit
        self.count += 1
        ts, us, start = [], [], 0
        val = INF
        for s, n in enumerate(parts):
            t, u = self.lookup(s, start, n)
            if not math.isfinite(t):
                break
            ts.append(t)
            us.append(u)
            start += n
        else:
            val = float(self.pipe(ts, us))
        self.memo[parts] = val
        return val


def balanced(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Split ``total`` layers in proportion to ``weights`` (each ≥ 1), by largest remainder."""
    k = len(weights)
    w = np.maximum(np.asarray(weights, dtype=float), 1e-12)
    raw = w / w.sum() * (total - k)
    base = np.floor(raw).astype(int)
    rest = total - k - int(base.sum())
    order = np.argsort(-(raw - base), kind="stable")
    base[order[:rest]] += 1
    return tuple(int(x) + 1 for x in base)


def min_max_partition(total: int, k: int, lookup: StageLookup) -> tuple[int, ...] | None:
    """Partition minimising the slowest stage's per-micro-batch time (exact DP over boundaries)."""
    best = np.full((k + 1, total + 1), INF)
    arg = np.zeros((k + 1, total + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(k):
        lo, hi = s + 1, total - (k - s - 1)  # layers used after stage s
        for j in range(lo, hi + 1):
            for n in range(1, j - s + 1):
                prev = best[s, j - n]
                if not math.isfinite(prev):
                    continue
                t, _ = lookup(s, j - n, n)
                v = max(prev, t)
                if v < best[s + 1, j]:
                    best[s + 1, j], arg[s + 1, j] = v, n
    if not math.isfinite(best[k, total]):
        return None
    parts, j = [], total
    for s in range(k, 0, -1):
        n = int(arg[s, j])
        parts.append(n)
        j -= n
    return tuple(reversed(parts))


def _hill_climb(start: tuple[int, ...], score: _Scorer, max_rounds: int = 200) -> tuple[float, tuple[int, ...]]:
    cur, cur_v = start, score(start)
    for _ in range(max_rounds):
        best_v, best_p = cur_v, cur
        for b in range(len(cur) - 1):
            for step in (1, -1, 2, -2):
                p = list(cur)
                p[b] -= step
                p[b + 1] += step
                if p[b] < 1 or p[b + 1] < 1:
                    continue
                v = score(tuple(p))
                if v < best_v - 1e-15:
                    best_v, best_p = v, tuple(p)
        if best_p == cur:
            break
        cur, cur_v = best_p, best_v
    return cur_v, cur


def search(total: int, k: int, lookup: StageLookup, pipe: PipelineTime,
           memory_weights: Sequence[float] | None = None, exhaustive_limit: int = 4000,
           fixed: tuple[int, ...] | None = None) -> PartitionResult:
    """Best partition of ``total`` layers into ``k`` stages (see module doc)."""
    score = _Scorer(lookup, pipe)
    if fixed is not None:
        return PartitionResult(score(fixed), fixed, score.count)
    if compositions(total, k) <= exhaustive_limit:
        best = min(_all_compositions(total, k), key=score)
        return PartitionResult(score(best), best, score.count)
    starts = [balanced(total, [1.0] * k)]
    if memory_weights is not None:
        starts.insert(0, balanced(total, memory_weights))
    mm = min_max_partition(total, k, lookup)
    if mm is not None:
        starts.append(mm)
    best_v, best_p = INF, starts[0]
    for s in dict.fromkeys(starts):
        v, p = _hill_climb(s, score)
        if v < best_v:
            best_v, best_p = v, p
    return PartitionResult(best_v, best_p, score.count)
