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
    """True for candidates on their class' (objective, memory) Pareto front (ties keep the first): ``front`` of
    every class at once. Points sorted by (class, memory, objective); the objective replaced by its rank (exact
    ties and order) and shifted so that each class lies below every earlier one, so one running minimum restarts
    at each class's first point."""
    keep = np.zeros(obj.shape[0], dtype=bool)
    members = np.flatnonzero(np.isfinite(obj))
    if members.size == 0:
        return keep
    _, cls = np.unique(classes[members], return_inverse=True)
    _, rank = np.unique(obj[members], return_inverse=True)
    order = np.lexsort((rank, units[members], cls))  # stable: equal points stay in index order
    shifted = rank[order] + (cls.max() - cls[order]) * (rank.max() + 1)
    before = np.minimum.accumulate(np.concatenate([[np.iinfo(np.int64).max], shifted[:-1]]))
    keep[members[order[shifted < before]]] = True
    return keep
