"""The partition helpers against enumeration of every partition on small random inputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.hybrid import partition
from solvers.hybrid.tables import kind_period


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
def test_min_max_with_alternatives_per_stage_equals_enumeration(total: int, data: st.DataObject) -> None:
    """Each stage takes the cheapest of its alternatives for its layer count (linear and prefix forms)."""
    k = data.draw(st.integers(1, 4))
    opts = [data.draw(st.integers(1, 3)) for _ in range(k)]
    fixed = [data.draw(st.lists(st.integers(0, 50), min_size=o, max_size=o)) for o in opts]
    per = [data.draw(st.lists(st.integers(0, 20), min_size=o, max_size=o)) for o in opts]
    want = _brute(total, k, lambda s, start, n: min(f + n * p for f, p in zip(fixed[s], per[s], strict=True)))
    got = partition.min_max_linear(total, [[float(f) for f in x] for x in fixed], [[float(p) for p in x] for x in per])
    assert got == want
    cum = [np.array([np.arange(total + 1) * p for p in x], dtype=float) for x in per]
    assert partition.min_max_prefix([[float(f) for f in x] for x in fixed], cum) == want


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


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_best_variants_equals_enumeration(data: st.DataObject) -> None:
    """Per-stage variants (time, step time): the cap search (forced here; few combinations are enumerated)
    equals trying every combination under the 1F1B / interleaved step-time formula, including moves where
    two stages must change together."""
    import itertools

    from solvers.cost_model.pipeline import step_time_s

    k = data.draw(st.integers(1, 4))
    m = data.draw(st.integers(1, 64))
    v = data.draw(st.sampled_from([1, 2]))
    vals = st.floats(0.01, 1.0, allow_nan=False)
    opts = [data.draw(st.lists(st.tuples(vals, vals), min_size=1, max_size=4)) for _ in range(k)]

    def variants(stage: int, start: int, count: int) -> list[tuple[float, float, int]]:
        return [(t, u, i) for i, (t, u) in enumerate(opts[stage])]

    def pipe(ts: list[float], us: list[float]) -> float:
        return step_time_s(ts, us, m, v, "interleaved" if v > 1 else "1f1b")

    got, pick = partition.best_variants((1,) * k, variants, pipe, exhaustive_limit=1)  # the cap search
    brute = min(pipe([opts[s][i][0] for s, i in enumerate(c)], [opts[s][i][1] for s, i in enumerate(c)])
                for c in itertools.product(*(range(len(o)) for o in opts)))
    assert got == pytest.approx(brute, rel=1e-12)
    assert pipe([opts[s][i][0] for s, i in enumerate(pick)], [opts[s][i][1] for s, i in enumerate(pick)]) == \
        pytest.approx(got, rel=1e-12)


def test_best_variants_moves_two_stages_at_once() -> None:
    """Lowering the largest step time needs both stages 1 and 2 to switch: one stage at a time gains nothing."""
    opts = [[(1.0, 0.5)], [(0.9, 0.8), (1.0, 0.5)], [(0.9, 0.8), (1.0, 0.5)]]

    def pipe(ts: list[float], us: list[float]) -> float:
        return 10 * max(ts) + sum(ts) - max(ts) + max(us)

    got, pick = partition.best_variants((1, 1, 1), lambda s, a, n: [(t, u, i) for i, (t, u) in enumerate(opts[s])],
                                        pipe, exhaustive_limit=1)
    assert pick == (0, 1, 1)
    assert got == pytest.approx(10 + 2.0 + 0.5)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.data())
def test_min_max_and_min_sum_tables_equal_enumeration_where_stages_take_few_layers(total: int,
                                                                                    data: st.DataObject) -> None:
    """The table DPs span only the counts a stage can take (memory caps stages of deep stacks): with random
    infeasible counts, by count (1-D, identical layers) and by [start, count] (2-D), both equal enumeration."""
    k = data.draw(st.integers(1, 4))
    cap = data.draw(st.integers(1, total))  # no stage takes more than this many layers
    vals = st.one_of(st.floats(0.0, 50.0, allow_nan=False), st.just(np.inf))
    one = [np.array([data.draw(vals) if n <= cap else np.inf for n in range(1, total + 1)]) for _ in range(k)]
    two = [np.array([[np.inf] + [data.draw(vals) if n <= cap and a + n <= total else np.inf
                                 for n in range(1, total + 1)] for a in range(total)]) for _ in range(k)]
    for tables, cost in ((one, lambda s, a, n: one[s][n - 1]), (two, lambda s, a, n: two[s][a, n])):
        assert partition.min_max_value(total, tables) == _brute(total, k, cost)
        sums = [sum(cost(s, int(a), n) for s, (a, n) in enumerate(zip(np.cumsum((0, *p))[:-1], p, strict=True)))
                for p in partition._all_compositions(total, k)]
        assert partition.min_sum_value(total, tables) == pytest.approx(min(sums, default=np.inf))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.data())
def test_min_of_max_and_sum_equals_enumeration(total: int, data: st.DataObject) -> None:
    """The chain bound's core: the least over partitions of max(largest ``slow``, sum of ``fill``), by count
    (1-D) and by [start, count] (2-D) tables with infeasible counts; with ``enough`` below it, ``enough``."""
    k = data.draw(st.integers(1, 4))
    vals = st.one_of(st.integers(0, 40).map(float), st.floats(0.0, 40.0, allow_nan=False), st.just(np.inf))

    def tables(two_d: bool) -> list[np.ndarray]:
        if not two_d:
            return [np.array([data.draw(vals) for _ in range(total)]) for _ in range(k)]
        return [np.array([[np.inf] + [data.draw(vals) if a + n <= total else np.inf for n in range(1, total + 1)]
                          for a in range(total)]) for _ in range(k)]

    for two_d in (False, True):
        slow, fill = tables(two_d), tables(two_d)

        def value(t: np.ndarray, a: int, n: int) -> float:
            return float(t[a, n] if t.ndim == 2 else t[n - 1])

        want = np.inf
        for parts in partition._all_compositions(total, k):
            starts = np.cumsum((0, *parts))[:-1]
            worst = max(value(slow[s], int(a), n) for s, (a, n) in enumerate(zip(starts, parts, strict=True)))
            total_fill = sum(value(fill[s], int(a), n) for s, (a, n) in enumerate(zip(starts, parts, strict=True)))
            want = min(want, max(worst, total_fill))
        assert partition.min_of_max_and_sum(total, slow, fill) == pytest.approx(want)
        enough = data.draw(st.floats(0.0, 100.0, allow_nan=False))
        got = partition.min_of_max_and_sum(total, slow, fill, enough)
        assert got == (enough if want > enough else pytest.approx(want))
