"""The two-strategy stage solver against enumeration of every assignment (exact memory)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.hybrid import two_type


@st.composite
def stage(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
    c = draw(st.integers(1, 4))
    n = draw(st.integers(1, 5))
    vals = st.integers(1, 20)
    t = np.array([draw(vals) for _ in range(c)], dtype=float)
    u = np.array([draw(st.integers(0, 5)) for _ in range(c)], dtype=float)
    mem = np.array([draw(vals) for _ in range(c)], dtype=float)
    extra = np.array([draw(st.integers(0, 6)) for _ in range(c)], dtype=float)
    trans = np.array([[0.0 if i == j else draw(st.integers(0, 3)) for j in range(c)] for i in range(c)])
    budget = float(draw(st.integers(5, 80)))
    return t, u, mem, extra, trans, np.array([budget, n])


def _value(pick: tuple[int, ...], t: np.ndarray, u: np.ndarray, trans: np.ndarray, w: float) -> float:
    return float(sum(w * t[c] + u[c] for c in pick) + w * sum(trans[a, b] for a, b in itertools.pairwise(pick)))


@settings(max_examples=150, deadline=None)
@given(stage())
def test_two_type_is_at_least_the_best_two_block_assignment(case: tuple[np.ndarray, ...]) -> None:
    """At least as good as every assignment of two blocks, never better than enumeration, and its reported
    mix (a third strategy included) has exactly its cost and fits."""
    t, u, mem, extra, trans, (budget, n_f) = case
    n, w = int(n_f), 3.0
    table = two_type.solve(w * t + u, t, u, mem, extra, trans, budget, n, w)
    for k in range(1, n + 1):
        best_any, best_two = math.inf, math.inf
        for pick in itertools.product(range(len(t)), repeat=k):
            if sum(mem[c] for c in pick) + max(extra[c] for c in pick) > budget:
                continue
            v = _value(pick, t, u, trans, w)
            best_any = min(best_any, v)
            blocks = sum(1 for a, b in itertools.pairwise(pick) if a != b)
            if blocks <= 1:
                best_two = min(best_two, v)
        got = float(table.obj[k - 1])
        assert got <= best_two * (1 + 1e-9), (k, got, best_two)
        assert got >= best_any - 1e-9  # a restriction never beats enumeration
        if math.isfinite(got):  # its reported mix really has that cost and fits
            pick = tuple(table.choice(k))
            assert math.isclose(_value(pick, t, u, trans, w), got, rel_tol=1e-9)
            assert sum(mem[c] for c in pick) + max(extra[c] for c in pick) <= budget


# (per-layer time, per-layer memory, budget, the optimum of 6 layers by enumeration, its mix)
THIRD_CASES = [
    # none / selective / full recomputation: the best pair 3 none + 3 full (69, memory 39); one selective in the
    # memory it leaves reaches the optimum
    ((10.0, 12.0, 13.0), (10.0, 8.0, 3.0), 44.0, 68.0, [0, 0, 0, 1, 2, 2]),
    # one layer from the pair 3 + 3 of the first and last (99), not from the best pair: the few best pairs count
    ((13.0, 17.0, 20.0), (11.0, 8.0, 6.0), 53.0, 96.0, [0, 0, 0, 1, 2, 2]),
    # two layers of the middle strategy beside the pair of the others; one layer of it reaches 93
    ((14.0, 15.0, 19.0), (12.0, 10.0, 2.0), 59.0, 91.0, [0, 0, 0, 1, 1, 2]),
]


@pytest.mark.parametrize(("t", "mem", "budget", "optimum", "mix"), THIRD_CASES)
def test_layers_of_a_third_strategy_take_the_memory_a_pair_leaves(t: tuple[float, ...], mem: tuple[float, ...],
                                                                  budget: float, optimum: float,
                                                                  mix: list[int]) -> None:
    """Six layers, three strategies: the table finds the enumerated optimum, which no pair of two reaches."""
    tt, mm = np.array(t), np.array(mem)
    table = two_type.solve(tt, tt, np.zeros(3), mm, np.zeros(3), np.zeros((3, 3)), budget, 6, 1.0)
    picks = [pick for pick in itertools.product(range(3), repeat=6) if sum(mm[c] for c in pick) <= budget]
    assert min(sum(tt[c] for c in pick) for pick in picks) == optimum
    assert min(sum(tt[c] for c in pick) for pick in picks if len(set(pick)) <= 2) > optimum
    assert table.obj[5] == optimum and table.time_s[5] == optimum
    assert sorted(table.choice(6)) == mix
