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
def test_two_type_is_the_best_two_block_assignment(case: tuple[np.ndarray, ...]) -> None:
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
        assert got == best_two or math.isclose(got, best_two, rel_tol=1e-9), (k, got, best_two)
        assert got >= best_any - 1e-9  # a restriction never beats enumeration
        if math.isfinite(got):  # its reported mix really has that cost and fits
            pick = tuple(table.choice(k))
            assert math.isclose(_value(pick, t, u, trans, w), got, rel_tol=1e-9)
            assert sum(mem[c] for c in pick) + max(extra[c] for c in pick) <= budget
