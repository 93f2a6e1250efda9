"""Lower bounds for the outer search: the LP relaxation of a stage of identical layers.

Choosing one candidate per layer for ``n`` layers within a memory budget ``M`` costs at least ``n`` times
the lower convex envelope of the candidates' (memory, cost) points at ``M / n``: the average of any
feasible choice is a feasible point of the relaxation. Transitions (≥ 0) and the transient-memory maximum
(≥ its smallest value) only add to the true cost, so the bound stays valid.
"""

from __future__ import annotations

import numpy as np


def convex_envelope(mem: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertices (ascending memory, descending value) of the lower convex envelope of the Pareto points."""
    ok = np.isfinite(mem) & np.isfinite(val)
    mem, val = mem[ok], val[ok]
    if mem.size == 0:
        return mem, val
    order = np.lexsort((val, mem))
    mem, val = mem[order], val[order]
    # Pareto points first (vectorised): strictly cheaper than everything with less memory
    before = np.minimum.accumulate(np.concatenate([[np.inf], val[:-1]]))
    front = val < before
    xs: list[float] = []
    ys: list[float] = []
    for x, y in zip(mem[front], val[front], strict=True):
        while len(xs) >= 2 and (ys[-1] - ys[-2]) * (x - xs[-2]) >= (y - ys[-2]) * (xs[-1] - xs[-2]):
            xs.pop()
            ys.pop()  # the middle vertex lies on or above the chord
        xs.append(float(x))
        ys.append(float(y))
    return np.asarray(xs), np.asarray(ys)


def relaxed_cost(mem: np.ndarray, val: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Least average cost per layer when the average memory per layer is at most ``budget`` (inf: none)."""
    xs, ys = convex_envelope(mem, val)
    budget = np.asarray(budget, dtype=float)
    if xs.size == 0:
        return np.full(budget.shape, np.inf)
    out = np.interp(budget, xs, ys)  # beyond the last vertex: its value (the cheapest point)
    return np.where(budget < xs[0], np.inf, out)
