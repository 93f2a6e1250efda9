"""The two-strategy stage solver against enumeration of every assignment (exact memory)."""

from __future__ import annotations

import itertools
import math

import numpy as np
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


def test_one_layer_of_a_third_strategy_takes_the_memory_the_best_pair_leaves() -> None:
    """Recomputation none / selective / full (time 10 / 12 / 13, memory 10 / 8 / 3), 6 layers in 44: the best
    pair is 3 none + 3 full (time 69, memory 39); 3 none + 1 selective + 2 full fits (44) and takes 68, the
    optimum by enumeration."""
    t, u = np.array([10.0, 12.0, 13.0]), np.zeros(3)
    mem, extra, trans = np.array([10.0, 8.0, 3.0]), np.zeros(3), np.zeros((3, 3))
    table = two_type.solve(t, t, u, mem, extra, trans, 44.0, 6, 1.0)
    best = min(sum(t[c] for c in pick) for pick in itertools.product(range(3), repeat=6)
               if sum(mem[c] for c in pick) <= 44)
    assert best == 68 and table.obj[5] == 68 and table.time_s[5] == 68
    assert sorted(table.choice(6)) == [0, 0, 0, 1, 2, 2]


def test_a_third_strategy_beside_a_pair_that_is_not_the_best() -> None:
    """Time 13 / 17 / 20, memory 11 / 8 / 6, 6 layers in 53: the optimum, 3 + 1 + 2 layers (96), is one layer
    away from the pair 3 + 3 of the first and last strategies (99), not from the best pair: a third strategy is
    tried beside each count's few best pairs."""
    t, u = np.array([13.0, 17.0, 20.0]), np.zeros(3)
    mem, extra, trans = np.array([11.0, 8.0, 6.0]), np.zeros(3), np.zeros((3, 3))
    table = two_type.solve(t, t, u, mem, extra, trans, 53.0, 6, 1.0)
    best = min(sum(t[c] for c in pick) for pick in itertools.product(range(3), repeat=6)
               if sum(mem[c] for c in pick) <= 53)
    assert best == 96 and table.obj[5] == 96
    assert sorted(table.choice(6)) == [0, 0, 0, 1, 2, 2]


def test_two_layers_of_a_third_strategy() -> None:
    """Time 14 / 15 / 19, memory 12 / 10 / 2, 6 layers in 59: the optimum, 3 + 2 + 1 layers (91, memory 58),
    takes two layers of the middle strategy beside the pair 3 + 3 of the others; one layer of it reaches 93."""
    t, u = np.array([14.0, 15.0, 19.0]), np.zeros(3)
    mem, extra, trans = np.array([12.0, 10.0, 2.0]), np.zeros(3), np.zeros((3, 3))
    table = two_type.solve(t, t, u, mem, extra, trans, 59.0, 6, 1.0)
    best = min(sum(t[c] for c in pick) for pick in itertools.product(range(3), repeat=6)
               if sum(mem[c] for c in pick) <= 59)
    assert best == 91 and table.obj[5] == 91 and table.time_s[5] == 91
    assert sorted(table.choice(6)) == [0, 0, 0, 1, 1, 2]
