"""Both layer DPs (binned memory, exact Pareto fronts) against enumeration of every assignment."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.hybrid import layer_dp, pareto_dp, prune
from solvers.hybrid.layer_dp import LayerTerms


@st.composite
def stage(draw: st.DrawFn, integral: bool) -> tuple[list[LayerTerms], np.ndarray, np.ndarray, float, np.ndarray]:
    """Up to 5 layers of up to 2 kinds, 1-5 candidates in 1-3 transition classes, a prefix cap per layer."""
    n_cand = draw(st.integers(1, 5))
    classes = np.sort(np.array([draw(st.integers(0, 2)) for _ in range(n_cand)]))
    classes = np.unique(classes, return_inverse=True)[1].reshape(-1)
    n_cls = int(classes.max()) + 1
    trans = np.array([[0.0 if a == b else float(draw(st.integers(0, 4))) for b in range(n_cls)]
                      for a in range(n_cls)])
    mem = st.integers(0, 12) if integral else st.floats(0.0, 12.0, allow_nan=False)

    def kind() -> LayerTerms:
        t = np.array([float(draw(st.integers(1, 20))) for _ in range(n_cand)])
        u = np.array([float(draw(st.integers(0, 5))) for _ in range(n_cand)])
        if draw(st.booleans()):
            t[0] = math.inf  # an excluded candidate
        units = np.array([float(draw(mem)) for _ in range(n_cand)])
        return LayerTerms(2.0 * t + u, units.astype(np.int64) if integral else units, t, u)

    kinds = [kind() for _ in range(draw(st.integers(1, 2)))]
    n = draw(st.integers(1, 5))
    layers = [kinds[draw(st.integers(0, len(kinds) - 1))] for _ in range(n)]
    cap = float(draw(st.integers(0, 40)))
    caps = np.minimum.accumulate(np.array([cap - float(draw(st.integers(0, 3))) * i for i in range(n)]))
    return layers, classes, trans, cap, caps


def _enumerate(layers: list[LayerTerms], classes: np.ndarray, trans: np.ndarray, caps: np.ndarray,
               k: int) -> float:
    best = math.inf
    for pick in itertools.product(range(classes.size), repeat=k):
        ok = all(sum(float(layers[i].units[c]) for i, c in enumerate(pick[:j + 1])) <= caps[j]
                 for j in range(k))
        if ok:
            best = min(best, _value(layers, classes, trans, pick))
    return best


def _value(layers: list[LayerTerms], classes: np.ndarray, trans: np.ndarray, pick: tuple[int, ...]) -> float:
    relayout = sum(trans[classes[a], classes[b]] for a, b in itertools.pairwise(pick))
    return float(sum(layers[i].obj[c] for i, c in enumerate(pick)) + 2.0 * relayout)


def _check(table: layer_dp.PrefixTable | pareto_dp.ExactTable, case: tuple, k: int, want: float) -> None:
    layers, classes, trans, _, caps = case
    got = float(table.obj[k - 1]) if k <= len(table.obj) else math.inf
    assert got == want or math.isclose(got, want, rel_tol=1e-9), (k, got, want)
    if math.isfinite(got):  # the reported path has that objective and keeps every prefix cap
        pick = tuple(table.path(k, classes, [x.units for x in layers]))
        assert math.isclose(_value(layers, classes, trans, pick), got, rel_tol=1e-9)
        assert all(sum(float(layers[i].units[c]) for i, c in enumerate(pick[:j + 1])) <= caps[j]
                   for j in range(k))


@settings(max_examples=150, deadline=None)
@given(stage(integral=True))
def test_both_dps_equal_enumeration_on_integral_memory(case: tuple) -> None:
    layers, classes, trans, cap, caps = case
    binned = layer_dp.run(layers, classes, trans, int(cap), trans_weight=2.0, prefix_caps=caps.astype(np.int64))
    exact = pareto_dp.run(layers, classes, trans, cap, trans_weight=2.0, prefix_caps=caps)
    for k in range(1, len(layers) + 1):
        want = _enumerate(layers, classes, trans, caps, k)
        _check(binned, case, k, want)
        _check(exact, case, k, want)


@settings(max_examples=150, deadline=None)
@given(stage(integral=False))
def test_pareto_dp_is_exact_on_fractional_memory_where_bins_round_up(case: tuple) -> None:
    layers, classes, trans, cap, caps = case
    exact = pareto_dp.run(layers, classes, trans, cap, trans_weight=2.0, prefix_caps=caps)
    # the binned DP on whole bins (memory rounded up): feasible plans only, never better than the exact one
    up = [LayerTerms(x.obj, np.ceil(x.units).astype(np.int64), x.time_s, x.step_s) for x in layers]
    binned = layer_dp.run(up, classes, trans, int(cap), trans_weight=2.0,
                          prefix_caps=np.floor(caps).astype(np.int64))
    for k in range(1, len(layers) + 1):
        want = _enumerate(layers, classes, trans, caps, k)
        _check(exact, case, k, want)
        coarse = float(binned.obj[k - 1]) if k <= len(binned.obj) else math.inf
        assert coarse >= want - 1e-9


def test_front_keeps_exactly_the_undominated_points() -> None:
    rng = np.random.default_rng(3)
    mem, obj = rng.integers(0, 8, 200).astype(float), rng.integers(0, 8, 200).astype(float)
    kept = set(prune.front(mem, obj).tolist())
    for i in range(mem.size):
        dominated = any((mem[j] <= mem[i] and obj[j] <= obj[i]) and (mem[j], obj[j]) != (mem[i], obj[i])
                        for j in range(mem.size))
        if dominated:
            assert i not in kept
    # one point per distinct undominated (memory, objective) pair
    pts = {(mem[i], obj[i]) for i in kept}
    assert len(pts) == len(kept)
    assert all(not any(m2 <= m and o2 <= o and (m2, o2) != (m, o) for m2, o2 in zip(mem, obj, strict=True))
               for m, o in pts)
