"""Validity properties of every planner's schedules on random DAG workloads."""

from __future__ import annotations

import random

import pytest

from solvers.spindle import baselines, planner
from solvers.spindle.bounds import device_ranges, lower_bound_s
from solvers.spindle.schedule import evaluate, violations
from tests.contract_json import solve_spindle as solve
from tests.spindle.helpers import explicit_request, problem_of, random_workload


@pytest.mark.parametrize("seed", range(30))
def test_every_planner_gives_a_valid_schedule_above_the_lower_bound(seed: int) -> None:
    rng = random.Random(seed)
    ops, edges = random_workload(rng, rng.randint(1, 9))
    gpus = rng.choice([1, 2, 3, 5, 8, 16])
    problem = problem_of(explicit_request(ops, edges, gpus, per_node=rng.choice([1, 2, 8])))
    ranges = device_ranges(problem)
    lb = lower_bound_s(problem, ranges)
    plans = [planner.plan(problem, ranges).best, *(p for p in baselines.all_baselines(problem, ranges).values() if p)]
    for p in plans:
        assert violations(problem, p.slices) == [], p.name
        assert p.evaluation.iteration_time_s >= lb * (1 - 1e-9), p.name
        for op_i, op in enumerate(problem.workload.ops):
            assert sum(s.layers for s in p.slices if s.op == op_i) == op.layers


def test_violations_catch_broken_schedules() -> None:
    ops, edges = random_workload(random.Random(3), 4)
    edges = [["m0", "m1"]]
    problem = problem_of(explicit_request(ops, edges, 4))
    good = planner.plan(problem, device_ranges(problem)).best.slices
    assert violations(problem, good) == []
    from dataclasses import replace

    # same device at the same time
    a, b = good[0], replace(good[0], op=next(s.op for s in good if s.op != good[0].op))
    assert any("double-booked" in v for v in violations(problem, [*good, b]))
    # a metaop missing layers
    assert any("layers scheduled" in v for v in violations(problem, [s for s in good if s is not a]))
    # successor before its predecessor
    first_m1 = next(s for s in good if s.op == 1)
    moved = replace(first_m1, start_s=-10.0, end_s=-10.0 + (first_m1.end_s - first_m1.start_s), lo=0, n=first_m1.n)
    shifted = [moved if s is first_m1 else s for s in good]
    assert any("edge m0 -> m1" in v for v in violations(problem, shifted))


@pytest.mark.parametrize("preset", ["clip-imagebind", "qwen-vl", "seedance", "omni", "unigrpo"])
def test_preset_plans_fit_memory_and_beat_baselines(preset: str) -> None:
    req = {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
           "workload": {"preset": preset}, "options": {"exact": False}}
    out = solve(req)
    problem = problem_of(req)
    assert out["estimate"]["fits"] and out["estimate"]["peak_memory_gib"] <= 80.0
    assert max(out["estimate"]["memory_gib_per_device"]) <= 80.0
    assert out["estimate"]["iteration_time_s"] >= out["lower_bound_s"]
    best_base = min(v for v in out["baselines"].values() if v is not None)
    assert out["estimate"]["iteration_time_s"] <= best_base + 1e-12
    assert out["search"]["wavefront_s"] < 1.0
    # the returned slices are a valid schedule of the workload
    index = problem.workload.index
    from solvers.spindle.schedule import Slice

    slices = [Slice(index[s["metaop"]], s["layer_start"], s["layers"], s["devices"][0], len(s["devices"]),
                    s["start_s"], s["end_s"]) for s in out["slices"]]
    assert violations(problem, slices) == []
    assert evaluate(problem, slices).fits


def test_memory_limit_too_small_is_reported_on_the_field() -> None:
    from solvers.errors import InfeasibleError

    req = {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
           "constraints": {"memory_limit_gib": 4}, "workload": {"preset": "qwen-vl"}, "options": {"exact": False}}
    with pytest.raises(InfeasibleError) as err:
        solve(req)
    assert err.value.problems[0].loc[0] in ("workload", "constraints")


@pytest.mark.parametrize("seed", range(6))
def test_module_workloads_respect_memory_or_are_rejected(seed: int) -> None:
    """With module shapes the returned plan fits every device, or the request is refused naming the field."""
    from solvers.errors import InfeasibleError

    rng = random.Random(500 + seed)
    shapes = [{"name": f"enc{k}", "num_layers": rng.choice([4, 8, 12]), "hidden_size": rng.choice([512, 1024, 2048]),
               "num_attention_heads": 8, "seq_length": rng.choice([128, 512, 1024])} for k in range(3)]
    ops = [{"name": f"m{i}", "task": f"t{i % 2}", "batch_size": rng.choice([16, 64, 128]),
            "module": rng.choice(shapes), "recompute": rng.random() < 0.5} for i in range(rng.randint(2, 5))]
    edges = [[f"m{i}", f"m{j}"] for i in range(len(ops)) for j in range(i + 1, len(ops)) if rng.random() < 0.3]
    limit = rng.choice([3, 6, 12, 40])
    req = {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
           "constraints": {"memory_limit_gib": limit}, "workload": {"metaops": ops, "edges": edges},
           "options": {"exact": False, "polish_time_s": 0.05}}
    try:
        out = solve(req)
    except InfeasibleError as err:
        assert err.problems and err.problems[0].loc[0] in ("workload", "constraints")
        return
    assert out["estimate"]["fits"]
    assert max(out["estimate"]["memory_gib_per_device"]) <= limit + 1e-9
    assert out["estimate"]["iteration_time_s"] >= out["lower_bound_s"] * (1 - 1e-9)


def test_a_memory_limit_above_the_gpus_memory_is_capped_and_named() -> None:
    """120 GiB asked of A100-80GB (79.15 GiB): the schedule is judged against the memory the GPU has, the same as
    without a limit, and the result names the constraint it could not honour."""
    req = {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
           "workload": {"preset": "qwen-vl"}, "options": {"exact": False}}
    asked, plain = solve({**req, "constraints": {"memory_limit_gib": 120}}), solve(req)
    assert asked["estimate"]["memory_limit_gib"] == plain["estimate"]["memory_limit_gib"] < 80
    assert asked["estimate"]["iteration_time_s"] == plain["estimate"]["iteration_time_s"]
    assert any("memory_limit_gib = 120 GiB is more than the A100-80GB's" in n for n in asked["notes"])
    assert plain["notes"] == []
