"""The partition helpers against enumeration of every partition on small random inputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.hybrid import partition
from solvers.hybrid.planner import kind_period


def _brute(total: int, k: int, cost: Callable[[int, int, int], float]) -> float:
    best = np.inf
    for parts in partition._all_compositions(total, k):
        start, worst = 0, 0.0
        for s, n in enumerate(parts):
            worst = max(worst, cost(s, start, n))
            start += n
        best = min(best, worst)
    return float(best)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.data())
def test_min_max_linear_equals_enumeration(total: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, 5))
    fixed = data.draw(st.lists(st.integers(0, 50), min_size=k, max_size=k))
    per = data.draw(st.lists(st.integers(0, 20), min_size=k, max_size=k))
    got = partition.min_max_linear(total, [float(f) for f in fixed], [float(p) for p in per])
    assert got == _brute(total, k, lambda s, start, n: fixed[s] + n * per[s])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9), st.data())
def test_min_max_prefix_and_matrix_partition_equal_enumeration(total: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, 5))
    fixed = data.draw(st.lists(st.integers(0, 50), min_size=k, max_size=k))
    w = [data.draw(st.lists(st.integers(0, 20), min_size=total, max_size=total)) for _ in range(k)]
    cum = [np.concatenate([[0.0], np.cumsum(x)]) for x in w]

    def cost(s: int, start: int, n: int) -> float:
        return float(fixed[s] + cum[s][start + n] - cum[s][start])

    want = _brute(total, k, cost)
    assert partition.min_max_prefix([float(f) for f in fixed], cum) == want
    # the vectorised min-max DP over [start, count] matrices finds a partition of the same worst stage
    mats = [np.array([[np.inf] + [cost(s, a, n) if a + n <= total else np.inf for n in range(1, total + 1)]
                      for a in range(total)]) for s in range(k)]
    parts = partition.min_max_partition(total, k, lambda s, a, n: (cost(s, a, n), 0.0), mats)
    if not np.isfinite(want):
        assert parts is None
        return
    assert parts is not None and sum(parts) == total and min(parts) >= 1
    starts = np.cumsum((0, *parts))
    assert max(cost(s, int(starts[s]), n) for s, n in enumerate(parts)) == want


def test_kind_period() -> None:
    assert kind_period(["d"] * 7) == 1
    assert kind_period(["d", "m"] * 5) == 2
    assert kind_period(["d", "d", "m"] * 3 + ["d"]) == 3
    assert kind_period(["d", "m", "m"]) == 3
