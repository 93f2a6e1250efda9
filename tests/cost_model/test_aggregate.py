"""evaluate(plan) is exactly the aggregation of the per-layer arrays (the planner's exactness relies on it),
and the vectorised layer_costs agrees with one-candidate calls."""

from __future__ import annotations

import time

import numpy as np
import pytest

from solvers.cost_model.aggregate import stage_context, stage_memory_bytes
from solvers.cost_model.factory import make_cost_model, plan_from_shorthand
from solvers.request import HybridRequest, parse
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy

from .conftest import request

CANDIDATES = [
    LayerStrategy(tp=tp, dp=8 // (tp * cp), cp=cp, sp=sp, zero=z, recompute=rc)
    for tp in (1, 2, 4, 8) for cp in (1, 2) if tp * cp <= 8
    for sp in (None, "megatron", "ulysses") for z in (0, 1, 2, 3) for rc in ("none", "selective", "full")
]


def _req(**kw: object) -> HybridRequest:
    return parse(HybridRequest, request(model={"preset": "llama2-7b", "num_layers": 6}, **kw))


def test_vectorised_layer_costs_equal_single_candidate_calls() -> None:
    model = make_cost_model(_req())
    ctx = stage_context(PlanStrategy(pp=2, micro_batches=8, layers=(LayerStrategy(),) * 6, stage_layers=(3, 3)),
                        0, 64)
    many = model.layer_costs(1, CANDIDATES, ctx)
    for i in range(0, len(CANDIDATES), 7):
        one = model.layer_costs(1, [CANDIDATES[i]], ctx)
        for field in ("time_s", "step_time_s", "state_bytes", "activation_bytes", "peak_extra_bytes"):
            assert getattr(one, field)[0] == pytest.approx(getattr(many, field)[i], rel=1e-12), (field, CANDIDATES[i])
        assert sum(v[0] for v in one.parts_s.values()) == pytest.approx(one.time_s[0], rel=1e-12)
        assert sum(v[0] for v in one.step_parts_s.values()) == pytest.approx(one.step_time_s[0], rel=1e-12)


def test_evaluate_equals_manual_aggregation_of_a_mixed_plan() -> None:
    req = _req()
    model = make_cost_model(req)
    layers = (
        LayerStrategy(tp=2, dp=4, zero=1), LayerStrategy(tp=4, dp=2, sp="megatron", recompute="selective"),
        LayerStrategy(tp=1, dp=8, zero=3, recompute="full"),
        LayerStrategy(tp=2, dp=2, cp=2, sp="megatron"), LayerStrategy(tp=2, dp=4, sp="ulysses", zero=2),
        LayerStrategy(tp=8, dp=1, sp="megatron"),
    )
    plan = PlanStrategy(pp=2, micro_batches=8, layers=layers, stage_layers=(2, 4), schedule="1f1b",
                        embedding=EmbeddingStrategy(tp=2, dp=4, zero=1))
    est = model.evaluate(plan)

    stage_t, stage_step, mem = [], [], []
    for s, (lo, hi) in enumerate([(0, 2), (2, 6)]):
        ctx = stage_context(plan, s, 64)
        costs = [model.layer_costs(i, [layers[i]], ctx) for i in range(lo, hi)]
        fixed = model.stage_fixed(ctx)
        t = sum(c.time_s[0] for c in costs) + fixed.time_s
        t += sum(model.transition_s([layers[i - 1]], [layers[i]], ctx)[0, 0] for i in range(lo + 1, hi))
        stage_t.append(t)
        stage_step.append(sum(c.step_time_s[0] for c in costs) + fixed.step_time_s)
        mem.append(stage_memory_bytes(
            sum(c.state_bytes[0] for c in costs) + fixed.state_bytes,
            sum(c.activation_bytes[0] for c in costs) + fixed.activation_bytes,
            model.in_flight_micro_batches(ctx),
            max(c.peak_extra_bytes[0] for c in costs),
            fixed.other_bytes))
    step = model.pipeline_step_time(stage_t, stage_step, stage_context(plan, 0, 64))
    assert est.step_time_s == pytest.approx(step, rel=1e-12)
    assert est.stage_time_s == pytest.approx(stage_t, rel=1e-12)
    assert [g * 2**30 for g in est.memory_gib_per_stage] == pytest.approx(mem, rel=1e-12)
    assert sum(est.breakdown_s.values()) == pytest.approx(est.step_time_s, rel=1e-9)
    for parts, total in zip(est.memory_breakdown_gib_per_stage, est.memory_gib_per_stage, strict=True):
        assert sum(parts.values()) == pytest.approx(total, rel=1e-9)
    assert est.throughput_samples_per_s == pytest.approx(64 / step)
    # re-layouts between differently split layers cost time; identical layouts cost none
    assert model.transition_s([layers[0]], [layers[1]], stage_context(plan, 0, 64))[0, 0] > 0
    assert model.transition_s([layers[0]], [layers[0]], stage_context(plan, 0, 64))[0, 0] == 0


@pytest.mark.parametrize("attention", ["unfused", "fused"])
def test_estimate_moves_the_right_way(attention: str) -> None:
    req = _req(training={"global_batch_size": 64, "seq_length": 2048, "stack": {"attention": attention}})
    model = make_cost_model(req)

    def est(**kw: object) -> float:
        d = {"tp": 2, "pp": 1, "micro_batch_size": 1, **kw}
        return model.evaluate(plan_from_shorthand(d, req.model, req.cluster, req.training)).step_time_s

    def peak(**kw: object) -> float:
        d = {"tp": 2, "pp": 1, "micro_batch_size": 1, **kw}
        return model.evaluate(plan_from_shorthand(d, req.model, req.cluster, req.training)).peak_memory_gib

    assert est(recompute="full") > est(recompute="selective") > est(recompute="none")
    if attention == "unfused":  # selective recomputation drops the s² attention scores
        assert peak(recompute="full") < peak(recompute="selective") < peak(recompute="none")
    else:  # fused kernels keep no scores: selective recomputation saves nothing
        assert peak(recompute="full") < peak(recompute="selective") == peak(recompute="none")
    assert peak(zero=3) < peak(zero=2) < peak(zero=1) < peak(zero=0)
    # TP across the two nodes is slower than inside one
    assert est(tp=16, micro_batch_size=1) > est(tp=8, micro_batch_size=1)


def test_layer_costs_is_fast_for_planner_sized_batches() -> None:
    model = make_cost_model(_req())
    ctxs = [stage_context(PlanStrategy(pp=1, micro_batches=m, layers=(LayerStrategy(),) * 6, stage_layers=(6,)),
                          0, 64) for m in (1, 2, 4, 8, 16, 32)]
    model.layer_costs(0, CANDIDATES, ctxs[0])
    t0 = time.perf_counter()
    for ctx in ctxs:
        for layer in range(6):
            c = model.layer_costs(layer, CANDIDATES, ctx)
    elapsed = time.perf_counter() - t0
    assert np.all(np.isfinite(c.time_s)) and np.all(c.time_s > 0)
    assert elapsed < 0.5, f"{len(CANDIDATES)} candidates x 36 calls took {elapsed:.3f} s"
