"""Dominance pruning against brute force: a candidate is kept iff no other of its class is at most as large and as
slow with one of the two strictly better, or equal and earlier."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.hybrid.prune import pareto_mask


def brute_force(obj: np.ndarray, units: np.ndarray, classes: np.ndarray) -> np.ndarray:
    keep = np.zeros(obj.size, dtype=bool)
    for i in range(obj.size):
        if not np.isfinite(obj[i]):
            continue
        beaten = False
        for j in range(obj.size):
            if j == i or classes[j] != classes[i] or not np.isfinite(obj[j]):
                continue
            no_worse = obj[j] <= obj[i] and units[j] <= units[i]
            better = obj[j] < obj[i] or units[j] < units[i]
            if no_worse and (better or j < i):  # (equal points: the first stays)
                beaten = True
                break
        keep[i] = not beaten
    return keep


@pytest.mark.parametrize("seed", range(40))
def test_the_kept_candidates_are_each_class_front(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    # few distinct values, so that ties in memory, objective or both are common; some candidates unpriceable
    obj = rng.integers(0, 8, n).astype(float) * 0.25
    obj[rng.random(n) < 0.1] = np.inf
    units = rng.integers(0, 6, n).astype(np.int64)
    classes = rng.integers(0, int(rng.integers(1, 6)), n)
    np.testing.assert_array_equal(pareto_mask(obj, units, classes), brute_force(obj, units, classes))


def test_nothing_priceable_keeps_nothing() -> None:
    assert not pareto_mask(np.full(3, np.inf), np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64)).any()
