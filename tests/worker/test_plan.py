"""Mapping a contract plan to the runtime: mesh degrees, per-layer recompute, and SpecError naming the field
for plans this node cannot run."""

from __future__ import annotations

import pytest

from solvers.cost_model.pipeline import model_layer_order
from solvers.errors import SpecError
from solvers.run_layout import check_runnable
from tests.worker.plans import EQUIVALENCE_PLANS, REFUSED, TINY_MODEL, plan_doc
from worker.runtime.plan import from_document, load_plan


def test_uniform_shorthand_maps_to_mesh() -> None:
    plan = from_document(*load_plan(plan_doc(pp=2, tp=2, sp="megatron", micro_batches=4)))
    assert (plan.pp, plan.dp, plan.tp, plan.sp, plan.micro_batches) == (2, 1, 2, "megatron", 4)
    assert plan.stage_layers == (2, 2) and plan.world_size == 4
    assert plan.describe() == "pp2-dp1-tp2-megatron-sp-zero0-1f1bx4"


def test_recompute_stays_per_layer() -> None:
    layers = [{"tp": 2, "dp": 2, "zero": 3, "recompute": "full"}, {"tp": 2, "dp": 2, "zero": 3},
              {"tp": 2, "dp": 2, "zero": 3}, {"tp": 2, "dp": 2, "zero": 3, "recompute": "selective"}]
    doc = plan_doc()
    doc["result"]["strategy"] = {"pp": 1, "micro_batches": 1, "stage_layers": [4], "layers": layers,
                                 "embedding": {"tp": 2, "dp": 2, "zero": 3}}
    plan = from_document(*load_plan(doc))
    assert (plan.tp, plan.dp, plan.zero) == (2, 2, 3)
    assert plan.recompute == ("full", "none", "none", "selective")


def test_interleaved_layers_take_the_strategies_their_stage_was_priced_with() -> None:
    """The plan lists its layers stage by stage; interleaving runs stage 0's second chunk after stage 1's first,
    so model layer 3 is plan layer 5 (stage 1's first) and model layers 4-5 are plan layers 3-4."""
    doc = plan_doc(model={**TINY_MODEL, "num_layers": 7}, pp=2, dp=2, zero=3, micro_batches=2,
                   schedule="interleaved", virtual_stages=2)
    strategy = doc["result"]["strategy"]
    strategy["stage_layers"] = [5, 2]
    modes = ["none", "none", "none", "full", "full", "selective", "none"]
    strategy["layers"] = [{**x, "recompute": m} for x, m in zip(strategy["layers"], modes, strict=True)]
    plan = from_document(*load_plan(doc))
    assert plan.stage_layers == (3, 1, 2, 1) and plan.virtual_stages == 2
    assert plan.recompute == ("none", "none", "none", "selective", "full", "full", "none")


@pytest.mark.parametrize(("strategy", "field"), [
    ({"tp": 3}, "num_attention_heads"),
    ({"dp": 2}, "result.strategy"),  # 2 ranks planned, 4 processes on this node
    ({"dp": 4, "micro_batches": 3}, "global_batch_size"),
    ({"pp": 2, "micro_batches": 3, "schedule": "interleaved", "virtual_stages": 2}, "micro_batches"),
])
def test_unrunnable_plans_name_the_field(strategy: dict, field: str) -> None:
    with pytest.raises(SpecError) as err:
        from_document(*load_plan(plan_doc(**strategy)))
    assert field in str(err.value)


def test_invalid_request_is_reported_under_request() -> None:
    doc = plan_doc(dp=4, model={**TINY_MODEL, "num_layer": 3})
    with pytest.raises(SpecError) as err:
        from_document(*load_plan(doc))
    assert "request.model.num_layer" in str(err.value)


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_worker_refuses_what_the_service_refuses(name: str) -> None:
    """The mesh the worker would build (``from_document``, what train.py and the daemon call) is refused for the
    same fields the service's check names; nothing falls back to an approximation."""
    doc, loc, reason = REFUSED[name]
    with pytest.raises(SpecError) as worker:
        from_document(*load_plan(doc), world_size=4)
    with pytest.raises(SpecError) as service:
        check_runnable(doc)
    assert any(p.loc == tuple(loc) and reason in p.msg for p in worker.value.problems), worker.value
    assert worker.value.problems == service.value.problems


@pytest.mark.parametrize("name", list(EQUIVALENCE_PLANS))
def test_an_accepted_plan_runs_its_own_layout(name: str) -> None:
    """What the worker builds for an accepted plan is the plan: its degrees, ZeRO stage, per-layer recompute, and
    per rank the plan's layers (for interleaving: the rank's virtual stages together)."""
    doc = EQUIVALENCE_PLANS[name]
    plan = from_document(*load_plan(doc))
    strategy = doc["result"]["strategy"]
    layer = strategy["layers"][0]
    assert (plan.pp, plan.dp, plan.tp, plan.zero) == (strategy["pp"], layer.get("dp", 1), layer.get("tp", 1),
                                                      layer.get("zero", 0))
    order = model_layer_order(strategy["stage_layers"], plan.virtual_stages)
    assert plan.recompute == tuple(strategy["layers"][i].get("recompute", "none") for i in order)
    per_rank = [sum(plan.stage_layers[s::plan.pp]) for s in range(plan.pp)]
    assert per_rank == strategy["stage_layers"] and plan.micro_batches == strategy["micro_batches"]
    assert check_runnable(doc).world_size == plan.world_size == 4
