"""The relaxations behind the planner's bounds never exceed the constrained optimum (brute force)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.hybrid import bounds, partition

costs = st.lists(st.tuples(st.integers(1, 20), st.floats(0.1, 10.0, allow_nan=False)), min_size=1, max_size=4)


def _brute(kind_of_layer: list[int], start: int, count: int, mem: list[np.ndarray], val: list[np.ndarray],
           budget: float) -> float:
    """Least total value of layers [start, start + count), one candidate each, memory within budget."""
    ks = kind_of_layer[start:start + count]
    best = np.inf
    for pick in itertools.product(*(range(len(mem[k])) for k in ks)):
        if sum(mem[k][c] for k, c in zip(ks, pick, strict=True)) <= budget:
            best = min(best, sum(val[k][c] for k, c in zip(ks, pick, strict=True)))
    return float(best)


@settings(max_examples=80, deadline=None)
@given(st.lists(costs, min_size=1, max_size=2), st.integers(1, 6), st.integers(1, 60), st.data())
def test_mixed_relaxation_bounds_every_range(kinds: list[list[tuple[int, float]]], n: int, budget: int,
                                             data: st.DataObject) -> None:
    period = len(kinds)
    kind_of_layer = [i % period for i in range(n)]
    mem = [np.array([m for m, _ in k], dtype=float) for k in kinds]
    val = [np.array([v for _, v in k], dtype=float) for k in kinds]
    table = bounds.mixed_relaxed_cost(kind_of_layer, period, mem, val, float(budget))
    for start in range(n):
        for count in range(1, n - start + 1):
            truth = _brute(kind_of_layer, start, count, mem, val, float(budget))
            got = table[start % period, count]
            assert got <= truth * (1 + 1e-12) + 1e-12, (start, count, got, truth)


def test_mixed_relaxation_is_exact_without_a_binding_budget() -> None:
    """With memory to spare every layer takes its cheapest candidate (λ = 0)."""
    mem = [np.array([4.0, 1.0]), np.array([3.0, 2.0])]
    val = [np.array([1.0, 2.0]), np.array([5.0, 6.0])]
    table = bounds.mixed_relaxed_cost([0, 1, 0, 1], 2, mem, val, 100.0)
    assert table[0, 4] == 1 + 5 + 1 + 5 and table[1, 3] == 5 + 1 + 5
    # too little memory for even the leanest choice: infeasible
    assert np.isinf(bounds.mixed_relaxed_cost([0, 1, 0, 1], 2, mem, val, 5.0)[0, 4])


def test_mixed_relaxation_of_a_stage_without_memory_is_infeasible_quietly() -> None:
    """A stage the model cannot price has infinite fixed memory, so no budget at all: every count of layers
    is infeasible, computed without 0 x inf (the λ = 0 row once warned and held NaN, masked only by luck)."""
    mem = [np.array([4.0, 1.0]), np.array([3.0, 2.0])]
    val = [np.array([1.0, 2.0]), np.array([5.0, 6.0])]
    with np.errstate(all="raise"):
        table = bounds.mixed_relaxed_cost([0, 1, 0, 1], 2, mem, val, -np.inf)
    assert np.all(table[:, 0] == 0.0) and np.all(np.isinf(table[:, 1:]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=6), min_size=1, max_size=2), st.integers(1, 12))
def test_transient_levels_cover_every_largest_buffer(extra: list[list[int]], groups: int) -> None:
    """Whatever a plan's largest transient buffer P is, one level admits every candidate it uses (cap ≥ P)
    and reserves no more than P; one group is the plain relaxation, enough groups are exact."""
    arrays = [np.asarray(e, dtype=float) for e in extra]
    levels = bounds.transient_levels(arrays, groups)
    values = sorted({v for e in extra for v in e})
    assert len(levels) == min(groups, len(values))
    for p in values:
        assert any(reserved <= p <= cap for cap, reserved in levels)
    assert all(reserved <= cap for cap, reserved in levels)
    if groups == 1:  # every candidate admitted, the least buffer reserved
        assert levels[0][0] >= values[-1] and levels[0][1] == values[0]
    elif groups >= len(values):
        assert levels == [(v, v) for v in values]


@settings(max_examples=80, deadline=None)
@given(costs, st.integers(1, 4), st.integers(0, 60))
def test_whole_candidate_bound_is_the_exact_optimum_without_transitions(cands: list[tuple[int, float]], k_max: int,
                                                                        budget: int) -> None:
    """For k identical layers, the least total value of k whole candidates within the budget: equal to
    enumeration (so a bound, transitions aside), and never below the LP relaxation."""
    mem = np.array([float(m) for m, _ in cands])
    val = np.array([v for _, v in cands])
    got = bounds.integral_cost(mem, val, np.full(k_max + 1, float(budget)), k_max, cache={})
    for k in range(1, k_max + 1):
        want = _brute([0] * k, 0, k, [mem], [val], budget)
        assert got[k] == want or np.isclose(got[k], want), (k, got[k], want)
        lp = k * bounds.relaxed_cost(mem, val, np.array([budget / k]))[0]
        assert got[k] >= lp - 1e-9


def _brute_sequence(mem: np.ndarray, val: np.ndarray, cls: np.ndarray, trans: np.ndarray, k: int,
                    budget: float) -> float:
    """Least total of k layers in a row, one candidate each, within budget, each change of class between
    neighbours paying its transition (as the evaluator charges a stage)."""
    best = np.inf
    for pick in itertools.product(range(len(mem)), repeat=k):
        if sum(mem[c] for c in pick) <= budget:
            moves = sum(trans[cls[a], cls[b]] for a, b in itertools.pairwise(pick))
            best = min(best, sum(val[c] for c in pick) + moves)
    return float(best)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.floats(0.1, 10.0, allow_nan=False), st.integers(0, 2)),
                min_size=1, max_size=4),
       st.integers(1, 4), st.integers(0, 60), st.lists(st.floats(0.0, 1.0), min_size=9, max_size=9))
def test_whole_candidate_bound_with_layout_switches_stays_below_every_sequence(
        cands: list[tuple[int, float, int]], k_max: int, budget: int, moves: list[float]) -> None:
    """Charging a stage that mixes layout classes the least class change never rises above the best sequence of
    whole candidates with its transitions, and never falls below the bound that ignores them."""
    mem = np.array([float(m) for m, _, _ in cands])
    val = np.array([v for _, v, _ in cands])
    cls = np.array([c for _, _, c in cands])
    trans = np.array(moves).reshape(3, 3)
    np.fill_diagonal(trans, 0.0)
    switch = float(np.min(trans[~np.eye(3, dtype=bool)]))
    caps = np.full(k_max + 1, float(budget))
    got = bounds.integral_cost_with_switch(mem, val, cls, switch, caps, k_max, cache={})
    blind = bounds.integral_cost(mem, val, caps, k_max, cache={})
    for k in range(1, k_max + 1):
        want = _brute_sequence(mem, val, cls, trans, k, budget)
        assert got[k] <= want * (1 + 1e-12) + 1e-12, (k, got[k], want)
        assert got[k] >= blind[k] - 1e-12


@pytest.mark.parametrize(("moves", "want"), [((0.3, 0.3), 3.5), ((0.1, 0.4), 3.4)])
def test_a_stage_that_must_mix_layouts_to_fit_pays_the_least_switch(moves: tuple[float, float], want: float) -> None:
    """Three fast layers do not fit; the transition-blind bound takes two fast ones and the other layout's lean
    one (3.3). That mix pays a re-layout: at 0.3 the fast layout with its own slower lean candidate (3.5) is
    best, at 0.1 into the other layout (0.4 back) the mix ordered to change once (3.4). The bound is exact."""
    mem, val, cls = np.array([10.0, 4.0, 4.0]), np.array([1.0, 1.3, 1.5]), np.array([0, 1, 0])
    trans = np.array([[0.0, moves[0]], [moves[1], 0.0]])
    caps = np.full(4, 24.0)
    got = bounds.integral_cost_with_switch(mem, val, cls, min(moves), caps, 3, cache={})
    assert bounds.integral_cost(mem, val, caps, 3, cache={})[3] == pytest.approx(3.3)
    assert got[3] == pytest.approx(_brute_sequence(mem, val, cls, trans, 3, 24.0)) == pytest.approx(want)


def test_a_kind_without_candidates_blocks_only_the_ranges_that_hold_it() -> None:
    """(A cap on transient memory can leave one layer kind nothing: the other ranges keep their bound.)"""
    mem = [np.array([4.0, 2.0]), np.array([8.0])]
    val = [np.array([1.0, 3.0]), np.array([np.inf])]  # kind 1: no candidate
    out = bounds.mixed_relaxed_cost([0, 0, 0, 1], 4, mem, val, budget=10.0)
    for start in range(3):
        for count in range(0, 4 - start):
            want = _brute([0, 0, 0, 1], start, count, mem, val, 10.0) if start + count <= 3 else np.inf
            assert out[start, count] <= want + 1e-9
            assert np.isfinite(out[start, count]) == np.isfinite(want)
    assert np.isinf(out[0, 4]) and np.isinf(out[3, 1])


def _partitions(total: int, stages: int) -> list[tuple[int, ...]]:
    return [c for c in itertools.product(range(1, total + 1), repeat=stages) if sum(c) == total]



@settings(max_examples=150, deadline=None)
@given(st.integers(2, 7), st.integers(2, 4), st.data())
def test_max_plus_sum_bound_never_exceeds_any_partition_and_converges(total: int, stages: int,
                                                                      data: st.DataObject) -> None:
    """The fill bound's partition step: below the least of max slow + sum fill over every partition (found by
    enumeration, some layer counts infeasible), at every number of halvings, and equal to it with many."""
    if stages > total:
        stages = total
    slow, fill = [], []
    for _ in range(stages):
        a = np.array([data.draw(st.floats(0.0, 10.0, allow_nan=False)) for _ in range(total)])
        a[np.array(data.draw(st.lists(st.booleans(), min_size=total, max_size=total)))] = np.inf
        slow.append(a)
        fill.append(np.array([data.draw(st.floats(0.0, 10.0, allow_nan=False)) for _ in range(total)]))
    truth = min((max(slow[s][c - 1] for s, c in enumerate(p)) + sum(fill[s][c - 1] for s, c in enumerate(p))
                 for p in _partitions(total, stages)), default=np.inf)
    for splits in (0, 1, 3, 8):
        assert partition.min_max_plus_sum_bound(total, slow, fill, splits) <= truth + 1e-9
    if np.isfinite(truth):
        assert partition.min_max_plus_sum_bound(total, slow, fill, 200) == pytest.approx(truth, abs=1e-6)
    else:
        assert partition.min_max_plus_sum_bound(total, slow, fill, 8) == np.inf
