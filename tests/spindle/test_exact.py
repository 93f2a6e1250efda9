"""The CP-SAT model against brute force on tiny workloads, and against its warm start on real ones."""

from __future__ import annotations

import random

import pytest

from solvers.spindle import exact, planner
from solvers.spindle.bounds import device_ranges
from solvers.spindle.schedule import timeline, violations
from tests.spindle.helpers import brute_force_makespan, explicit_request, problem_of, random_workload


@pytest.mark.parametrize("seed", range(8))
def test_exact_model_matches_brute_force_on_tiny_workloads(seed: int) -> None:
    rng = random.Random(100 + seed)
    ops, edges = random_workload(rng, rng.randint(2, 3), max_layers=4)
    problem = problem_of(explicit_request(ops, edges, rng.choice([2, 3, 4])))
    ranges = device_ranges(problem)
    res = exact.solve(problem, ranges, time_limit_s=5.0, workers=1)
    assert res.status == "OPTIMAL"
    assert res.placements is not None
    slices = timeline(problem, res.placements)
    assert violations(problem, slices) == []
    got = max(s.end_s for s in slices)
    want = brute_force_makespan(problem)
    # the model rounds durations up to whole microseconds
    assert got == pytest.approx(want, abs=1e-6 * (1 + len(ops)))


def test_exact_never_worse_than_its_warm_start() -> None:
    rng = random.Random(7)
    ops, edges = random_workload(rng, 8)
    problem = problem_of(explicit_request(ops, edges, 8))
    ranges = device_ranges(problem)
    warm = planner.plan(problem, ranges).best
    res = exact.solve(problem, ranges, hint=warm.placements, time_limit_s=3.0, deterministic_time=1.0, workers=1)
    assert res.placements is not None and res.makespan_s is not None
    slices = timeline(problem, res.placements)
    assert violations(problem, slices) == []
    assert max(s.end_s for s in slices) <= warm.evaluation.makespan_s + 1e-6 * len(slices)


def test_width_options_drop_dominated_widths() -> None:
    # batch 4: widths 3 and 4 both run one sample per device... 3 gives ceil(4/3) = 2 samples, 4 gives 1
    ops = [{"name": "a", "batch_size": 4, "num_layers": 2, "time_ms_per_layer": {"slope_ms_per_sample": 1.0,
                                                                                 "intercept_ms": 0.1}}]
    problem = problem_of(explicit_request(ops, [], 8))
    r = device_ranges(problem)[0]
    assert r.hi == 4  # more devices than samples never help
    widths = exact.width_options(problem, exact.Segment(0, 2), r)
    assert widths == [1, 2, 4]  # 3 is no faster than 2
