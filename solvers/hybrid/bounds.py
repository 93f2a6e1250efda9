"""Lower bounds for the outer search: relaxations of a stage's memory-constrained choice.

Choosing one candidate per layer for ``n`` layers within a memory budget ``M`` costs at least ``n`` times
the lower convex envelope of the candidates' (memory, cost) points at ``M / n``: the average of any
feasible choice is a feasible point of the relaxation. Transitions (≥ 0) and the transient-memory maximum
is taken by levels (``transient_levels``): each level admits the candidates within its cap and reserves
its least value, so the bound stays valid. Layers of mixed kinds (dense
and MoE) get the Lagrangian relaxation instead (``mixed_relaxed_cost``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solvers.hybrid.prune import front


def _pareto_points(mem: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The finite Pareto points of (memory, value), by increasing memory (so decreasing value)."""
    ok = np.isfinite(mem) & np.isfinite(val)
    mem, val = mem[ok], val[ok]
    keep = front(mem, val)
    return mem[keep], val[keep]


def convex_envelope(mem: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices (ascending memory, descending value) of the lower convex envelope of the Pareto points."""
    xs: list[float] = []
    ys: list[float] = []
    for x, y in zip(*_pareto_points(mem, val), strict=True):
        while len(xs) >= 2 and (ys[-1] - ys[-2]) * (x - xs[-2]) >= (y - ys[-2]) * (xs[-1] - xs[-2]):
            xs.pop()
            ys.pop()  # the middle vertex lies on or above the chord
        xs.append(float(x))
        ys.append(float(y))
    return np.asarray(xs), np.asarray(ys)


def transient_levels(extra: Sequence[np.ndarray], groups: int) -> list[tuple[float, float]]:
    """(cap, reserved) pairs covering every value a stage's largest transient buffer can take: the distinct
    values, sorted, in at most ``groups`` runs; a run admits candidates up to its largest value and reserves its
    least. One group is the plain relaxation (every candidate, the least buffer reserved); one per value is exact."""
    if groups <= 1:  # (the common, cheap case: no sorting)
        least = min((float(np.min(e, initial=np.inf, where=np.isfinite(e))) for e in extra), default=np.inf)
        return [(np.inf, least)] if np.isfinite(least) else [(0.0, 0.0)]
    vals = np.unique(np.concatenate([e[np.isfinite(e)] for e in extra]))
    if vals.size == 0:
        return [(0.0, 0.0)]
    runs = np.array_split(vals, min(max(groups, 1), vals.size))
    return [(float(r[-1]), float(r[0])) for r in runs]


Envelopes = dict[tuple[bytes, bytes], tuple[np.ndarray, np.ndarray]]


def cached_envelope(mem: np.ndarray, val: np.ndarray, cache: Envelopes | None) -> tuple[np.ndarray, np.ndarray]:
    """``convex_envelope`` remembered by content: a search asks for the same candidates' envelope from several
    bounds and stages (about two calls in three repeat one)."""
    if cache is None:
        return convex_envelope(mem, val)
    key = (np.asarray(mem, dtype=float).tobytes(), np.asarray(val, dtype=float).tobytes())
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = convex_envelope(mem, val)
    return hit


def relaxed_cost(mem: np.ndarray, val: np.ndarray, budget: np.ndarray, cache: Envelopes | None = None) -> np.ndarray:
    """Least average cost per layer when the average memory per layer is at most ``budget`` (inf: none)."""
    xs, ys = cached_envelope(mem, val, cache)
    budget = np.asarray(budget, dtype=float)
    if xs.size == 0:
        return np.full(budget.shape, np.inf)
    out = np.interp(budget, xs, ys)  # beyond the last vertex: its value (the cheapest point)
    return np.where(budget < xs[0], np.inf, out)


Fronts = dict[tuple[bytes, bytes, int], list[tuple[np.ndarray, np.ndarray]]]


def integral_cost(mem: np.ndarray, val: np.ndarray, budget: np.ndarray, k_max: int,
                  cache: Fronts | None = None) -> np.ndarray:
    """For 1..k_max layers, the least total value of whole candidates (one each) within ``budget[k]``: no
    fractions, unlike ``relaxed_cost``, so tighter where a stage holds few layers (the LP's average of two
    candidates is no plan of 3 layers); transitions left out, so still a lower bound. Index k is k layers
    (index 0: 0). By Pareto fronts of k-candidate sums."""
    mem, val = np.asarray(mem, dtype=float), np.asarray(val, dtype=float)
    key = (mem.tobytes(), val.tobytes(), k_max)
    fronts = cache.get(key) if cache is not None else None
    if fronts is None:
        one = _pareto_points(mem, val)
        fronts = [one]
        while len(fronts) < k_max and one[0].size:
            m, v = fronts[-1]
            fronts.append(_pareto_points((m[:, None] + one[0][None, :]).ravel(),
                                         (v[:, None] + one[1][None, :]).ravel()))
        if cache is not None:
            cache[key] = fronts
    out = np.full(k_max + 1, np.inf)
    out[0] = 0.0
    for k, (m, v) in enumerate(fronts, start=1):
        i = int(np.searchsorted(m, budget[k], side="right"))  # the leanest points first: the last that fits
        if i > 0:
            out[k] = v[i - 1]
    return out


def integral_cost_with_switch(mem: np.ndarray, val: np.ndarray, cls: np.ndarray, switch: float, budget: np.ndarray,
                              k_max: int, cache: Fronts | None = None) -> np.ndarray:
    """``integral_cost`` for a sequence of layers in which a change of class between neighbours costs at least
    ``switch`` (``cls``: each candidate's class): k layers of one class, or any k whole candidates plus one
    switch (a sequence holding two classes changes class at least once). Still a lower bound, never below
    ``integral_cost``."""
    least = integral_cost(mem, val, budget, k_max, cache)
    if not switch > 0:
        return least
    pure = np.full(k_max + 1, np.inf)
    for c in np.unique(cls):
        pure = np.minimum(pure, integral_cost(mem[cls == c], val[cls == c], budget, k_max, cache))
    mixed = least + switch
    mixed[:2] = np.inf  # no layers, or one: a single class
    return np.minimum(pure, mixed)


def mixed_relaxed_cost(kind_of_layer: Sequence[int], period: int, mem: Sequence[np.ndarray],
                       val: Sequence[np.ndarray], budget: float, cache: Envelopes | None = None) -> np.ndarray:
    """Lower bound on the cost of ``count`` consecutive layers of mixed kinds within ``budget`` bytes, by
    the phase of the first layer: ``[start % period, count]`` (inf: even the leanest choice does not fit).

    Lagrangian relaxation of the memory constraint: for any λ ≥ 0 each layer independently takes its
    least ``cost + λ memory``, and Σ over the layers minus λ·budget bounds the constrained optimum from
    below. The best λ is a slope of one kind's convex envelope (or 0), so those are tried. Layers of one
    phase see the same kind sequence, so one row per phase covers every start."""
    n = len(kind_of_layer)
    out = np.full((period, n + 1), np.inf)
    if not budget > -np.inf:  # no memory left at all (a stage the model cannot price): only zero layers fit
        out[:, 0] = 0.0
        return out
    kinds = sorted(set(kind_of_layer))
    env = {k: cached_envelope(np.asarray(mem[k], dtype=float), np.asarray(val[k], dtype=float), cache) for k in kinds}
    slopes = [np.zeros(1)]
    for xs, ys in env.values():
        if xs.size > 1:
            slopes.append(-np.diff(ys) / np.diff(xs))
    lam = np.unique(np.concatenate(slopes))
    # f[k][j] = least cost + λ_j memory for a layer of kind k; lean[k] its least memory. A kind without any
    # candidate (e.g. none within a cap on transient memory) makes only the ranges that hold it infeasible.
    f = {k: np.min(ys[None, :] + lam[:, None] * xs[None, :], axis=1) if xs.size else np.full(lam.size, np.inf)
         for k, (xs, ys) in env.items()}
    lean = {k: float(xs[0]) if xs.size else np.inf for k, (xs, _) in env.items()}
    for phase in range(min(period, n)):
        seq = [kind_of_layer[i] for i in range(phase, n)]
        cum = np.zeros((lam.size, len(seq) + 1))
        cum[:, 1:] = np.cumsum(np.stack([f[k] for k in seq], axis=1), axis=1)
        lean_cum = np.concatenate([[0.0], np.cumsum([lean[k] for k in seq])])
        best = np.max(cum - lam[:, None] * budget, axis=0)
        m = len(seq) + 1
        out[phase, :m] = np.where(lean_cum <= budget, best, np.inf)
        out[phase, 0] = 0.0
    return out
