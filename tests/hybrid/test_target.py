"""``constraints.target``: a plan for the framework the user runs is one that framework runs exactly as planned
(a fixed point of its export's ``run_plan``), the fastest fitting plan of the uniform grid that framework
expresses, exported without loss, estimated as any strategy is; ``"paraplan"`` changes nothing."""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

import pytest

from solvers.api import estimate
from solvers.cost_model.factory import make_cost_model
from solvers.cost_model.pipeline import chunks, even_split
from solvers.documents.hybrid import HybridResult
from solvers.errors import InfeasibleError, SpecError
from solvers.exports import EXPORTERS, export
from solvers.hybrid.api import solve, space_mode
from solvers.hybrid.baselines import megatron_embedding, without_experts
from solvers.hybrid.space import build_space
from solvers.hybrid.targets import FRAMEWORK_TARGETS, _deepspeed_embedding, _deepspeed_split, _grid
from solvers.request import HybridRequest, parse
from solvers.strategy import PlanStrategy


def _req(model: dict[str, Any], gpu: str, gpus: int, batch: int, seq: int, **constraints: Any) -> dict[str, Any]:
    return {"kind": "hybrid", "model": model, "cluster": {"gpu": gpu, "nodes": 1, "gpus_per_node": gpus},
            "training": {"global_batch_size": batch, "seq_length": seq}, "constraints": constraints}


SMALL = {
    "gpt3-1.3b-4": _req({"preset": "gpt3-1.3b"}, "A100-80GB", 4, 16, 2048),
    "llama2-7b-4-40gb": _req({"preset": "llama2-7b"}, "A100-40GB", 4, 8, 4096),
    "llama2-7b-8-tight": _req({"preset": "llama2-7b"}, "A100-80GB", 8, 16, 2048, memory_limit_gib=16),
    "llama3-8b-4-long": _req({"preset": "llama3-8b"}, "H100-SXM", 4, 4, 16384),
    "moe-8-layers-4": _req({"preset": "mixtral-8x7b", "num_layers": 8}, "H100-SXM", 4, 8, 2048),
    "llama2-7b-8-interleaved": _req({"preset": "llama2-7b", "num_layers": 16}, "A100-40GB", 8, 16, 4096,
                                    schedule="interleaved", max_cp=1),
}
# DeepSpeed's pipelines have no interleaved schedule (test_a_target_without_the_schedule_asked_for)
CASES = [(name, t) for name in SMALL for t in FRAMEWORK_TARGETS
         if (name, t) != ("llama2-7b-8-interleaved", "deepspeed")]


@functools.cache
def _solved(name: str, target: str) -> HybridResult:
    req = SMALL[name]
    return solve({**req, "constraints": {**req["constraints"], "target": target}})


def _request(name: str, target: str) -> dict[str, Any]:
    req = SMALL[name]
    return {**req, "constraints": {**req["constraints"], "target": target}}


def _experts(name: str) -> list[bool]:
    model = parse(HybridRequest, SMALL[name]).model
    return [model.is_moe_layer(i) for i in range(model.num_layers)]


@pytest.mark.parametrize(("name", "target"), CASES)
def test_the_plan_is_what_the_framework_runs(name: str, target: str) -> None:
    res = _solved(name, target)
    plan, req = res.plan(), _request(name, target)
    assert EXPORTERS[target].run_plan(plan, _experts(name), req) == plan
    assert len({without_experts(x) for x in plan.layers if x.recompute == plan.layers[0].recompute}) == 1
    assert res.search.solver == f"uniform-grid:{target}" and res.search.target == target
    assert res.estimate.fits
    # the estimate is the one any caller gets for this strategy
    est = estimate({**req, "strategy": res.strategy.model_dump(exclude_none=True)})
    assert est.step_time_s == pytest.approx(res.estimate.step_time_s, rel=1e-12)
    assert est.peak_memory_gib == pytest.approx(res.estimate.peak_memory_gib, rel=1e-12)


@pytest.mark.parametrize(("name", "target"), CASES)
def test_the_grid_is_what_the_framework_runs(name: str, target: str) -> None:
    """The target's grid holds only layouts its export runs unchanged: so its fastest fitting plan is the plan (a
    grid wider than the export, as when DeepSpeed's whole-layer checkpointing met selective recomputation, would
    price a faster plan the framework does not run)."""
    res = _solved(name, target)
    assert res.search.target_grid_best_step_time_s == pytest.approx(res.estimate.step_time_s, rel=1e-9)


@pytest.mark.parametrize(("name", "target"), CASES)
def test_the_export_is_lossless(name: str, target: str) -> None:
    res = _solved(name, target)
    text = export(res, target, _request(name, target))
    assert re.search(r"estimated step [0-9.e+-]+ s \(\+0\.0% against the plan's", text), text[:400]
    said = json.loads(text)["_paraplan_notes"] if target == "deepspeed" else re.findall(r"^# (.*)$", text, re.M)
    # beside the run's price, the notes may say how to launch it (a mesh, a model config to add), never that
    # something of the plan runs otherwise: the words the exports use for a difference
    differs = ("difference(s) from the plan", "not expressible", "runs as",
               "run as ", "instead of", "written as", "approximat", "OVER THE MEMORY",
               "none of its partition methods")
    assert [n for n in said if not n.startswith("as ") and any(d in n for d in differs)] == [], said


def _brute_force(name: str, target: str) -> float:
    """The fastest fitting plan of the target's uniform grid that the target runs as it is (a fixed point of its
    export's run_plan), each plan built and priced on its own."""
    req = _request(name, target)
    parsed: HybridRequest = parse(HybridRequest, req)
    cm = make_cost_model(parsed)
    space = build_space(parsed, space_mode(parsed))
    experts = _experts(name)
    configs, strategies = _grid(target, space)  # type: ignore[arg-type]
    best = math.inf
    for cfg in configs:
        g, mbs = space.num_gpus // cfg.pp, space.global_batch_size // cfg.micro_batches
        parts = _deepspeed_split(space.num_layers, cfg) if target == "deepspeed" else \
            even_split(space.num_layers, cfg.pp, chunks(cfg.schedule, cfg.virtual_stages))
        if parts is None:
            continue
        for x in strategies:
            if x.world != g or mbs % x.dp:
                continue
            layers = tuple(x if any(experts) and experts[i] else without_experts(x) for i in range(len(experts)))
            emb = _deepspeed_embedding(x) if target == "deepspeed" else megatron_embedding(x)
            plan = PlanStrategy(pp=cfg.pp, micro_batches=cfg.micro_batches, layers=layers, stage_layers=parts,
                                schedule=cfg.schedule, virtual_stages=cfg.virtual_stages, embedding=emb)
            est = cm.evaluate(plan)
            if est.fits and est.step_time_s < best and EXPORTERS[target].run_plan(plan, experts, req) == plan:
                best = est.step_time_s
    return best


@pytest.mark.parametrize(("name", "target"), [c for c in CASES if c[0] in
                                              ("gpt3-1.3b-4", "llama2-7b-4-40gb", "moe-8-layers-4")])
def test_no_plan_of_the_grid_is_faster(name: str, target: str) -> None:
    best = _brute_force(name, target)
    assert math.isfinite(best)
    assert _solved(name, target).estimate.step_time_s <= best * (1 + 1e-9)


def test_target_paraplan_changes_nothing() -> None:
    for req in list(SMALL.values())[:3]:
        plain, named = solve(req), solve({**req, "constraints": {**req["constraints"], "target": "paraplan"}})
        assert named.strategy == plain.strategy and named.estimate == plain.estimate
        assert named.search.solver == "dp" and named.search.target == "paraplan"


def test_a_target_without_the_schedule_asked_for() -> None:
    with pytest.raises(InfeasibleError) as err:
        _solved("llama2-7b-8-interleaved", "deepspeed")
    (problem,) = err.value.problems
    assert problem.loc == ("constraints", "target") and "interleaved" in problem.msg


def test_an_unknown_target_names_the_field() -> None:
    with pytest.raises(SpecError) as err:
        solve(_request("gpt3-1.3b-4", "vllm"))
    assert any(p.loc[-1] == "target" and "megatron" in p.msg for p in err.value.problems)


@pytest.mark.db
def test_http_target(client: Any) -> None:
    req = _request("gpt3-1.3b-4", "torchtitan")
    r = client.post("/v1/plans", json=req)
    assert r.status_code in (200, 201, 202), r.text
    bad = client.post("/v1/plans", json=_request("gpt3-1.3b-4", "vllm"))
    assert bad.status_code == 422
    detail = bad.json()["detail"]
    assert ["body", "constraints", "target"] in [d["loc"] for d in detail]
    assert all(t in bad.text for t in ("paraplan", "megatron", "torchtitan", "deepspeed"))


def test_the_summary_names_the_target_and_claims_no_whole_space_certificate() -> None:
    from solvers.hybrid.api import summarise

    text = "\n".join(summarise(_request("gpt3-1.3b-4", "deepspeed"), _solved("gpt3-1.3b-4", "deepspeed")))
    assert "target deepspeed" in text and "certificate" not in text
