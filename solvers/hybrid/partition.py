"""Pipeline partition search (Galvatron-BMW's bi-objective partition, plus an exact mode for small cases).

Input: for every stage a table of its best (time, step time) for each layer count (and start layer when
layers differ). Output: the layer counts per stage that minimise the pipeline step time.

- Few partitions (≤ ``exhaustive_limit``): all are tried, so the result is exact.
- Otherwise BMW's idea: start from the memory-balanced partition (later stages hold fewer in-flight
  micro-batches, so they take more layers), and also from the time-bottleneck-optimal one (a min-max DP);
  move one layer at a time across a stage boundary while the step time improves; keep the best feasible.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

INF = math.inf

# (stage, start layer, layer count) -> (per-micro-batch time, per-step time); inf when infeasible
StageLookup = Callable[[int, int, int], tuple[float, float]]
# (stage times, stage step times) -> step time
PipelineTime = Callable[[Sequence[float], Sequence[float]], float]
# (stage, start, count) -> alternative (time, step time, variant id) of the stage, e.g. optimised with other
# weights between per-micro-batch and per-step time: a stage off the critical path wants less step time
StageVariants = Callable[[int, int, int], list[tuple[float, float, int]]]


@dataclass
class PartitionResult:
    step_time_s: float
    parts: tuple[int, ...]
    evaluated: int
    variant: tuple[int, ...] = ()


def best_variants(parts: tuple[int, ...], variants: StageVariants, pipe: PipelineTime,
                  exhaustive_limit: int = 256) -> tuple[float, tuple[int, ...]]:
    """Best combination of per-stage variants for ``parts``.

    Few combinations (≤ ``exhaustive_limit``): all are tried, exact for any monotone pipeline formula. Else a
    cap U on the step times: each stage takes its fastest variant with step time ≤ U, the best over U ∈ the
    variants' step times. That is exact when the step time depends on the stages' step times only through
    their maximum (the analytic model's formula), in O(stages x variants²); coordinate descent, one stage at
    a time, misses moves where two stages must change together."""
    opts, start = [], 0
    for s, n in enumerate(parts):
        o = [x for x in variants(s, start, n) if math.isfinite(x[0])]
        if not o:
            return INF, ()
        opts.append(sorted({(t, u): (t, u, v) for t, u, v in o}.values()))  # by time, then step time
        start += n

    def value(chosen: Sequence[tuple[float, float, int]]) -> float:
        return float(pipe([x[0] for x in chosen], [x[1] for x in chosen]))

    if math.prod(len(o) for o in opts) <= exhaustive_limit:
        combos: Iterable[Sequence[tuple[float, float, int]]] = itertools.product(*opts)
    else:
        combos = []
        for cap in sorted({u for o in opts for _, u, _ in o}):
            fitting = [next((x for x in o if x[1] <= cap), None) for o in opts]  # the first fitting is fastest
            if all(x is not None for x in fitting):
                combos.append([x for x in fitting if x is not None])
    best = min(combos, key=value, default=None)
    if best is None:
        return INF, ()
    return value(best), tuple(x[2] for x in best)


def compositions(total: int, k: int) -> int:
    return math.comb(total - 1, k - 1) if total >= k >= 1 else 0


def _all_compositions(total: int, k: int) -> list[tuple[int, ...]]:
    if k == 1:
        return [(total,)]
    out: list[tuple[int, ...]] = []
    for first in range(1, total - k + 2):
        out.extend((first, *rest) for rest in _all_compositions(total - first, k - 1))
    return out


class _Scorer:
    def __init__(self, lookup: StageLookup, pipe: PipelineTime,
                 tables: tuple[Sequence[np.ndarray], Sequence[np.ndarray]] | None = None):
        self.lookup, self.pipe, self.count = lookup, pipe, 0
        self.memo: dict[tuple[int, ...], float] = {}
        # start-independent (time, step time) by layer count as plain lists: no call per stage
        self.tables = None if tables is None else ([list(t) for t in tables[0]], [list(u) for u in tables[1]])

    def __call__(self, parts: tuple[int, ...]) -> float:
        hit = self.memo.get(parts)
        if hit is not None:
            return hit
        self.count += 1
        if self.tables is not None:
            tt, ut = self.tables
            ts = [tt[s][n - 1] for s, n in enumerate(parts)]
            val = INF if INF in ts else float(self.pipe(ts, [ut[s][n - 1] for s, n in enumerate(parts)]))
            self.memo[parts] = val
            return val
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


def _min_max_tables(total: int, tables: Sequence[np.ndarray]) -> tuple[int, ...] | None:
    """``min_max_partition`` from per-stage time arrays, vectorised over (layers used, stage size).

    ``tables[s]`` is either 1-D, stage s's time by layer count (``[n - 1]``: identical layers, the start
    does not matter), or 2-D ``[start, n]`` (inf where invalid) when it does."""
    return _best_partition(total, tables)[1]


def min_max_value(total: int, tables: Sequence[np.ndarray]) -> float:
    """Least possible slowest-stage value over all partitions (tables as for ``_min_max_tables``)."""
    return _best_partition(total, tables)[0]


def min_sum_value(total: int, tables: Sequence[np.ndarray]) -> float:
    """Least possible sum of the stages' values over all partitions (tables as for ``min_max_value``)."""
    return _best_partition(total, tables, np.add)[0]


def min_of_max_and_sum(total: int, slow: Sequence[np.ndarray], fill: Sequence[np.ndarray],
                       enough: float = INF) -> float:
    """The least, over all partitions, of max(the largest stage's ``slow`` value, the sum of the stages' ``fill``
    values) (tables as for ``min_max_value``), exactly; or ``enough`` where that least is above ``enough``.

    F(x), the min-sum of ``fill`` over partitions that keep every stage's ``slow`` ≤ x, changes only at the
    tables' ``slow`` values c_0 < c_1 < …, and the answer is the least x with F(x) ≤ x. That test turns true
    once along the c_i: a binary search finds the first c_i that passes, and between it and the value before
    it, c_i-1, F is F(c_i-1), so the answer is min(c_i, F(c_i-1)); about log2 of the distinct values min-sum
    DPs, against ~30 for a bisection on x to 1e-9."""
    asked: dict[float, float] = {}  # F at the caps tried (the search's last miss is the answer's F(c_i-1))

    def capped(cap: float) -> float:
        if cap not in asked:
            asked[cap] = min_sum_value(total, [np.where(a <= cap, b, INF) for a, b in zip(slow, fill, strict=True)])
        return asked[cap]

    caps = np.unique(np.concatenate([a[np.isfinite(a) & (a <= enough)].ravel() for a in slow]))
    if not caps.size:
        return enough  # no partition keeps every stage within ``enough`` (INF: no partition at all)
    lo, hi = 0, caps.size - 1  # the first passing cap lies in [lo, hi] (or none passes)
    top = capped(float(caps[hi]))  # F from the last cap up to ``enough``
    if not top <= enough:
        return enough
    if not top <= caps[hi]:
        return top  # the least x with F(x) <= x is F itself
    while lo < hi:
        mid = (lo + hi) // 2
        if capped(float(caps[mid])) <= caps[mid]:
            hi = mid
        else:
            lo = mid + 1
    return float(caps[lo]) if lo == 0 else min(float(caps[lo]), capped(float(caps[lo - 1])))


def min_max_plus_sum_bound(total: int, slow: Sequence[np.ndarray], fill: Sequence[np.ndarray],
                           splits: int = 8) -> float:
    """A lower bound on the least, over all partitions, of the largest stage's ``slow`` value plus the sum of
    the stages' ``fill`` values (tables as for ``min_max_value``), exact in the limit of ``splits``.

    F(x), the min-sum of ``fill`` over partitions that keep every stage's ``slow`` ≤ x, never rises with x. With
    caps x_0 < … < x_k, x_0 the min-max of ``slow``, a partition whose largest ``slow`` lies in [x_i, x_i+1]
    is worth at least x_i + F(x_i+1), and one above x_k at least x_k + F(∞). x_k = x_0 + F(x_0) - F(∞)
    leaves above it nothing below x_0 + F(x_0), which the min-max partition itself is worth at most. The
    interval that gives the least is halved up to ``splits`` times (a halving never lowers the bound)."""
    def capped(cap: float) -> float:
        return min_sum_value(total, [np.where(a <= cap, b, INF) for a, b in zip(slow, fill, strict=True)])

    lo = min_max_value(total, slow)
    if not math.isfinite(lo):
        return INF
    unconstrained, at_lo = min_sum_value(total, fill), capped(lo)
    if not math.isfinite(at_lo) or at_lo <= unconstrained:
        return lo + min(at_lo, unconstrained)
    caps, least = [lo, lo + at_lo - unconstrained], [at_lo, unconstrained]
    for _ in range(splits):
        terms = [caps[i] + least[i + 1] for i in range(len(caps) - 1)]
        i = int(np.argmin(terms))
        if caps[-1] + unconstrained <= terms[i]:
            break  # the tail above the last cap holds the least: halving cannot raise it
        mid = 0.5 * (caps[i] + caps[i + 1])
        caps.insert(i + 1, mid)
        least.insert(i + 1, capped(mid))
    return min(min(caps[i] + least[i + 1] for i in range(len(caps) - 1)), caps[-1] + unconstrained)


@functools.lru_cache(maxsize=1024)
def _steps(total: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """For a stage of fewer than ``width`` layers, per (layers placed so far j, the stage's count c): whether c
    is a count it can take (1 ≤ c ≤ j), and the layers placed before it (j - c). Cached (every stage of every
    partition search asks), so read-only."""
    j, c = np.arange(total + 1)[:, None], np.arange(width)[None, :]
    valid = (c >= 1) & (c <= j)
    prev = np.where(valid, j - c, 0)
    valid.setflags(write=False)
    prev.setflags(write=False)
    return valid, prev


def _width(finite_count: np.ndarray) -> int:
    """One past the largest layer count a stage can take (memory caps most stages far below the total)."""
    idx = np.flatnonzero(finite_count)
    return int(idx[-1]) + 1 if idx.size else 1


def _best_partition(total: int, tables: Sequence[np.ndarray], combine: Callable[[np.ndarray, np.ndarray],
                    np.ndarray] = np.maximum) -> tuple[float, tuple[int, ...] | None]:
    """The partition whose stages' values, combined (the slowest by default, or their sum), are least. Each
    stage's DP step spans only the counts it can take (a deep stack's stage of at most w layers costs
    (total + 1) x w, not (total + 1)^2)."""
    k = len(tables)
    best = np.full(total + 1, INF)
    best[0] = 0.0
    args = []
    for s in range(k):
        tab = np.asarray(tables[s], dtype=float)
        if tab.ndim == 2:
            full = np.full((total + 1, total + 1), INF)
            rows, cols = min(tab.shape[0], total + 1), min(tab.shape[1], total + 1)
            full[:rows, :cols] = tab[:rows, :cols]
            width = _width(np.any(full < INF, axis=0))
            valid, prev_idx = _steps(total, width)
            t_jc = full[prev_idx, np.arange(width)[None, :]]
        else:
            t = np.full(total + 1, INF)
            m = min(len(tab), total)
            t[1:m + 1] = tab[:m]
            width = _width(t < INF)
            valid, prev_idx = _steps(total, width)
            t_jc = t[None, :width]
        cand = np.where(valid, combine(best[prev_idx], t_jc), INF)
        arg = np.argmin(cand, axis=1)
        best = cand[np.arange(total + 1), arg]
        args.append(arg)
    if not math.isfinite(best[total]):
        return INF, None
    parts, rest = [], total
    for s in range(k - 1, -1, -1):
        c = int(args[s][rest])
        parts.append(c)
        rest -= c
    return float(best[total]), tuple(reversed(parts))


def min_max_partition(total: int, k: int, lookup: StageLookup,
                      tables: Sequence[np.ndarray] | None = None) -> tuple[int, ...] | None:
    """Partition minimising the slowest stage's per-micro-batch time (exact DP over boundaries)."""
    if tables is not None:
        return _min_max_tables(total, tables)
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


# a stage's value: one number, or alternatives of which the stage takes the cheapest
Alternatives = float | Sequence[float] | np.ndarray


def _options(values: Sequence[Alternatives], pad: float) -> np.ndarray:
    """Per-stage values, each a number or a list of alternatives, as a [stage, alternative] array padded
    with ``pad`` (an alternative no stage would pick)."""
    rows = [np.atleast_1d(np.asarray(v, dtype=float)) for v in values]
    out = np.full((len(rows), max(r.size for r in rows)), pad)
    for s, r in enumerate(rows):
        out[s, :r.size] = r
    return out


def min_max_linear(total: int, fixed: Sequence[Alternatives],
                   per_layer: Sequence[Alternatives]) -> float:
    """Least possible ``max_s min_o fixed[s][o] + n_s per_layer[s][o]`` over partitions of ``total`` layers
    (each n_s ≥ 1); a stage's entry is one number or several alternatives ``o`` (e.g. one per cap on a
    layer's transient memory), of which the stage takes the least for its layer count.

    Exact and O(k o n log(k o n)): the optimum is one of the values ``fixed + n per_layer``, and a threshold
    X is reachable iff every stage holds ≥ 1 layer within X and together they hold ≥ ``total``; binary
    search over the sorted candidate values. (The generic min-max DP is O(k n²) in Python: minutes for
    128 layers over hundreds of configurations.)"""
    k = len(fixed)
    if total < k:
        return INF
    f = _options(fixed, INF)
    p = np.maximum(_options(per_layer, 0.0), 0.0)
    values = np.unique(f[:, :, None] + np.arange(1, total + 1)[None, None, :] * p[:, :, None])
    values = values[np.isfinite(values)]
    if values.size == 0:
        return INF

    def reachable(x: float) -> bool:
        with np.errstate(divide="ignore", invalid="ignore"):
            cap = np.where(p > 0, np.floor((x - f) / np.where(p > 0, p, 1.0) + 1e-9), np.where(x >= f, total, 0))
        cap = np.minimum(cap, total).max(axis=1)  # each stage at its roomiest alternative
        return bool(np.all(cap >= 1) and cap.sum() >= total)

    lo, hi = 0, values.size - 1
    if not reachable(float(values[hi])):
        return INF
    while lo < hi:
        mid = (lo + hi) // 2
        if reachable(float(values[mid])):
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def min_max_prefix(fixed: Sequence[Alternatives], cum: Sequence[np.ndarray]) -> float:
    """Least ``max_s min_o fixed[s][o] + cum[s][o][end_s] - cum[s][o][start_s]`` over partitions into
    contiguous stages (``cum[s]``: stage s's prefix sums over the layers, length total + 1, or one row of them
    per alternative ``o`` as in ``min_max_linear``). Vectorised DP, O(k o n²) in numpy."""
    k, total = len(fixed), np.shape(cum[0])[-1] - 1
    if total < k:
        return INF
    j, n = np.meshgrid(np.arange(total + 1), np.arange(total + 1), indexing="ij")
    start = j - n
    valid = (n >= 1) & (start >= 0)
    start = np.where(valid, start, 0)
    best = np.full(total + 1, INF)
    best[0] = 0.0
    for s in range(k):
        c = np.atleast_2d(np.asarray(cum[s], dtype=float))
        f = np.atleast_1d(np.asarray(fixed[s], dtype=float))
        cost = np.min(f[:, None, None] + c[:, j] - c[:, start], axis=0)
        best = np.min(np.where(valid, np.maximum(best[start], cost), INF), axis=1)
    return float(best[total])


def _hill_climb(start: tuple[int, ...], score: _Scorer, max_rounds: int = 200) -> tuple[float, tuple[int, ...]]:
    cur, cur_v = start, score(start)
    steps = (1, -1, 2, -2) if len(start) <= 16 else (1, -1)
    for _ in range(max_rounds):
        best_v, best_p = cur_v, cur
        for b in range(len(cur) - 1):
            for step in steps:
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
           memory_weights: Sequence[float] | None = None, exhaustive_limit: int = 1000,
           fixed: tuple[int, ...] | None = None, tables: Sequence[np.ndarray] | None = None,
           variants: StageVariants | None = None, step_tables: Sequence[np.ndarray] | None = None,
           climb: bool = True, matrices: Sequence[np.ndarray] | None = None) -> PartitionResult:
    """Best partition of ``total`` layers into ``k`` stages (see module doc). ``tables`` (stage time by
    layer count, when it does not depend on the start layer) makes the min-max DP vectorised; so do
    ``matrices`` (stage time by [start, layer count]) when it does."""
    score = _Scorer(lookup, pipe, (tables, step_tables) if tables is not None and step_tables is not None else None)
    if fixed is not None:
        return _refined(PartitionResult(score(fixed), fixed, score.count), variants, pipe)
    if compositions(total, k) <= exhaustive_limit:
        if variants is not None:  # small: every partition with its best variant combination (exact)
            found = [(best_variants(p, variants, pipe), p) for p in _all_compositions(total, k)]
            (v, pick), p = min(found, key=lambda x: x[0][0])
            return PartitionResult(v, p, len(found), pick)
        best = min(_all_compositions(total, k), key=score)
        return PartitionResult(score(best), best, score.count)
    starts = [balanced(total, [1.0] * k)]
    if memory_weights is not None:
        starts.insert(0, balanced(total, memory_weights))
    mm = min_max_partition(total, k, lookup, tables if tables is not None else matrices)
    if mm is not None:
        starts.append(mm)
    best_v, best_p = INF, starts[0]
    for s in dict.fromkeys(starts):
        v, p = _hill_climb(s, score) if climb else (score(s), s)
        if v < best_v:
            best_v, best_p = v, p
    return _refined(PartitionResult(best_v, best_p, score.count), variants, pipe)


def _refined(res: PartitionResult, variants: StageVariants | None, pipe: PipelineTime) -> PartitionResult:
    if variants is None or not math.isfinite(res.step_time_s):
        return res
    v, pick = best_variants(res.parts, variants, pipe)
    if v < res.step_time_s:
        return PartitionResult(v, res.parts, res.evaluated, pick)
    return PartitionResult(res.step_time_s, res.parts, res.evaluated, tuple(0 for _ in res.parts))
