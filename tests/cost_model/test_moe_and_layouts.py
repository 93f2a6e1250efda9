"""MoE, context parallelism and Ulysses: the terms they add move the way their mechanics say."""

from __future__ import annotations

import pytest

from solvers.cost_model import moe as moe_cost
from solvers.cost_model.aggregate import stage_context
from solvers.cost_model.base import StageContext
from solvers.cost_model.factory import make_cost_model
from solvers.errors import SpecError
from solvers.request import HybridRequest, parse
from solvers.strategy import LayerStrategy, PlanStrategy

from .conftest import request


def _ctx(layers: int, samples: int = 64, micro_batches: int = 4) -> StageContext:
    plan = PlanStrategy(pp=1, micro_batches=micro_batches, layers=(LayerStrategy(),) * layers, stage_layers=(layers,))
    return stage_context(plan, 0, samples)


def test_expert_parallelism_shards_experts_and_pays_all_to_all() -> None:
    req = parse(HybridRequest, request(model={"preset": "mixtral-8x7b", "num_layers": 2}))
    model = make_cost_model(req)
    c = model.layer_costs(0, (LayerStrategy(tp=2, dp=8, ep=1), LayerStrategy(tp=2, dp=8, ep=8)), _ctx(2))
    shape_params = req.model.layer_params(0)
    expert_params = 8 * req.model.mlp_params(req.model.expert_ffn_size)
    per_rank = [(shape_params - expert_params) / 2 + expert_params / (2 * ep) for ep in (1, 8)]
    assert list(c.memory_parts_bytes["parameters"]) == pytest.approx([2 * p for p in per_rank])
    assert c.parts_s["ep_comm"][0] == 0 and c.parts_s["ep_comm"][1] > 0


def test_ep_must_divide_dp_and_experts() -> None:
    strat = {"tp": 2, "pp": 1, "ep": 3, "micro_batch_size": 1}
    with pytest.raises(SpecError) as err:
        from tests.contract_json import estimate

        estimate(request(model={"preset": "mixtral-8x7b", "num_layers": 2}, strategy=strat))
    assert ("strategy", "ep") in [p.loc for p in err.value.problems]


def test_context_parallel_and_ulysses_split_activations_and_add_their_traffic() -> None:
    req = parse(HybridRequest, request(training={"global_batch_size": 16, "seq_length": 16384}))
    model = make_cost_model(req)
    cands = (LayerStrategy(tp=4, dp=4, sp="megatron"), LayerStrategy(tp=4, dp=2, cp=2, sp="megatron"),
             LayerStrategy(tp=4, dp=4, sp="ulysses"), LayerStrategy(tp=1, dp=16))
    c = model.layer_costs(0, cands, _ctx(32, samples=16, micro_batches=1))
    # cp=2 halves the tokens per rank but doubles the samples per rank: same activation bytes per rank
    assert c.activation_bytes[1] == pytest.approx(c.activation_bytes[0])
    assert c.parts_s["cp_comm"][0] == 0
    # the ring's K/V exchange is hidden behind the attention core as far as cp_overlap says
    exposed = parse(HybridRequest, request(training={"global_batch_size": 16, "seq_length": 16384},
                                           cost_model={"calibration": {"cp_overlap": 0.0}}))
    raw = make_cost_model(exposed).layer_costs(0, cands, _ctx(32, samples=16, micro_batches=1))
    assert raw.parts_s["cp_comm"][1] > c.parts_s["cp_comm"][1] >= 0
    # Ulysses keeps whole weights on every rank of its group: 4x the states of Megatron TP on 4 ranks
    assert c.state_bytes[2] == pytest.approx(4 * c.state_bytes[0], rel=1e-6)
    assert c.parts_s["tp_comm"][2] < c.parts_s["tp_comm"][0]  # all-to-all moves less than all-reduce
    assert c.parts_s["tp_comm"][3] == 0


def test_an_moe_layer_measured_under_tp_prices_layers_whose_experts_split_over_the_same_ranks() -> None:
    """A profile's MoE layer at tp 2 (with SP) was measured with its experts split over those ranks (etp = tp), the
    expert-TP exchanges inside: candidates with etp = tp take that time and no analytic expert-TP traffic; another
    etp under tp 2 was not measured and keeps the analytic layer."""
    moe = {"batch": 1, "seq": 2048, "tp": 2, "sp": True, "layer_type": "moe", "forward_ms": 50.0, "backward_ms": 90.0}
    base = request(model={"preset": "mixtral-8x7b", "num_layers": 2})
    measured = make_cost_model(parse(HybridRequest, {**base, "cost_model": {
        "kind": "profile", "profile": {"layer_times": [moe, {**moe, "batch": 2, "forward_ms": 100.0,
                                                              "backward_ms": 180.0}]}}}))
    analytic = make_cost_model(parse(HybridRequest, base))
    cands = (LayerStrategy(tp=2, dp=8, sp="megatron", ep=2), LayerStrategy(tp=2, dp=8, sp="megatron", ep=2, etp=1))
    ctx = _ctx(2, samples=64, micro_batches=4)  # 16 samples a micro-batch, 2 per data-parallel rank
    got, ref = measured.layer_costs(0, cands, ctx), analytic.layer_costs(0, cands, ctx)
    assert got.parts_s["compute"][0] == pytest.approx(0.100 + 0.180)
    assert got.parts_s["compute"][1] == pytest.approx(ref.parts_s["compute"][1])
    assert got.parts_s["tp_comm"][0] < ref.parts_s["tp_comm"][0]  # no expert-TP gather / scatter on top
    assert got.parts_s["tp_comm"][1] == pytest.approx(ref.parts_s["tp_comm"][1])


def test_an_moe_layer_measured_under_its_expert_parallelism_has_its_all_to_alls_inside() -> None:
    """A profile's MoE layer measured with its experts dealt over 2 ranks (ep 2) holds the dispatch / combine
    all-to-alls: an ep 2 candidate takes that time and adds no ep_comm (nor, recomputed, a second all-to-all). An
    ep 4 layer, an LSH-compressed one (its all-to-alls move fewer bytes) and one whose expert TP differs from the
    measured layout's were not measured so: they take the ep 1 layer and price the all-to-alls apart."""
    row = {"batch": 1, "seq": 2048, "tp": 1, "layer_type": "moe"}
    layer_times = [{**row, "forward_ms": 40.0, "backward_ms": 80.0},  # ep 1: every expert on the rank
                   {**row, "batch": 2, "forward_ms": 80.0, "backward_ms": 160.0},
                   {**row, "ep": 2, "forward_ms": 55.0, "backward_ms": 95.0},
                   {**row, "ep": 2, "batch": 2, "forward_ms": 110.0, "backward_ms": 190.0}]
    base = request(model={"preset": "mixtral-8x7b", "num_layers": 2})
    measured = make_cost_model(parse(HybridRequest, {**base, "cost_model": {
        "kind": "profile", "profile": {"layer_times": layer_times}}}))
    cands = (LayerStrategy(tp=1, dp=16, ep=2), LayerStrategy(tp=1, dp=16, ep=2, recompute="full"),
             LayerStrategy(tp=1, dp=16, ep=4), LayerStrategy(tp=1, dp=16, ep=2, lsh=True),
             LayerStrategy(tp=1, dp=16, ep=2, etp=2))
    got = measured.layer_costs(0, cands, _ctx(2, samples=64, micro_batches=4))  # 1 sample per data-parallel rank
    compute, ep_comm, recompute = got.parts_s["compute"], got.parts_s["ep_comm"], got.parts_s["recompute"]
    assert list(compute[:2]) == pytest.approx([0.055 + 0.095] * 2)
    assert list(ep_comm[:2]) == [0.0, 0.0]
    assert recompute[1] == pytest.approx(0.055)  # the forward again, all-to-alls included once
    assert list(compute[2:]) == pytest.approx([0.040 + 0.080] * 3) and ep_comm[2] > 0 and ep_comm[4] > 0
    # without the ep 2 rows an ep 2 candidate takes the ep 1 layer and prices its all-to-alls apart, as the LSH one
    # does with both (compressed: fewer bytes)
    ep1 = make_cost_model(parse(HybridRequest, {**base, "cost_model": {
        "kind": "profile", "profile": {"layer_times": layer_times[:2]}}})).layer_costs(0, cands, _ctx(2))
    assert ep1.parts_s["compute"][0] == pytest.approx(0.040 + 0.080)
    assert ep_comm[3] == pytest.approx(ep1.parts_s["ep_comm"][3]) and 0 < ep_comm[3] < ep1.parts_s["ep_comm"][0]


def test_an_expert_parallel_layer_measured_on_one_node_prices_only_expert_groups_within_a_node() -> None:
    """ep 8 x etp 2 spans 16 ranks: on nodes of 8 the all-to-alls cross nodes, which a profile's layer, timed on one
    node, did not; on a node of 16 it is the measured layout."""
    row = {"batch": 1, "seq": 2048, "tp": 2, "sp": True, "layer_type": "moe"}
    layer_times = [{**row, "forward_ms": 40.0, "backward_ms": 80.0},
                   {**row, "ep": 8, "forward_ms": 55.0, "backward_ms": 95.0}]
    cand = (LayerStrategy(tp=2, dp=8, sp="megatron", ep=8),)
    got = {}
    for gpus_per_node, nodes in ((8, 2), (16, 1)):
        model = make_cost_model(parse(HybridRequest, request(
            model={"preset": "mixtral-8x7b", "num_layers": 2}, cluster={"gpu": "h100", "nodes": nodes,
                                                                          "gpus_per_node": gpus_per_node},
            cost_model={"kind": "profile", "profile": {"layer_times": layer_times}})))
        got[gpus_per_node] = model.layer_costs(0, cand, _ctx(2, samples=64, micro_batches=4))  # 2 samples per rank
    assert got[16].parts_s["compute"][0] == pytest.approx(2 * (0.055 + 0.095)) and got[16].parts_s["ep_comm"][0] == 0
    assert got[8].parts_s["compute"][0] == pytest.approx(2 * (0.040 + 0.080)) and got[8].parts_s["ep_comm"][0] > 0


def test_a_profiles_measured_all_to_alls_price_the_expert_dispatch() -> None:
    """The EP dispatch / combine all-to-alls are priced from the profile's measured all-to-alls of that group size
    where it has them (as Ulysses' are); they were once priced from the analytic links alone, ~5x fast for the
    closed loop's gloo all-to-alls. Without such a measurement they stay analytic."""
    model = {"preset": "mixtral-8x7b", "num_layers": 2}
    cluster = {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8}
    # a line through the origin: 1 ms per MB held per rank, at group size 8 only
    measured = [{"op": "alltoall", "group_size": 8, "message_bytes": m, "time_ms": m / 1e6} for m in (1e6, 4e6)]
    profile = {"name": "a2a", "collectives": measured}
    plain = make_cost_model(parse(HybridRequest, request(model=model, cluster=cluster)))
    prof = make_cost_model(parse(HybridRequest, request(model=model, cluster=cluster,
                                                        cost_model={"kind": "profile", "profile": profile})))
    cands = (LayerStrategy(tp=1, dp=8, ep=8), LayerStrategy(tp=1, dp=8, ep=4))
    ctx = _ctx(2)
    got, ref = prof.layer_costs(0, cands, ctx), plain.layer_costs(0, cands, ctx)
    assert got.parts_s["ep_comm"][0] != pytest.approx(ref.parts_s["ep_comm"][0])
    assert got.parts_s["ep_comm"][1] == pytest.approx(ref.parts_s["ep_comm"][1])  # ep 4: not measured
    # ep 8: four all-to-alls (dispatch + combine, forward and backward) of the rows the busiest rank routes
    req = parse(HybridRequest, request(model=model, cluster=cluster))
    assert req.model.moe is not None
    tokens = 64 / 4 / 8 * req.training.seq_length  # samples per micro-batch per rank x sequence
    rows = moe_cost.routed_rows(tokens, moe_cost.MoEDims(req.model.hidden_size, req.model.expert_ffn_size, True, 8,
                                                         req.model.moe.top_k, req.model.moe.capacity_factor))
    nbytes = float(rows) * req.model.hidden_size * 2  # bf16
    assert got.parts_s["ep_comm"][0] == pytest.approx(4 * nbytes / 1e9)


def test_a_profiles_measured_all_to_all_prices_the_re_layout_between_layers() -> None:
    """Re-laying out the activation between two layers is one all-to-all over the stage each way, of the larger
    of the two layouts' shares: priced from the profile's all-to-all of the stage's size where it has one (it
    was once priced from the analytic links alone, ~8x fast for the closed loop's gloo exchanges)."""
    cluster = {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8}
    measured = [{"op": "alltoall", "group_size": 8, "message_bytes": m, "time_ms": m / 1e6} for m in (1e6, 4e6)]
    plain = make_cost_model(parse(HybridRequest, request(cluster=cluster)))
    prof = make_cost_model(parse(HybridRequest, request(cluster=cluster, cost_model={
        "kind": "profile", "profile": {"name": "a2a", "collectives": measured}})))
    req = parse(HybridRequest, request(cluster=cluster))
    tp8, dp8, tp2 = LayerStrategy(tp=8, dp=1, sp="megatron"), LayerStrategy(tp=1, dp=8), LayerStrategy(tp=2, dp=4)
    ctx = _ctx(2)
    got = prof.transition_s([tp8, dp8], [dp8, tp2], ctx)
    activation = 64 / 4 * req.training.seq_length * req.model.hidden_size * 2  # a micro-batch's, bf16
    # tp8 x SP and dp8 both hold 1/8 of it; tp2 x dp4 (no SP) holds 1/4: 1 ms per MB each way
    assert got[0, 0] == pytest.approx(2 * activation / 8 / 1e9)
    assert got[0, 1] == got[1, 1] == pytest.approx(2 * activation / 4 / 1e9)
    assert got[1, 0] == 0  # the same layout: nothing moves
    # negative control: without the measurement, the analytic links price it (far below the measured line here)
    ref = plain.transition_s([tp8], [dp8], ctx)
    assert 0 < ref[0, 0] < got[0, 0] / 5


def test_a_profiles_ulysses_layer_prices_the_layer_with_its_all_to_alls_inside() -> None:
    """A Ulysses layer measured as the runtime runs it (``ulysses`` rows: each rank on its samples' seq / u tokens,
    the all-to-alls around attention inside) is priced from that row, its all-to-alls not added again. A degree
    the profile lacks keeps the derived price: the tp = 1 layer at b / u samples plus the all-to-alls."""
    cluster = {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8}
    seq = parse(HybridRequest, request(cluster=cluster)).training.seq_length
    plain_rows = [{"batch": n, "seq": seq, "tp": 1, "forward_ms": 10.0 * n, "backward_ms": 20.0 * n} for n in (1, 2, 4)]
    # the measured Ulysses layer: 30 % above the plain layer's work at b / 4 samples, plus 1 ms a pass
    uly_rows = [{"batch": n, "seq": seq, "tp": 1, "ulysses": 4, "forward_ms": 1.0 + 3.25 * n,
                 "backward_ms": 1.0 + 6.5 * n} for n in (4, 8)]

    def priced(rows: list[dict[str, object]]) -> object:
        model = make_cost_model(parse(HybridRequest, request(cluster=cluster, cost_model={
            "kind": "profile", "profile": {"name": "uly", "layer_times": rows}})))
        cands = (LayerStrategy(tp=4, dp=2, sp="ulysses"), LayerStrategy(tp=2, dp=4, sp="ulysses"))
        return model.layer_costs(0, cands, _ctx(2, samples=64, micro_batches=4))  # 16 samples a micro-batch

    got, ref = priced(plain_rows + uly_rows), priced(plain_rows)
    # u = 4: 8 samples per dp rank, each rank on 8 x seq / 4 tokens: the row's line at batch 8, nothing added
    assert got.parts_s["compute"][0] == pytest.approx((1.0 + 3.25 * 8 + 1.0 + 6.5 * 8) / 1e3)
    assert got.parts_s["tp_comm"][0] == 0
    # u = 2 not measured: 4 samples per dp rank, the tp = 1 layer at 4 / 2 samples (20 + 40 ms) and the all-to-alls,
    # as without the rows
    assert got.parts_s["compute"][1] == pytest.approx(0.060) == ref.parts_s["compute"][1]
    assert got.parts_s["tp_comm"][1] == pytest.approx(ref.parts_s["tp_comm"][1]) and got.parts_s["tp_comm"][1] > 0
    # negative control: without the Ulysses rows, u = 4 is the plain layer at 8 / 4 samples plus priced all-to-alls
    assert ref.parts_s["compute"][0] == pytest.approx(0.060) and ref.parts_s["tp_comm"][0] > 0
