"""Dominance pruning of per-layer candidates before the DP.

Within one transition class (candidates that re-layout identically to their neighbours) a candidate that is
no faster and no smaller than another can never be needed: swapping it for the other keeps every plan
feasible and no slower. Across classes nothing is pruned, because a worse candidate may save a re-layout.
"""

from __future__ import annotations

import numpy as np


def pareto_mask(obj: np.ndarray, units: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """True for candidates on their class' (objective, memory) Pareto front (ties keep the first)."""
    n = obj.shape[0]
    keep = np.zeros(n, dtype=bool)
    finite = np.isfinite(obj)
    for k in np.unique(classes):
        members = np.flatnonzero((classes == k) & finite)
        if members.size == 0:
            continue
        # sort by memory, then objective, then index: a candidate survives if it beats every smaller one
        order = members[np.lexsort((members, obj[members], units[members]))]
        best_before = np.minimum.accumulate(np.concatenate([[np.inf], obj[order][:-1]]))
        keep[order[obj[order] < best_before]] = True
    return keep
