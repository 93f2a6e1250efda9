"""Mapping a contract plan to the runtime: mesh degrees, per-layer recompute, and SpecError naming the field
for plans this node cannot run."""

from __future__ import annotations

import pytest

from solvers.errors import SpecError
from solvers.run_experts import ExpertLayout
from solvers.run_layout import check_runnable
from tests.worker.plans import EQUIVALENCE_PLANS, MOE_PLANS, REFUSED, TINY_MODEL, moe_plan_doc, plan_doc
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
    assert (plan.pp, plan.dp, plan.tp, plan.cp, plan.zero) == (
        strategy["pp"], layer.get("dp", 1), layer.get("tp", 1), layer.get("cp", 1), layer.get("zero", 0))
    assert plan.recompute == tuple(x.get("recompute", "none") for x in strategy["layers"])
    per_rank = [sum(plan.stage_layers[s::plan.pp]) for s in range(plan.pp)]
    assert per_rank == strategy["stage_layers"] and plan.micro_batches == strategy["micro_batches"]
    assert check_runnable(doc).world_size == plan.world_size == 4


@pytest.mark.parametrize(("strategy", "layout"), [
    ({"cp": 2, "dp": 2}, "pp1-dp2-cp2-zero0"),
    ({"cp": 4, "zero": 3}, "pp1-dp1-cp4-zero3"),
    ({"cp": 2, "tp": 2, "sp": "megatron", "zero": 2}, "pp1-dp1-cp2-tp2-megatron-sp-zero2"),
    ({"cp": 2, "tp": 2, "sp": "ulysses"}, "pp1-dp1-cp2-sp2-zero0"),
])
def test_context_parallel_plans_run_on_a_cp_mesh_dim(strategy: dict, layout: str) -> None:
    """cp is a mesh dimension of its own (ring attention), not extra data parallelism: the world counts it once."""
    doc = plan_doc(**strategy)
    plan = from_document(*load_plan(doc))
    assert (plan.cp, plan.world_size, plan.describe()) == (strategy["cp"], 4, layout)
    assert check_runnable(doc).cp == strategy["cp"] and check_runnable(doc).world_size == 4


@pytest.mark.parametrize(("strategy", "seq", "msg"), [
    ({"cp": 4, "zero": 3}, 36, "36 is not divisible by 2*cp = 8"),
    ({"cp": 2, "dp": 2}, 30, "30 is not divisible by 2*cp = 4"),
    # 8 ranks: each cp rank's 6 tokens cannot be split 4 ways by Megatron's sequence parallelism
    ({"cp": 2, "tp": 4, "sp": "megatron", "zero": 2}, 12,
     "the 6 tokens of a cp rank is not divisible by the sequence split 4"),
])
def test_context_parallel_plans_need_the_sequence_in_equal_chunks(strategy: dict, seq: int, msg: str) -> None:
    world = strategy["cp"] * strategy.get("tp", 1) * strategy.get("dp", 1)
    model = {**TINY_MODEL, "num_attention_heads": 8, "num_kv_heads": 4}
    with pytest.raises(SpecError) as err:
        check_runnable(plan_doc(world=world, seq=seq, model=model, **strategy))
    assert [p.loc for p in err.value.problems] == [("request", "training", "seq_length")]
    assert msg in err.value.problems[0].msg
    check_runnable(plan_doc(world=world, seq=2 * strategy["cp"] * strategy.get("tp", 1) * 4, model=model,
                            **strategy))


@pytest.mark.parametrize("name", list(MOE_PLANS))
def test_an_accepted_moe_plan_runs_its_expert_layout(name: str) -> None:
    """Each MoE layer gets the plan's ep and expert TP (etp, else the layer's tp; 1 under Ulysses), dense layers
    none; the service accepts what the worker builds."""
    doc = MOE_PLANS[name]
    plan = from_document(*load_plan(doc))
    layers = doc["result"]["strategy"]["layers"]
    want = tuple(ExpertLayout(ep=x["ep"], etp=x.get("etp", 1 if x.get("sp") == "ulysses" else x.get("tp", 1)))
                 if i % 2 else None for i, x in enumerate(layers))
    assert plan.experts == want and check_runnable(doc).experts == want
    assert f"ep{want[1].ep}" in plan.describe()  # type: ignore[union-attr]


def test_lsh_is_run_where_the_plan_says() -> None:
    plan = from_document(*load_plan(moe_plan_doc({"ep": 2, "lsh": True}, dp=4)))
    assert plan.experts[1] == ExpertLayout(ep=2, etp=1, lsh=True) and plan.experts[0] is None


def test_moe_layers_under_context_parallelism_are_refused_naming_cp() -> None:
    """Experts fold over a layer's tp x dp ranks; a cp plan of an MoE model is refused, not run as something else."""
    with pytest.raises(SpecError) as err:
        check_runnable(moe_plan_doc({"ep": 2}, cp=2, dp=2))
    assert ("result", "strategy", "layers", 0, "cp") in [p.loc for p in err.value.problems], err.value
