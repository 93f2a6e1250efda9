"""Sizing's shared work: the floor that prunes clusters is a true lower bound of every plan, and planning the sizes
in parallel processes gives the front planning them one by one gives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from solvers.errors import SpecError
from solvers.hybrid import sizing
from solvers.hybrid.api import build_space, quick_plan, solve, space_mode
from solvers.hybrid.stage_costs import stage_context
from solvers.request import HybridRequest, parse

DENSE: dict[str, Any] = {"kind": "hybrid", "model": {"preset": "llama2-7b", "num_layers": 8},
         "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 4},
         "training": {"global_batch_size": 48, "seq_length": 2048}}
MOE: dict[str, Any] = {"kind": "hybrid", "model": {"preset": "mixtral-8x7b", "num_layers": 4},
       "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
       "training": {"global_batch_size": 32, "seq_length": 2048}}


@pytest.mark.parametrize(("base", "gpu", "nodes"), [
    (DENSE, "H100-SXM", 1), (DENSE, "A100-80GB", 2), (DENSE, "B200", 3), (DENSE, "L40S", 2),
    (MOE, "H100-SXM", 1), (MOE, "H200", 2),
])
def test_the_floor_is_below_the_plan_and_its_every_strategy(base: dict[str, Any], gpu: str, nodes: int) -> None:
    """The floor (matrix multiplies at the GEMM curve's best, spread over every GPU) never exceeds the planner's
    plan, nor the baselines' uniform plans; for a dense model it is not vacuous: within 3x of the plan (an MoE
    model's floor leaves its experts out)."""
    request = {**base, "cluster": {**base["cluster"], "gpu": gpu, "nodes": nodes}}
    floor = sizing.step_floor_s(request)
    plan_s = quick_plan(request)[1].step_time_s
    assert 0 < floor <= plan_s
    assert base is MOE or plan_s < 3 * floor
    for name, b in solve(request).baselines.items():
        if b is not None and b.estimate is not None:
            assert floor <= b.estimate.step_time_s, name


def test_parallel_sizing_gives_the_serial_front_and_prunes_only_beaten_clusters() -> None:
    # (prices at which some clusters are pruned by their floor: at 2.5 an H100 hour, since the H100's GEMMs are
    # priced at its measured matmul share, every cluster off the front was beaten in its search instead)
    request: dict[str, Any] = {**DENSE, "sizing": {"tokens": 2e10, "nodes": [1, 2, 3],
                                   "price_per_gpu_hour": {"A100-80GB": 1.2, "H100-SXM": 2.2, "L40S": 1.0}}}
    req: HybridRequest = parse(HybridRequest, request)
    serial, doc1 = sizing.front(req, request, quick_plan, workers=1)
    parallel, doc2 = sizing.front(req, request, quick_plan, workers=2)
    assert (doc1.workers, doc2.workers) == (1, 2)
    assert [p.model_dump() for p in serial] == [p.model_dump() for p in parallel]
    # (which clusters are pruned or beaten in their search depends on which plans were finished before them)
    assert doc1.clusters_pruned > 0 and doc2.clusters_pruned + doc2.clusters_beaten_in_search > 0
    # every cluster off the front (pruned, beaten in its search or planned): its own plan is beaten on both time
    # and cost by a front point
    planned = {(p.cluster["gpu"], p.cluster["nodes"]) for p in serial}
    per_step = 2e10 / (48 * 2048) / 86_400
    for gpu, price in request["sizing"]["price_per_gpu_hour"].items():
        for nodes in request["sizing"]["nodes"]:
            if (gpu, nodes) in planned:
                continue
            alone = {**DENSE, "cluster": {**DENSE["cluster"], "gpu": gpu, "nodes": nodes}}
            try:
                days = per_step * quick_plan(alone)[1].step_time_s
            except SpecError:  # nothing fits: on no front
                continue
            cost = days * 24 * nodes * 4 * price
            assert any(p.days <= days and p.cost <= cost for p in serial), (gpu, nodes)


@pytest.mark.parametrize("base", [DENSE, MOE])
def test_a_threshold_prunes_the_search_but_never_changes_the_plan_below_it(base: dict[str, Any]) -> None:
    """``quick_plan`` with a step time to beat: just above its own plan's step, the same plan (and estimate); just
    below it, None (a plan fits, none beats it); on a cluster where nothing fits, the infeasibility still."""
    request = {**base, "cluster": {**base["cluster"], "nodes": 2}}
    got = quick_plan(request)
    assert got is not None
    plan, est = got
    again = quick_plan(request, est.step_time_s * 1.001)
    assert again is not None and again[0] == plan and again[1].step_time_s == est.step_time_s
    assert quick_plan(request, est.step_time_s * 0.999) is None
    tiny = {**request, "constraints": {"memory_limit_gib": 1.0}}
    with pytest.raises(SpecError):
        quick_plan(tiny, est.step_time_s)


def test_a_sizing_request_reports_each_cluster_settled_in_rising_fractions() -> None:
    """Sizing is most of such a request's time: the progress rises to 1 with one report per cluster tried, after
    the request's own plan has reported up to its share."""
    request: dict[str, Any] = {**DENSE, "sizing": {"tokens": 2e10, "nodes": [1, 2],
                                   "price_per_gpu_hour": {"A100-80GB": 1.2, "H100-SXM": 2.5}}}
    seen: list[tuple[float, str]] = []
    result = solve(request, progress=lambda f, msg: seen.append((f, msg)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    sized = [msg for _, msg in seen if msg.startswith("sizing: ")]
    assert len(sized) == 4 and sized[-1].startswith("sizing: 4/4 clusters settled")
    assert result.sizing is not None and result.sizing.clusters_tried == 4


@pytest.mark.parametrize("base", [DENSE, MOE])
def test_sizes_share_a_cost_models_answers_and_plan_as_they_would_alone(base: dict[str, Any]) -> None:
    """Cost models that differ in node count only share their layer and stage answers within a process (a sizing
    front's reuse across sizes); a plan is the same whether other sizes were planned before it or not. Another GPU
    type, or a profile, gets answers of its own."""
    from solvers.cost_model import analytic
    from solvers.cost_model.factory import make_cost_model
    from solvers.hybrid import space

    def at(nodes: int, gpu: str = "H100-SXM") -> dict[str, Any]:
        return {**base, "cluster": {**base["cluster"], "gpu": gpu, "nodes": nodes}}

    def model_of(request: dict[str, Any]) -> Any:
        return make_cost_model(parse(HybridRequest, request))

    assert model_of(at(2))._answers is model_of(at(3))._answers
    assert model_of(at(2))._answers is not model_of(at(2, "A100-80GB"))._answers
    # every answer a shared model gives, after the other sizes asked theirs, is the one a model of its own gives
    sizes = (1, 2, 3, 4)
    shared = {n: model_of(at(n)) for n in sizes}
    asked = []
    for n in sizes:
        req = parse(HybridRequest, at(n))
        sp = build_space(req, space_mode(req))
        for cfg in sp.pipeline_configs()[::3]:
            cands = sp.layer_candidates(sp.num_gpus // cfg.pp, sp.global_batch_size // cfg.micro_batches)
            for stage in sorted({0, cfg.pp // 2, cfg.pp - 1}):
                ctx = stage_context(cfg, stage, sp.global_batch_size)
                asked.append((n, ctx, cands, shared[n].stage_fixed(ctx), shared[n].layer_costs(0, cands, ctx)))
    assert len({(n, ctx.pp, ctx.micro_batch_samples) for n, ctx, *_ in asked}) > 20
    for n, ctx, cands, fixed, layer in asked:
        own = model_of(at(n))
        own._answers = analytic._Answers()
        assert own.stage_fixed(ctx) == fixed, (n, ctx)
        mine = own.layer_costs(0, cands, ctx)
        for name in ("time_s", "step_time_s", "state_bytes", "activation_bytes", "peak_extra_bytes"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(layer, name))
    analytic._SHARED.clear()
    space._CANDIDATES.clear()
    alone = quick_plan(at(2))
    for nodes in (4, 3, 1):  # other sizes first, sharing what they computed
        quick_plan(at(nodes))
    assert len(analytic._SHARED) == 1
    # sizes ask about one stage with one candidate tuple (the model knows it by identity, without hashing it),
    # the candidates of a request without max_tp included, whose TP cap is first the cluster's GPUs
    def cands_of(nodes: int) -> tuple[Any, ...]:
        req = parse(HybridRequest, at(nodes))
        return build_space(req, space_mode(req)).layer_candidates(8, 8)

    assert "max_tp" not in base.get("constraints", {})
    assert cands_of(2) is cands_of(4) is cands_of(3)
    again = quick_plan(at(2))
    assert again[0].to_dict() == alone[0].to_dict()
    assert again[1].model_dump() == alone[1].model_dump()
