"""Mapping a contract plan to the runtime: mesh degrees, the dominant choice and its note, and SpecError
naming the field for plans this node cannot run."""

from __future__ import annotations

import pytest

from solvers.errors import SpecError
from tests.worker.plans import TINY_MODEL, plan_doc
from worker.runtime.plan import from_document, load_plan


def test_uniform_shorthand_maps_to_mesh() -> None:
    plan = from_document(*load_plan(plan_doc(pp=2, tp=2, sp="megatron", micro_batches=4)))
    assert (plan.pp, plan.dp, plan.tp, plan.sp, plan.micro_batches) == (2, 1, 2, "megatron", 4)
    assert plan.stage_layers == (2, 2) and plan.world_size == 4
    assert plan.describe() == "pp2-dp1-tp2-megatron-sp-zero0-1f1bx4"


def test_per_layer_strategies_take_the_dominant_choice_and_keep_recompute_per_layer() -> None:
    layers = [{"tp": 2, "dp": 2, "zero": 3, "recompute": "full"}, {"tp": 2, "dp": 2, "zero": 3},
              {"tp": 1, "dp": 4, "zero": 1}, {"tp": 2, "dp": 2, "zero": 3, "recompute": "selective"}]
    doc = plan_doc()
    doc["result"]["strategy"] = {"pp": 1, "micro_batches": 1, "stage_layers": [4], "layers": layers}
    plan = from_document(*load_plan(doc))
    assert (plan.tp, plan.dp, plan.zero) == (2, 2, 3)
    assert plan.recompute == ("full", "none", "none", "selective")
    assert any("dominant" in n for n in plan.notes)


@pytest.mark.parametrize(("strategy", "field"), [
    ({"tp": 3}, "num_attention_heads"),
    ({"dp": 2}, "result.strategy"),  # 2 ranks planned, 4 processes on this node
    ({"dp": 4, "micro_batches": 3}, "global_batch_size"),
    ({"pp": 2, "micro_batches": 3, "schedule": "interleaved"}, "micro_batches"),
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
