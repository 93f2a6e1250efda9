"""The CP-SAT model against brute force on tiny workloads, and against its warm start on real ones."""

from __future__ import annotations

import random

import pytest

from solvers import api as solvers_api
from solvers.documents import SpindleResult
from solvers.spindle import exact, planner
from solvers.spindle.bounds import device_ranges
from solvers.spindle.schedule import timeline, violations
from solvers.spindle.summary import exact_line, summarise
from tests.service.requests import slow_spindle
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


def _stopped_early_request(budget: float) -> dict[str, object]:
    """Twelve explicit metaops on 8 devices whose CP-SAT search improves on its warm start but stops on a
    deterministic budget of 0.01 before its proof, and proves the optimum with 0.02 (found by trying seeds;
    the wall clock is a generous safety net)."""
    rng = random.Random(2)
    ops, edges = random_workload(rng, 12)
    return explicit_request(ops, edges, 8, exact=True, exact_time_limit_s=60.0, exact_deterministic_time=budget)


def test_exact_mode_is_reproducible_and_reports_its_gap() -> None:
    request = _stopped_early_request(0.01)
    runs = [solvers_api.solve(request) for _ in range(2)]
    assert isinstance(runs[0], SpindleResult) and isinstance(runs[1], SpindleResult)
    first, second = ({"slices": [s.model_dump() for s in r.slices], "estimate": r.estimate.model_dump(),
                      "exact": r.search.exact.model_dump(exclude={"wall_s"}) if r.search.exact else None}
                     for r in runs)
    assert first == second
    ex = runs[0].search.exact
    assert ex is not None and runs[0].search.reproducible
    # stopped by the budget, not the clock, with a real gap left: objective >= bound, gap their difference
    assert (ex.status, ex.stopped_by, ex.workers) == ("FEASIBLE", "deterministic_limit", 1)
    assert ex.deterministic_time >= ex.deterministic_time_limit == 0.01
    assert ex.model_makespan_s is not None and ex.model_bound_s is not None and ex.model_gap is not None
    assert ex.model_makespan_s >= ex.model_bound_s > 0
    assert ex.model_gap == pytest.approx((ex.model_makespan_s - ex.model_bound_s) / ex.model_makespan_s)
    assert 0 < ex.model_gap < 1
    line = exact_line(ex)
    assert "stopped at its deterministic budget" in line and f"gap {100 * ex.model_gap:.2f}%" in line
    assert line in summarise(request, runs[0])
    # a larger budget proves the optimum: it lies between the stopped run's bound and its solution
    proved = solvers_api.solve(_stopped_early_request(0.02))
    assert isinstance(proved, SpindleResult) and proved.search.exact is not None
    opt = proved.search.exact
    assert (opt.status, opt.stopped_by, opt.model_gap) == ("OPTIMAL", "solved", 0.0)
    assert opt.model_makespan_s is not None
    assert ex.model_bound_s - 1e-9 <= opt.model_makespan_s <= ex.model_makespan_s + 1e-9


def test_the_default_budget_stands_for_the_requests_time_limit() -> None:
    rng = random.Random(0)
    ops, edges = random_workload(rng, 10)
    result = solvers_api.solve(explicit_request(ops, edges, 8, exact=True, exact_time_limit_s=60.0))
    assert isinstance(result, SpindleResult) and result.search.exact is not None
    ex = result.search.exact
    assert ex.deterministic_time_limit == pytest.approx(exact.deterministic_budget(60.0))
    assert (ex.status, ex.stopped_by, ex.model_gap) == ("OPTIMAL", "solved", 0.0)


def test_a_search_ended_by_the_wall_clock_says_it_is_not_reproducible() -> None:
    # a deterministic budget far beyond what the wall-clock limit allows: the clock ends the search
    request = slow_spindle(0.3)
    result = solvers_api.solve(request)
    assert isinstance(result, SpindleResult) and result.search.exact is not None
    assert result.search.exact.stopped_by == "wall_clock"
    assert not result.search.reproducible
    assert "not reproducible" in "\n".join(summarise(request, result))
