"""The lower bound: never above the optimum (brute force on tiny workloads), never below the simple
max(least work / N, critical path), and tighter than it where the most efficient widths are too slow."""

from __future__ import annotations

import random

import pytest

from solvers.spindle.bounds import device_ranges, lower_bound_s, op_time_s
from solvers.spindle.schedule import Problem
from tests.spindle.helpers import brute_force_makespan, explicit_request, problem_of, random_workload


def _simple_bound(problem: Problem) -> float:
    wl = problem.workload
    ranges = device_ranges(problem)
    work = sum(min(n * op_time_s(op, n) for n in range(r.lo, r.hi + 1)) for op, r in zip(wl.ops, ranges, strict=True))
    finish = [0.0] * len(wl.ops)
    for v in wl.topo:
        fastest = min(op_time_s(wl.ops[v], n) for n in range(ranges[v].lo, ranges[v].hi + 1))
        finish[v] = fastest + max((finish[u] for u in wl.preds[v]), default=0.0)
    return max(work / problem.num_devices, max(finish))


@pytest.mark.parametrize("seed", range(10))
def test_the_bound_lies_between_the_simple_bound_and_the_optimum(seed: int) -> None:
    rng = random.Random(300 + seed)
    ops, edges = random_workload(rng, rng.randint(2, 3), max_layers=4)
    problem = problem_of(explicit_request(ops, edges, rng.choice([2, 3, 4])))
    bound = lower_bound_s(problem)
    assert _simple_bound(problem) * (1 - 1e-12) <= bound <= brute_force_makespan(problem) * (1 + 1e-12)


def test_the_bound_counts_the_work_of_widths_fast_enough_for_the_makespan() -> None:
    # three independent metaops on 4 devices, each 8 ms on one device, 4.25 ms on two, 2.375 ms on four (a
    # 0.5 ms launch floor): the simple bound is the area at one device each, 3 * 8 / 4 = 6 ms, but in 6 ms no
    # metaop finishes on one device: each must mix in wider, costlier widths, and the bound rises to 6.18 ms
    # (the optimum, 6.625 ms, is above it)
    op = {"batch_size": 4, "num_layers": 1, "time_ms_per_layer": {"slope_ms_per_sample": 1.875, "intercept_ms": 0.5}}
    problem = problem_of(explicit_request([{"name": f"m{i}", **op} for i in range(3)], [], 4))
    simple, bound, best = _simple_bound(problem), lower_bound_s(problem), brute_force_makespan(problem)
    assert simple == pytest.approx(8.0e-3 * 3 / 4)
    assert simple < bound <= best
    assert (bound, best) == (pytest.approx(6.1818e-3, rel=1e-4), pytest.approx(6.625e-3))
