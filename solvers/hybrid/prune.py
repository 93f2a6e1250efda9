"""Dominance pruning of per-layer candidates before the DP.

Within one transition class (candidates that re-layout identically to their neighbours) a candidate that is
no faster and no smaller than another can never be needed: swapping it for the other keeps every plan
feasible and no slower. Across classes nothing is pruned, because a worse candidate may save a re-layout.
"""

from __future__ import annotations

import numpy as np


def front(mem: np.ndarray, val: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats in both memory and value, by increasing memory (so
    decreasing value); of equal points the first is kept."""
    order = np.lexsort((val, mem))  # stable: equal points stay in index order
    v = val[order]
    return np.asarray(order[v < np.minimum.accumulate(np.concatenate([[np.inf], v[:-1]]))])


def pareto_mask(obj: np.ndarray, units: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """True for candidates on their class' (objective, memory) Pareto front (ties keep the first)."""
    n = obj.shape[0]
    keep = np.zeros(n, dtype=bool)
    finite = np.isfinite(obj)
    for k in np.unique(classes):
        members = np.flatnonzero((classes == k) & finite)
        if members.size == 0:
            continue
        keep[members[front(units[members], obj[members])]] = True
    return keep
