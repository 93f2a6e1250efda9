"""Mapping a contract plan to the runtime: each layer's layout, the embedding's, per-layer recompute, and SpecError
naming the field for plans this node cannot run."""

from __future__ import annotations

import pytest

from solvers.cost_model.pipeline import model_layer_order
from solvers.errors import SpecError
from solvers.run_experts import ExpertLayout
from solvers.run_layout import LayerLayout, RunLayout, check_runnable
from tests.worker.plans import (
    EQUIVALENCE_PLANS,
    MOE_MODEL,
    MOE_PLANS,
    REFUSED,
    TINY_MODEL,
    mixed_doc,
    moe_plan_doc,
    plan_doc,
)
from worker.runtime.plan import from_document, load_plan


def test_uniform_shorthand_maps_to_mesh() -> None:
    plan = from_document(*load_plan(plan_doc(pp=2, tp=2, sp="megatron", micro_batches=4)))
    one = LayerLayout(dp=1, tp=2, sp="megatron")
    assert plan.uniform() == one and plan.layers == (one,) * 4 and (plan.pp, plan.micro_batches) == (2, 4)
    assert plan.stage_layers == (2, 2) and plan.world_size == 4
    assert plan.describe() == "pp2-dp1-tp2-megatron-sp-zero0-1f1bx4"


def test_a_per_layer_mix_runs_layer_by_layer() -> None:
    """Each layer keeps its own layout (a no-op sp on one tp rank dropped); the embedding and head theirs, sequence
    sharded beside a Megatron-SP neighbour; ``describe`` lists runs of equal layouts."""
    doc = mixed_doc([{"tp": 4, "sp": "megatron"}, {"tp": 2, "dp": 2, "zero": 1}, {"tp": 2, "dp": 2, "zero": 1},
                     {"dp": 4, "sp": "ulysses", "zero": 3}], {"tp": 4})
    plan = from_document(*load_plan(doc))
    assert plan.layers == (LayerLayout(tp=4, sp="megatron"), LayerLayout(dp=2, tp=2, zero=1),
                           LayerLayout(dp=2, tp=2, zero=1), LayerLayout(dp=4, zero=3))
    assert plan.embedding == LayerLayout(tp=4, sp="megatron") and plan.head == LayerLayout(tp=4)
    assert plan.uniform() is None and plan.dp == 1 and plan.world_size == 4
    assert plan.describe() == ("pp1-layers[0:dp1-tp4-megatron-sp-zero0,1-2:dp2-tp2-zero1,3:dp4-zero3]"
                               "-embedding[dp1-tp4-megatron-sp-zero0]-head[dp1-tp4-zero0]")


def test_data_parallel_ranks_per_layout() -> None:
    """The ranks that average a layer's gradients: dp, times the Ulysses ranks (weights replicated there)."""
    assert LayerLayout(dp=2, tp=2).data_ranks == 2
    assert LayerLayout(dp=2, tp=2, sp="megatron").data_ranks == 2
    assert LayerLayout(dp=2, tp=2, sp="ulysses").data_ranks == 4
    assert LayerLayout(dp=2, tp=2, sp="ulysses").tensor_parallel == 1


def test_a_problem_of_several_layers_is_named_once() -> None:
    with pytest.raises(SpecError) as err:
        check_runnable(mixed_doc([{"dp": 4}, {"dp": 2}, {"dp": 2}, {"dp": 2}], {"dp": 4}))
    assert [(p.loc, p.msg) for p in err.value.problems] == [
        (("result", "strategy", "layers", 1), "pp*dp*tp*cp = 2 but the run has 4 processes (layers 1-3)")]


def test_recompute_stays_per_layer() -> None:
    layers = [{"tp": 2, "dp": 2, "zero": 3, "recompute": "full"}, {"tp": 2, "dp": 2, "zero": 3},
              {"tp": 2, "dp": 2, "zero": 3}, {"tp": 2, "dp": 2, "zero": 3, "recompute": "selective"}]
    doc = plan_doc()
    doc["result"]["strategy"] = {"pp": 1, "micro_batches": 1, "stage_layers": [4], "layers": layers,
                                 "embedding": {"tp": 2, "dp": 2, "zero": 3}}
    plan = from_document(*load_plan(doc))
    assert plan.uniform() == LayerLayout(dp=2, tp=2, zero=3)
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
    """What the worker builds for an accepted plan is the plan: each layer's degrees and ZeRO stage, the
    embedding's, per-layer recompute, and per rank the plan's layers (for interleaving: the rank's virtual stages
    together)."""
    doc = EQUIVALENCE_PLANS[name]
    plan = from_document(*load_plan(doc))
    strategy = doc["result"]["strategy"]
    assert plan.pp == strategy["pp"]
    order = model_layer_order(strategy["stage_layers"], plan.virtual_stages)
    planned = [strategy["layers"][i] for i in order]  # the plan's strategy of each model layer
    for got, layer in zip(plan.layers, planned, strict=True):
        assert (got.dp, got.cp, got.tp, got.zero) == (layer.get("dp", 1), layer.get("cp", 1), layer.get("tp", 1),
                                                      layer.get("zero", 0))
        assert got.sp == (layer.get("sp") if got.tp > 1 else None)
    emb, end = strategy["embedding"], plan.embedding  # the planner's embedding dp counts the layers' cp ranks
    assert (end.dp * end.cp, end.tp, end.zero) == (emb.get("dp", 1), emb.get("tp", 1), emb.get("zero", 0))
    assert plan.recompute == tuple(x.get("recompute", "none") for x in planned)
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
    one = plan.uniform()  # the embedding and head take the layers' cp (the planner counts it in their dp)
    assert one is not None and (one.cp, plan.world_size, plan.describe()) == (strategy["cp"], 4, layout)
    run = check_runnable(doc)
    assert isinstance(run, RunLayout) and {x.cp for x in run.layers} == {strategy["cp"]} and run.world_size == 4


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
    run = check_runnable(doc)
    assert isinstance(run, RunLayout) and plan.experts == want and run.experts == want
    assert f"ep{want[1].ep}" in plan.describe()  # type: ignore[union-attr]


def test_lsh_is_run_where_the_plan_says() -> None:
    plan = from_document(*load_plan(moe_plan_doc({"ep": 2, "lsh": True}, dp=4)))
    assert plan.experts[1] == ExpertLayout(ep=2, etp=1, lsh=True) and plan.experts[0] is None


def test_moe_layers_under_context_parallelism_are_refused_naming_cp() -> None:
    """Experts fold over a layer's tp x dp ranks; an MoE layer with cp is refused, not run as something else (the
    dense layers 0 and 2 may run ring attention)."""
    with pytest.raises(SpecError) as err:
        check_runnable(moe_plan_doc({"ep": 2}, cp=2, dp=2))
    assert [p.loc for p in err.value.problems] == [("result", "strategy", "layers", i, "cp") for i in (1, 3)]


def _interleaved_moe(layers: list[dict]) -> dict:
    """The 4-layer MoE model (layers 1 and 3 MoE) as pp2 x dp2, interleaved over 2 virtual stages: the plan lists
    stage 0's layers (model layers 0 and 2) before stage 1's (model layers 1 and 3)."""
    return mixed_doc(layers, {"dp": 2}, model=MOE_MODEL, pp=2, micro_batches=2, schedule="interleaved",
                     virtual_stages=2)


def test_interleaved_layers_take_their_layouts_and_experts_from_their_place_in_their_stage() -> None:
    """Model layer i runs plan layer order[i] (order 0, 2, 1, 3 here): its layout and its expert layout, MoE-ness
    going by the model layer. Negative control: the expert fields placed in model order (plan layers 1 and 3) are
    refused, plan layer 1 being model layer 2, a dense layer; refusals name the plan's index."""
    dense, moe = {"dp": 2, "zero": 2}, {"dp": 2, "zero": 2, "ep": 2}
    plan = from_document(*load_plan(_interleaved_moe([dense, {"tp": 2, "sp": "megatron"}, moe, moe])))
    assert plan.layers == (LayerLayout(dp=2, zero=2), LayerLayout(dp=2, zero=2), LayerLayout(tp=2, sp="megatron"),
                           LayerLayout(dp=2, zero=2))
    assert plan.experts == (None, ExpertLayout(ep=2), None, ExpertLayout(ep=2))
    with pytest.raises(SpecError) as err:
        check_runnable(_interleaved_moe([dense, moe, dense, moe]))
    assert [p.loc for p in err.value.problems] == [("result", "strategy", "layers", 1, "ep")]
    assert "layer 2 is dense" in err.value.problems[0].msg
    with pytest.raises(SpecError) as err:  # cp on plan layer 2: model layer 1, an MoE layer
        check_runnable(_interleaved_moe([dense, dense, {"cp": 2, "ep": 2}, moe]))
    assert [p.loc for p in err.value.problems] == [("result", "strategy", "layers", 2, "cp")]
