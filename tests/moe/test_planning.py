"""MoE terms in the analytic cost model and the hybrid planner's expert layouts."""

from __future__ import annotations

from typing import Any

import pytest

from solvers.cost_model import moe as moe_cost
from solvers.cost_model.aggregate import stage_context
from solvers.cost_model.factory import make_cost_model
from solvers.errors import SpecError
from solvers.hybrid.space import build_space
from solvers.request import HybridRequest, parse
from solvers.strategy import LayerStrategy, PlanStrategy
from tests.contract_json import estimate, solve


def request(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"kind": "hybrid", "model": {"preset": "mixtral-8x7b", "num_layers": 2},
                            "cluster": {"gpu": "H100", "nodes": 2, "gpus_per_node": 8},
                            "training": {"global_batch_size": 16, "seq_length": 1024}}
    return {**base, **over}


def costs(cands: tuple[LayerStrategy, ...], **over: Any) -> Any:
    """Layer 0's costs for one micro-batch of all 16 samples of 8192 tokens (every candidate below routes 8192
    tokens per rank: large messages, where bandwidth, not per-message latency, decides)."""
    req = parse(HybridRequest, request(training={"global_batch_size": 16, "seq_length": 8192}, **over))
    cm = make_cost_model(req)
    plan = PlanStrategy(pp=1, micro_batches=1, layers=(LayerStrategy(dp=16),) * 2, stage_layers=(2,))
    return cm.layer_costs(0, cands, stage_context(plan, 0, 16))


def test_alltoall_on_the_link_the_ep_group_uses() -> None:
    # attention tp=8 on a node; folded experts: etp=1 keeps EP=8 inside the node, etp=8 spreads EP=2 over both
    intra = LayerStrategy(tp=8, dp=2, sp="megatron", ep=8, etp=1)
    across = LayerStrategy(tp=8, dp=2, sp="megatron", ep=2)
    wide = LayerStrategy(tp=1, dp=16, ep=8)  # 8 consecutive ranks: one node
    c = costs((intra, across, wide, LayerStrategy(tp=1, dp=16, ep=1)))
    assert not moe_cost.alltoall_crosses_nodes(8, 1, 8) and moe_cost.alltoall_crosses_nodes(2, 8, 8)
    a2a = c.parts_s["ep_comm"]
    assert a2a[3] == 0
    assert a2a[0] == pytest.approx(a2a[2])  # same bytes, same link
    # EP=2 sends 1/2 of its rows off-rank, EP=8 7/8, yet crossing nodes costs more
    assert a2a[1] > 2 * a2a[0]


def test_lsh_cuts_bytes_compute_and_adds_hashing_and_residual_memory() -> None:
    plain = LayerStrategy(tp=2, dp=8, sp="megatron", ep=8)  # EP over both nodes
    lsh = LayerStrategy(tp=2, dp=8, sp="megatron", ep=8, lsh=True)
    c = costs((plain, lsh))
    assert c.parts_s["ep_comm"][1] == pytest.approx(moe_cost.LSH_COMPRESSION_RATE * c.parts_s["ep_comm"][0],
                                                    rel=0.05)  # only per-message latencies do not shrink
    assert c.activation_bytes[1] > c.activation_bytes[0]  # residuals kept until the combine
    assert c.parts_s["compute"][1] < c.parts_s["compute"][0]  # experts run on centroids
    assert c.state_bytes[1] == c.state_bytes[0]


def test_expert_states_follow_ep_and_etp() -> None:
    req = parse(HybridRequest, request())
    dense = req.model.layer_params(0) - 8 * req.model.mlp_params(req.model.expert_ffn_size)
    experts = 8 * req.model.mlp_params(req.model.expert_ffn_size)
    cands = (LayerStrategy(tp=2, dp=8, sp="megatron", ep=4), LayerStrategy(tp=2, dp=8, sp="megatron", ep=8, etp=1),
             LayerStrategy(tp=2, dp=8, sp="megatron", ep=8, etp=2))
    c = costs(cands)
    expect = [dense / 2 + experts / (ep * etp) for ep, etp in ((4, 2), (8, 1), (8, 2))]
    assert list(c.memory_parts_bytes["parameters"]) == pytest.approx([2 * p for p in expect])


def test_estimate_flags_lsh_as_approximate_and_names_bad_fields() -> None:
    est = estimate(request(strategy={"tp": 1, "ep": 8, "lsh": True, "micro_batch_size": 1}))
    assert any(n.startswith("approximate") for n in est["notes"])
    assert not any(n.startswith("approximate") for n in estimate(request(strategy={"tp": 1, "ep": 8}))["notes"])
    for strat, field in (({"tp": 1, "ep": 3}, "ep"), ({"tp": 2, "ep": 8, "etp": 3}, "ep"),
                         ({"tp": 1, "lsh": "yes"}, "lsh"), ({"tp": 1, "etp": 0}, "etp")):
        with pytest.raises(SpecError) as err:
            estimate(request(strategy={**strat, "micro_batch_size": 1}))
        assert ("strategy", field) in [p.loc for p in err.value.problems], err.value.problems


def _best_uniform(req_doc: dict[str, Any]) -> float:
    """Brute force: every uniform pp=1 plan of the planner's own space, evaluated by the cost model."""
    req = parse(HybridRequest, req_doc)
    cm = make_cost_model(req)
    space = build_space(req)
    best = float("inf")
    for m in space.micro_batch_options(1):
        for x in space.layer_candidates(16, 16 // m):
            plan = PlanStrategy(pp=1, micro_batches=m, layers=(x,) * 2, stage_layers=(2,))
            est = cm.evaluate(plan)
            if est.fits:
                best = min(best, est.step_time_s)
    return best


@pytest.mark.parametrize("approx", [False, True])
def test_planner_uses_expert_layouts_and_beats_every_uniform_plan(approx: bool) -> None:
    doc = request(constraints={"max_pp": 1, "allow_approximate": approx, "max_cp": 1})
    res = solve(doc)
    layers = [LayerStrategy.from_dict(x) for x in res["strategy"]["layers"]]
    assert res["estimate"]["step_time_s"] <= _best_uniform(doc) * (1 + 1e-9)
    assert any(x.ep > 1 for x in layers)
    for x in layers:
        crosses = bool(moe_cost.alltoall_crosses_nodes(x.ep, x.expert_tp, 8))
        assert not x.lsh or (approx and crosses)
    assert any(n.startswith("approximate") for n in res["estimate"]["notes"]) == any(x.lsh for x in layers)


def test_dense_layers_keep_no_expert_fields() -> None:
    doc = request(model={"preset": "mixtral-8x7b", "num_layers": 4, "moe": {"num_experts": 8,
                                                                          "moe_layer_frequency": 2}},
                  constraints={"max_pp": 1, "max_cp": 1})
    res = solve(doc)
    for i, x in enumerate(res["strategy"]["layers"]):
        if i % 2 == 0:  # dense
            assert not ({"ep", "etp", "lsh"} & set(x)), x
    estimate({**doc, "strategy": res["strategy"]})  # the plan validates


def test_space_expands_only_moe_models() -> None:
    moe_space = build_space(parse(HybridRequest, request()))
    dense_space = build_space(parse(HybridRequest, request(model={"preset": "llama2-7b", "num_layers": 2})))
    assert moe_space.num_experts == 8 and dense_space.num_experts == 1
    a = moe_space.layer_candidates(16, 8)
    assert {(x.ep, x.expert_tp) for x in a} >= {(1, 1), (8, 1), (8, 2), (2, 8)}
    assert all(x.ep == 1 and x.etp is None and not x.lsh for x in dense_space.layer_candidates(16, 8))
    assert not [x for x in a if x.lsh]  # approximate methods are off by default


TINY_MOE = {"name": "tiny", "num_layers": 3, "hidden_size": 192, "num_attention_heads": 6, "vocab_size": 1000,
            "mlp": "gelu", "moe": {"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 256}}


def test_an_expert_tp_that_does_not_divide_the_expert_ffn_is_never_planned_and_is_named() -> None:
    """6 GPUs (TP 3 divides the 6 heads and the dense FFN of 768, not the experts' 256): the plan keeps its MoE
    layers' expert TP a divisor of 256 and re-estimates as it was planned (it returned TP 3 with the experts as
    the MLP, which the estimate refused: "etp (3) must divide the expert FFN width"). An estimate of TP 3 with
    the experts as the MLP, or of a dense FFN TP 3 does not divide, names tp."""
    doc = {"kind": "hybrid", "model": TINY_MOE, "cluster": {"nodes": 1, "gpus_per_node": 6, "gpu": "H200"},
           "training": {"global_batch_size": 128, "seq_length": 2, "precision": "fp8"},
           "constraints": {"max_cp": 2, "time_limit_s": 10}}
    res = solve(doc)
    layers = [LayerStrategy.from_dict(x) for x in res["strategy"]["layers"]]
    assert all(256 % x.expert_tp == 0 for x in layers)
    again = estimate({**doc, "strategy": res["strategy"]})
    assert again["step_time_s"] == pytest.approx(res["estimate"]["step_time_s"], rel=1e-9)
    plain = {**doc, "strategy": {"tp": 3, "dp": 2, "micro_batch_size": 2}}
    for model in (TINY_MOE, {**TINY_MOE, "moe": None, "ffn_hidden_size": 256}):
        with pytest.raises(SpecError) as err:
            estimate({**plain, "model": model})
        assert [p.loc for p in err.value.problems] == [("strategy", "tp")], err.value.problems
        assert "must divide the" in err.value.problems[0].msg and "FFN width (256)" in err.value.problems[0].msg
    assert estimate({**plain, "strategy": {**plain["strategy"], "etp": 1}})["step_time_s"] > 0
