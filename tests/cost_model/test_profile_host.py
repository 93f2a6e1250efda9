"""Profile terms for a host whose ranks share cores and for FSDP2's wrapper overhead: the host-bound step
against a processor-sharing simulation of the pipeline, the overhead on exactly the layouts FSDP2 runs."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.cost_model.aggregate import stage_context
from solvers.cost_model.factory import make_cost_model
from solvers.cost_model.pipeline import step_time_s
from solvers.cost_model.profile import HostContention, Profile
from solvers.request import HybridRequest, parse
from solvers.strategy import LayerStrategy, PlanStrategy

from .conftest import request


def simulate_gpipe(pp: int, micro_batches: int, work_s: float, ranks: int, cores: float) -> float:
    """Forward-only GPipe on a node of ``ranks`` ranks sharing ``cores`` cores (processor sharing, a rank uses at
    most one core), ranks / pp identical pipelines in lockstep: stage i may start micro-batch j once stage i-1
    finished it and stage i finished j-1. ``work_s`` is a stage's time per micro-batch on a core of its own.
    Event-driven, exact."""
    per_stage = ranks // pp
    remaining: dict[int, float] = {0: work_s}  # busy stage -> work left on its current micro-batch
    done = [0] * pp
    now = 0.0
    while remaining:
        rate = min(1.0, cores / (per_stage * len(remaining)))
        stage, left = min(remaining.items(), key=lambda kv: kv[1])
        dt = left / rate
        now += dt
        for s in remaining:
            remaining[s] -= dt * rate
        del remaining[stage]
        done[stage] += 1
        for s in range(pp):
            if done[s] < micro_batches and s not in remaining and (s == 0 or done[s - 1] > done[s]):
                remaining[s] = work_s
    return now


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (2, 8), (4, 4), (4, 8), (4, 16)])
def test_host_bound_step_matches_a_processor_sharing_pipeline(pp: int, m: int) -> None:
    ranks, cores = 4, 2.0
    slowdown = ranks / cores
    unloaded = 0.01
    contended = unloaded * slowdown  # what the profiler measures with every rank busy
    prof = Profile(host=HostContention(busy_ranks=ranks, slowdown=slowdown))
    naive = step_time_s([contended] * pp, [0.0] * pp, m, 1, "gpipe")
    got = prof.host_bound_step_s(naive, [contended] * pp, [0.0] * pp, m)
    truth = simulate_gpipe(pp, m, unloaded, ranks, cores)
    assert got <= naive
    assert got == pytest.approx(truth, rel=0.15)
    assert naive > 1.1 * truth  # the contended formula charges the bubble at contended speed


def test_host_bound_step_leaves_unpipelined_and_uncontended_steps_alone() -> None:
    busy = Profile(host=HostContention(busy_ranks=4, slowdown=2.0))
    assert busy.host_bound_step_s(1.3, [0.3], [0.1], 4) == pytest.approx(1.3)  # pp = 1: no rank ever idles
    alone = Profile(host=HostContention(busy_ranks=4, slowdown=1.0))
    naive = step_time_s([0.1] * 4, [0.0] * 4, 4, 1, "gpipe")
    assert alone.host_bound_step_s(naive, [0.1] * 4, [0.0] * 4, 4) == pytest.approx(naive)
    assert Profile().host_bound_step_s(naive, [0.1] * 4, [0.0] * 4, 4) == pytest.approx(naive)


def test_fsdp_overhead_lands_on_the_layouts_the_runtime_shards_with_fsdp() -> None:
    profile = {"overheads": [{"parallelism": "fsdp", "reshard": True, "forward_ms": 3.0, "backward_ms": 5.0},
                             {"parallelism": "fsdp", "reshard": False, "forward_ms": 1.0, "backward_ms": 2.0}]}
    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})
    plain = make_cost_model(parse(HybridRequest, base))
    prof = make_cost_model(parse(HybridRequest, {**base, "cost_model": {"kind": "profile", "profile": profile}}))
    # ZeRO-2/3 over two or more data-parallel ranks (dp x cp, x tp under Ulysses) is FSDP2; ZeRO-0/1 never is
    cands = [LayerStrategy(dp=8, zero=3), LayerStrategy(dp=8, zero=2), LayerStrategy(dp=8, zero=0),
             LayerStrategy(tp=2, dp=4, zero=0), LayerStrategy(tp=8, dp=1, zero=3), LayerStrategy(dp=8, zero=1),
             LayerStrategy(tp=2, dp=4, zero=2), LayerStrategy(cp=8, dp=1, zero=3),
             LayerStrategy(tp=4, sp="ulysses", dp=2, zero=2), LayerStrategy(tp=8, sp="ulysses", dp=1, zero=3)]
    # ZeRO-3 re-gathers every micro-batch; without resharding FSDP2 gathers and reduce-scatters once a step
    per_mb = [8e-3, 0, 0, 0, 0, 0, 0, 8e-3, 0, 8e-3]
    per_step = [0, 3e-3, 0, 0, 0, 0, 3e-3, 0, 3e-3, 0]
    for pp in (1, 2):
        layers = (LayerStrategy(),) * 4
        plan = PlanStrategy(pp=pp, micro_batches=8, layers=layers, stage_layers=(4 // pp,) * pp)
        ctx = stage_context(plan, 0, 64)
        got, ref = prof.layer_costs(0, cands, ctx), plain.layer_costs(0, cands, ctx)
        np.testing.assert_allclose(got.parts_s["launch_overhead"] - ref.parts_s["launch_overhead"], per_mb, atol=1e-12)
        np.testing.assert_allclose(got.step_time_s - ref.step_time_s, per_step, atol=1e-12)


def test_megatron_sp_candidates_use_sp_layer_times_and_fall_back_on_plain_tp() -> None:
    plain_tp = {"batch": 2, "seq": 128, "tp": 2, "forward_ms": 10.0, "backward_ms": 20.0}
    with_sp = Profile.model_validate(
        {"layer_times": [plain_tp, {**plain_tp, "sp": True, "forward_ms": 14.0, "backward_ms": 30.0}]})
    only_tp = Profile.model_validate({"layer_times": [plain_tp]})
    sp = np.array([False, True, True])
    tp = np.array([2.0, 2.0, 1.0])
    np.testing.assert_allclose(with_sp.layer_s(np.array(4.0), 128, tp, sp=sp)[:2], [0.020, 0.028])
    np.testing.assert_allclose(with_sp.layer_s(np.array(4.0), 128, tp, backward=True, sp=sp)[:2], [0.040, 0.060])
    np.testing.assert_allclose(only_tp.layer_s(np.array(4.0), 128, tp, sp=sp)[:2], [0.020, 0.020])
    assert np.isnan(with_sp.layer_s(np.array(4.0), 128, tp, sp=sp)[2])  # tp=1 not profiled here


def test_a_host_bound_pipeline_is_cheaper_and_its_breakdown_still_sums_to_the_step() -> None:
    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 4})
    layers = (LayerStrategy(),) * 4
    plan = PlanStrategy(pp=4, micro_batches=4, schedule="gpipe", layers=layers, stage_layers=(1,) * 4)
    host = {"busy_ranks": 4, "slowdown": 2.0}
    free = make_cost_model(parse(HybridRequest, {**base, "cost_model": {"kind": "profile", "profile": {}}}))
    shared = make_cost_model(parse(HybridRequest, {**base, "cost_model": {"kind": "profile",
                                                                          "profile": {"host": host}}}))
    a, b = free.evaluate(plan), shared.evaluate(plan)
    assert b.step_time_s < a.step_time_s  # the 3 bubble slots of 7 run on freed cores
    assert sum(b.breakdown_s.values()) == pytest.approx(b.step_time_s)
    assert sum(a.breakdown_s.values()) == pytest.approx(a.step_time_s)


def test_only_host_contention_makes_a_profiled_pipeline_non_linear() -> None:
    """Any profile, even an empty one, marked the pipeline non-linear: the planner lost its bounds and the
    certificate solved every configuration (no lower bound, 7 s instead of 0.1 s on 16 GPUs), for the same plan."""
    from tests.contract_json import solve_hybrid as solve

    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})
    for profile, linear in (({}, True), ({"layer_times": [{"batch": 1, "seq": 2048, "forward_ms": 9.0}]}, True),
                            ({"host": {"busy_ranks": 8, "slowdown": 1.0}}, True),
                            ({"host": {"busy_ranks": 8, "slowdown": 2.0}}, False)):
        cm = make_cost_model(parse(HybridRequest, {**base, "cost_model": {"kind": "profile", "profile": profile}}))
        assert cm.linear_pipeline is linear, profile
    out = solve({**base, "cost_model": {"kind": "profile", "profile": {}}})
    assert out["search"]["lower_bound_step_time_s"] is not None
    assert out["estimate"]["step_time_s"] == pytest.approx(solve(base)["estimate"]["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("slowdown", [1.5, 2.0, 4.0])
def test_host_step_lower_bound_never_exceeds_the_step_of_larger_inputs(slowdown: float) -> None:
    """Bounds on the linear step and on the stages' mean work give a bound on the contended step: the step
    of any pipeline whose linear step and mean work are at least those bounds is never below it."""
    prof = Profile(host=HostContention(busy_ranks=4, slowdown=slowdown))
    rng = np.random.default_rng(7)
    for _ in range(300):
        pp, m = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        t, u = rng.uniform(0.01, 0.1, pp), rng.uniform(0.0, 0.05, pp)
        linear = step_time_s(list(t), list(u), m, 1, "1f1b")
        step = prof.host_bound_step_s(linear, list(t), list(u), m)
        work = float(np.mean(m * t + u))
        for shrink in (1.0, 0.9, 0.5):
            assert prof.host_step_lower_bound(linear * shrink, work * shrink) <= step * (1 + 1e-12)
        assert prof.host_step_lower_bound(linear, work) == pytest.approx(step)  # tight at the inputs themselves
    assert Profile().host_step_lower_bound(2.0, 1.0) == 2.0  # no contention: the linear bound itself


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_contended_host_keeps_the_planners_bounds(nodes: int) -> None:
    """With host contention the planner's linear bounds, lifted through the host bound, still hold: the plan
    comes with an optimality certificate (it had none, and the certificate solved every configuration the
    search had pruned: 37 and 72 of them here, 1.2 and 2.4 s instead of 0.1 s)."""
    from tests.contract_json import solve_hybrid as solve

    base = request(cluster={"gpu": "A100-80GB", "nodes": nodes, "gpus_per_node": 8})
    host = {**base, "cost_model": {"kind": "profile", "profile": {"host": {"busy_ranks": 8, "slowdown": 2.0}}}}
    out = solve(host)["search"]
    assert out["lower_bound_step_time_s"] is not None
    assert 0.0 <= out["optimality_gap"] < 0.01
    assert out["configs_solved_by_certificate"] == 0


def test_ring_attention_candidates_use_cp_layer_times_with_their_exchanges() -> None:
    """A cp layer measured as the runtime runs it (ring attention, ``cp`` in the profile) is priced from that
    measurement at its own batch, its ring exchanges inside it (no analytic cp_comm on top); a cp degree not
    measured falls back on the tp = 1 layer at b / cp samples plus the analytic ring."""
    plain = [{"batch": b, "seq": 2048, "tp": 1, "forward_ms": 10.0 * b, "backward_ms": 20.0 * b} for b in (1, 2, 4)]
    ring = [{"batch": b, "seq": 2048, "tp": 1, "cp": 2, "forward_ms": 7.0 * b, "backward_ms": 15.0 * b}
            for b in (1, 2)]
    prof = Profile.model_validate({"layer_times": plain + ring})
    cp = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(prof.layer_s(np.array(2.0), 2048, np.ones(3), cp=cp)[:2], [0.020, 0.014])
    assert np.isnan(prof.layer_s(np.array(2.0), 2048, np.ones(3), cp=cp)[2])

    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
                   training={"global_batch_size": 16, "seq_length": 2048})
    cm = make_cost_model(parse(HybridRequest, {**base, "cost_model": {
        "kind": "profile", "profile": {"layer_times": plain + ring}}}))
    cands = [LayerStrategy(cp=2, dp=4), LayerStrategy(cp=4, dp=2), LayerStrategy(dp=8)]
    plan = PlanStrategy(pp=1, micro_batches=2, layers=(LayerStrategy(dp=8),) * 4, stage_layers=(4,))
    got = cm.layer_costs(0, cands, stage_context(plan, 0, 16))  # 8 samples a micro-batch
    # cp 2 x dp 4: 2 samples of 1024 tokens per rank, measured: 2 x (7 + 15) ms, nothing more for the ring
    # cp 4 x dp 2: unmeasured, the tp = 1 layer at 4 / 4 = 1 sample (30 ms) plus the ring's K/V exchanges
    np.testing.assert_allclose(got.parts_s["compute"], [0.044, 0.030, 0.030])
    assert got.parts_s["cp_comm"][0] == 0.0 and got.parts_s["cp_comm"][1] > 0.0 and got.parts_s["cp_comm"][2] == 0.0


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_gpipe_and_1f1b_steps_follow_the_shared_core_simulation(schedule: str) -> None:
    """pp = 2, m = 2, stages of 3 s (forward 1, backward 2), a rank alone 1.5x faster than with both busy. Worked
    by hand for both schedules: 0.67 (stage 0's first forward alone), 1.67 (both forward), ..., 7.0 s, which is
    above the average work (6 s) the old bound charged, and below the contended linear step (9 s)."""
    prof = Profile(host=HostContention(busy_ranks=2, slowdown=1.5))
    linear = step_time_s([3.0, 3.0], [0.0, 0.0], 2, 1, schedule)  # type: ignore[arg-type]
    assert linear == pytest.approx(9.0)
    assert prof.host_bound_step_s(linear, [3.0, 3.0], [0.0, 0.0], 2, schedule) == pytest.approx(7.0)  # type: ignore[arg-type]
    assert prof.host_bound_step_s(linear, [3.0, 3.0], [0.5, 0.25], 2, schedule) == pytest.approx(7.5)  # type: ignore[arg-type]
    # no schedule (e.g. interleaved): the bound min(L, max(L / slowdown, mean work))
    assert prof.host_bound_step_s(linear, [3.0, 3.0], [0.0, 0.0], 2) == pytest.approx(6.0)
