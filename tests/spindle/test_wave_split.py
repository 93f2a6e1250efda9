"""Wave splitting: where metaops are far cheaper on the whole cluster than side by side, the wavefront runs
them in turn, and matches brute force on small cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from solvers.spindle.bounds import device_ranges
from solvers.spindle.layouts import Layout
from solvers.spindle.planner import plan
from solvers.spindle.schedule import Problem, timeline
from solvers.spindle.wavefront import ORDERS, allocate, plan_waves, split_wave
from solvers.spindle.workload import MetaOp
from solvers.strategy import LayerStrategy
from tests.spindle.helpers import brute_force_makespan, explicit_request, problem_of

DEVICES = 4


def _superlinear(op: MetaOp, factors: dict[int, float]) -> MetaOp:
    """``op`` with a layout table that scales its data-parallel time by ``factors[n]`` at width n (an MoE stack
    whose layout at one sample per device drops the expert all-to-all: cheaper per sample on more devices)."""
    table = tuple(Layout(LayerStrategy(dp=n), factors[n], 0.0, 0.0, 0.0) if n in factors else None
                  for n in range(1, DEVICES + 1))
    return replace(op, layouts=table)


def _problem(n_ops: int, factors: dict[int, float]) -> Problem:
    ops = [{"name": f"moe{i}", "task": f"t{i}", "batch_size": DEVICES, "num_layers": 2,
            "time_ms_per_layer": {"slope_ms_per_sample": 1.0, "intercept_ms": 0.0}} for i in range(n_ops)]
    problem = problem_of(explicit_request(ops, [], DEVICES, per_node=DEVICES))
    wl = problem.workload
    return replace(problem, workload=replace(wl, ops=tuple(_superlinear(op, factors) for op in wl.ops)))


# per layer: 4 ms on 1 device, 2 ms on 2, 2 ms on 3 (ceil(4/3) = 2 samples), 0.5 ms on all 4
SUPERLINEAR = {4: 0.5}


def test_split_runs_metaops_in_turn_where_side_by_side_costs_more() -> None:
    problem = _problem(3, SUPERLINEAR)
    wl = problem.workload
    ranges = device_ranges(problem)
    together = allocate(wl.ops, [2, 2, 2], ranges, DEVICES)[0]
    assert together == pytest.approx(6.0)  # 1.33 devices each: 1 and 2 devices in turn, 2 + 4 ms
    groups = split_wave(wl.ops, [2, 2, 2], ranges, DEVICES, "mix")
    assert groups == [[0], [1], [2]]  # one at a time on all four devices: 1 ms each, 3 ms in all


@pytest.mark.parametrize("n_ops", [2, 3])
def test_split_wavefront_matches_brute_force(n_ops: int) -> None:
    problem = _problem(n_ops, SUPERLINEAR)
    ranges = device_ranges(problem)
    best = brute_force_makespan(problem)
    assert best == pytest.approx(n_ops * 2 * 0.5e-3)
    for order in ORDERS.values():
        split = max(s.end_s for s in timeline(problem, plan_waves(problem, ranges, order, "mix", split={})))
        whole = max(s.end_s for s in timeline(problem, plan_waves(problem, ranges, order, "mix")))
        assert split == pytest.approx(best)
        assert whole > 1.5 * best  # the reference's side-by-side wave, for contrast
    assert plan(problem, ranges).best.evaluation.makespan_s == pytest.approx(best)


def test_split_keeps_a_convex_wave_whole() -> None:
    # plain data parallelism (time ~ batch / n): side by side is as good as in turn, the wave stays whole
    problem = _problem(3, {})
    wl = problem.workload
    assert split_wave(wl.ops, [2, 2, 2], device_ranges(problem), DEVICES, "mix") == [[0, 1, 2]]
