"""Model states and activations against the closed forms (ZeRO paper; Korthikanti et al. 2022)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from solvers.cost_model import memory as mem
from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import LayerCosts, StageContext
from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.cost_model.shapes import layer_shape
from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec
from solvers.strategy import LayerStrategy

GPT = ModelSpec(num_layers=4, hidden_size=4096, num_attention_heads=32, vocab_size=51200, mlp="gelu")
S, B, H, A = 2048, 2, 4096, 32


@pytest.mark.parametrize(("zero", "expected"), [
    (0, (2e9, 2e9, 12e9)),
    (1, (2e9, 2e9, 3e9)),
    (2, (2e9, 0.5e9, 3e9)),
    (3, (0.5e9, 0.5e9, 3e9)),
])
def test_model_states_by_zero_stage(zero: int, expected: tuple[float, float, float]) -> None:
    w, g, o = mem.model_state_bytes(1e9, 4, zero, mem.state_bytes_per_param("bf16"))
    assert (float(w), float(g), float(o)) == expected


def test_fp32_states_are_16_bytes_per_parameter() -> None:
    per = mem.state_bytes_per_param("fp32")
    assert (per.params, per.grads, per.optimizer) == (4.0, 4.0, 8.0)


def _act(tp: int, sp: int, rc: int) -> tuple[float, float]:
    kept, transient = mem.activation_bytes(layer_shape(GPT, 0), S, B, tp, 1, sp, rc)
    return float(kept), float(transient)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_no_recompute(t: int) -> None:
    # s b h (10 + 24/t + 5 a s / (h t)); t=8: 2048*2*4096*(10 + 3 + 5*32*2048/(4096*8)) = 16777216 * 23
    expected = S * B * H * (10 + 24 / t + 5 * A * S / (H * t))
    assert _act(t, mem.SP_NONE, mem.RC_NONE)[0] == pytest.approx(expected, rel=1e-12)
    if t == 8:
        assert expected == 16777216 * 23


@pytest.mark.parametrize("t", [1, 4, 8])
def test_korthikanti_sequence_parallel(t: int) -> None:
    expected = S * B * H / t * (34 + 5 * A * S / H)
    assert _act(t, mem.SP_MEGATRON, mem.RC_NONE)[0] == pytest.approx(expected, rel=1e-12)


def test_korthikanti_selective_and_full() -> None:
    t = 8
    assert _act(t, mem.SP_NONE, mem.RC_SELECTIVE)[0] == pytest.approx(S * B * H * (10 + 24 / t))
    assert _act(t, mem.SP_MEGATRON, mem.RC_SELECTIVE)[0] == pytest.approx(34 * S * B * H / t)
    assert _act(t, mem.SP_NONE, mem.RC_FULL)[0] == pytest.approx(2 * S * B * H)
    assert _act(t, mem.SP_MEGATRON, mem.RC_FULL)[0] == pytest.approx(2 * S * B * H / t)
    # a fully recomputed layer rebuilds its no-recompute activations while its backward runs
    assert _act(t, mem.SP_NONE, mem.RC_FULL)[1] == pytest.approx(_act(t, mem.SP_NONE, mem.RC_NONE)[0])
    # selective keeps the 5 a s^2 b attention core only transiently
    assert _act(t, mem.SP_NONE, mem.RC_SELECTIVE)[1] == pytest.approx(5 * A * S * S * B / t)


NO_DROPOUT = GPT.model_copy(update={"attention_dropout": 0.0, "hidden_dropout": 0.0})


@pytest.mark.parametrize("t", [1, 8])
def test_without_dropout_no_masks_and_only_the_softmax_output(t: int) -> None:
    # Korthikanti's 34 s b h + 5 a s^2 b less the two 1-byte hidden masks (2 s b h) and the attention
    # dropout's mask (a s^2 b) and output (2 a s^2 b): 32 s b h + 2 a s^2 b with SP
    shape = layer_shape(NO_DROPOUT, 0)
    kept = float(mem.activation_bytes(shape, S, B, t, 1, mem.SP_MEGATRON, mem.RC_NONE)[0])
    assert kept == pytest.approx(S * B * H / t * (32 + 2 * A * S / H), rel=1e-12)
    # without SP the replicated part is 8 s b h (was 10: the masks)
    kept = float(mem.activation_bytes(shape, S, B, t, 1, mem.SP_NONE, mem.RC_NONE)[0])
    assert kept == pytest.approx(S * B * H * (8 + 24 / t + 2 * A * S / (H * t)), rel=1e-12)
    # selective recomputation now saves only the softmax output; full recomputation is unchanged
    sel = mem.activation_bytes(shape, S, B, t, 1, mem.SP_MEGATRON, mem.RC_SELECTIVE)
    assert float(sel[0]) == pytest.approx(32 * S * B * H / t)
    assert float(sel[1]) == pytest.approx(2 * A * S * S * B / t)
    full = mem.activation_bytes(shape, S, B, t, 1, mem.SP_MEGATRON, mem.RC_FULL)[0]
    assert float(full) == pytest.approx(2 * S * B * H / t)


def test_dropout_only_where_the_model_has_it() -> None:
    attention_only = GPT.model_copy(update={"hidden_dropout": 0.0})
    hidden_only = GPT.model_copy(update={"attention_dropout": 0.0})
    base = float(_act(1, mem.SP_NONE, mem.RC_NONE)[0])

    def kept(m: ModelSpec) -> float:
        return float(mem.activation_bytes(layer_shape(m, 0), S, B, 1, 1, mem.SP_NONE, mem.RC_NONE)[0])

    assert base - kept(attention_only) == pytest.approx(2 * S * B * H)
    assert base - kept(hidden_only) == pytest.approx(3 * A * S * S * B)
    # the Llama-family presets train without dropout, GPT-3's keep Megatron's 0.1
    assert ModelSpec.model_validate({"preset": "llama2-70b"}).attention_dropout == 0.0
    assert ModelSpec.model_validate({"preset": "gpt3-175b"}).attention_dropout == pytest.approx(0.1)


def test_gqa_and_swiglu_change_only_their_tensors() -> None:
    gqa = GPT.model_copy(update={"num_kv_heads": 8})
    dense = layer_shape(GPT, 0)
    grouped = layer_shape(gqa, 0)
    # K and V shrink from 2 s b h each to 2 s b h / 4 each: 4 s b h * (1 - 1/4) fewer bytes, split over t
    diff = float(mem.activation_bytes(dense, S, B, 1, 1, 0, 0)[0] - mem.activation_bytes(grouped, S, B, 1, 1, 0, 0)[0])
    assert diff == pytest.approx(4 * S * B * H * 0.75)
    swiglu = GPT.model_copy(update={"mlp": "swiglu", "ffn_hidden_size": 4 * H})
    # SwiGLU keeps gate, up and their product (6 s b f) instead of GeLU's input and output (4 s b f)
    extra = float(mem.activation_bytes(layer_shape(swiglu, 0), S, B, 1, 1, 0, 0)[0]
                  - mem.activation_bytes(dense, S, B, 1, 1, 0, 0)[0])
    assert extra == pytest.approx(2 * S * B * 4 * H)


def test_context_parallel_splits_everything() -> None:
    one = mem.activation_bytes(layer_shape(GPT, 0), S, B, 2, 1, mem.SP_MEGATRON, mem.RC_NONE)[0]
    four = mem.activation_bytes(layer_shape(GPT, 0), S, B, 2, 4, mem.SP_MEGATRON, mem.RC_NONE)[0]
    assert float(four) == pytest.approx(float(one) / 4)


@pytest.mark.parametrize("attention", ["unfused", "fused"])
def test_layer_costs_states_match_closed_form(attention: str) -> None:
    cluster = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})
    training = TrainingSpec.model_validate({"global_batch_size": 32, "seq_length": S,
                                            "stack": {"attention": attention}})
    model = AnalyticCostModel(GPT, cluster, training)
    ctx = StageContext(pp=1, stage=0, micro_batches=4, micro_batch_samples=8)
    cands = [LayerStrategy(tp=2, dp=4, zero=z) for z in range(4)]
    c = model.layer_costs(0, cands, ctx)
    p = GPT.layer_params(0) / 2  # parameters this tensor-parallel rank holds
    expected = np.array([16 * p, 2 * p + 2 * p + 12 * p / 4, 2 * p + (2 + 12) * p / 4, 16 * p / 4])
    np.testing.assert_allclose(c.state_bytes, expected, rtol=1e-12)
    np.testing.assert_allclose(c.memory_parts_bytes["parameters"] + c.memory_parts_bytes["gradients"]
                               + c.memory_parts_bytes["optimizer"], c.state_bytes)
    # activations: micro-batch of 8 over dp=4 -> b=2 samples per rank, plain TP, no recompute, + fragmentation;
    # fused attention keeps none of the 5 a s² b scores (Korthikanti's last term)
    kept = S * 2 * H * (10 + 24 / 2 + (5 * A * S / (H * 2) if attention == "unfused" else 0))
    np.testing.assert_allclose(c.activation_bytes, kept * (1 + model.cal.fragmentation), rtol=1e-12)


def test_context_parallel_ranks_are_weight_replicas() -> None:
    """cp ranks hold the same weights and see different tokens: their gradients are summed (a DP-like sync
    over dp x cp) and ZeRO shards over dp x cp, as Megatron's distributed optimizer does."""
    cluster = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})
    model = AnalyticCostModel(GPT, cluster, TrainingSpec(global_batch_size=32, seq_length=S))
    ctx = StageContext(pp=1, stage=0, micro_batches=4, micro_batch_samples=8)
    p = GPT.layer_params(0) / 2
    cp_only = model.layer_costs(0, [LayerStrategy(tp=2, cp=4, dp=1, zero=z) for z in (0, 1)], ctx)
    np.testing.assert_allclose(cp_only.state_bytes, [16 * p, 4 * p + 12 * p / 4], rtol=1e-12)
    # the same 4-way replica group, once as cp and once as dp, needs the same gradient sync per step
    as_dp = model.layer_costs(0, [LayerStrategy(tp=2, dp=4, zero=0)], ctx)
    assert float(cp_only.step_parts_s["dp_comm_exposed"][0] + cp_only.step_parts_s["optimizer"][0]) > 0
    np.testing.assert_allclose(cp_only.step_time_s[0], as_dp.step_time_s[0], rtol=1e-12)


def test_zero1_reduce_scatters_gradients_and_gathers_weights() -> None:
    """ZeRO-1 (Megatron's distributed optimizer) moves the fp32 gradients once (a reduce-scatter) and the
    bf16 weights once (an all-gather): half an all-reduce of each, where ZeRO-0 all-reduces the gradients."""
    cluster = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8})
    ctx = StageContext(pp=1, stage=0, micro_batches=4, micro_batch_samples=16)

    def exposed(zero: int, grad_bytes: float) -> float:
        cal = replace(DEFAULT_CALIBRATION, dp_overlap=0.0, grad_comm_bytes=grad_bytes)
        model = AnalyticCostModel(GPT, cluster, TrainingSpec(global_batch_size=64, seq_length=S), calibration=cal)
        c = model.layer_costs(0, [LayerStrategy(tp=2, dp=8, zero=zero)], ctx)
        return float(c.step_parts_s["dp_comm_exposed"][0])

    grads_all_reduced, weights_all_reduced = exposed(0, 4.0), exposed(0, 2.0)
    assert exposed(1, 4.0) == pytest.approx(0.5 * grads_all_reduced + 0.5 * weights_all_reduced, rel=1e-12)
    assert exposed(1, 4.0) < grads_all_reduced


LLAMA = ModelSpec(num_layers=4, hidden_size=4096, num_attention_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                  vocab_size=128256, mlp="swiglu", hidden_dropout=0.0, attention_dropout=0.0)


@pytest.mark.parametrize(("t", "sp"), [(1, mem.SP_NONE), (2, mem.SP_MEGATRON), (4, mem.SP_NONE), (2, mem.SP_ULYSSES)])
def test_torchtitan_per_op_selective_keeps_the_input_attention_output_and_every_other_matmul(t: int, sp: int) -> None:
    """torchtitan's per-op policy on a Llama layer (q, k, v, o, w1, w3, w2 run in that order): it keeps the input,
    the attention kernel's output and the outputs of q, v, w1 and w2, at 2 bytes an element; q, v, w1 and the
    attention output split over t, the input over t only with SP, w2's output (a partial sum) whole but
    under Ulysses; with Megatron's SP also the two reduce-scatters' outputs (after o and after w2), split over t."""
    h, q, kv, ffn = 4096, 4096, 1024, 14336
    shape = layer_shape(LLAMA, 0)
    tokens = S * B
    ulysses = sp == mem.SP_ULYSSES  # every tensor's tokens split over the group
    scattered = 2 * h / t if sp == mem.SP_MEGATRON else 0.0
    expected = tokens * 2 * (h / (t if sp != mem.SP_NONE else 1) + (q + q + kv + ffn) / t + h / (t if ulysses else 1)
                             + scattered)
    kept, transient = mem.activation_bytes(shape, S, B, t, 1, sp, mem.RC_SELECTIVE, flash=True, per_op=True)
    none = float(mem.activation_bytes(shape, S, B, t, 1, sp, mem.RC_NONE, flash=True)[0])
    assert float(kept) == pytest.approx(expected, rel=1e-12)
    assert float(transient) == pytest.approx(none - expected, rel=1e-12)  # the rest is rebuilt in backward
    # Megatron's selective on fused attention keeps what no recomputation keeps: there is no s^2 core to drop
    megatron = float(mem.activation_bytes(shape, S, B, t, 1, sp, mem.RC_SELECTIVE, flash=True)[0])
    assert megatron == pytest.approx(none) and float(kept) < 0.7 * none


@pytest.mark.parametrize(("sp", "replayed"), [(mem.SP_MEGATRON, 0.5), (mem.SP_NONE, 0.5), (mem.SP_ULYSSES, 1.0)])
def test_torchtitan_per_op_selective_replays_the_collectives_it_does_not_save(sp: int, replayed: float) -> None:
    """torchtitan's per-op recompute runs again the collectives whose outputs it does not keep: under SP (the only
    TP torchtitan runs) the two all-gathers in front of k and w3, half the layer's forward TP traffic (it keeps
    the reduce-scatters' outputs); layouts it does not run by analogy, without SP half too, under Ulysses every
    all-to-all. With no TP overlap a layer's TP time is its forward collectives twice, so a slower link adds to
    the recompute that share of what it adds to ``tp_comm``; Megatron's selective replays no collective."""
    sp_name = {mem.SP_NONE: None, mem.SP_MEGATRON: "megatron", mem.SP_ULYSSES: "ulysses"}[sp]
    ctx = StageContext(pp=1, stage=0, micro_batches=2, micro_batch_samples=2)

    def parts(framework: str, link_GBps: float) -> dict[str, float]:
        cluster = ClusterSpec(gpu="H100-SXM", nodes=1, gpus_per_node=8, intra_node_bandwidth_GBps=link_GBps)
        training = TrainingSpec(global_batch_size=4, seq_length=8192,
                                stack={"framework": framework, "tp_comm_overlap": "none"})
        model = AnalyticCostModel(LLAMA, cluster, training)
        strategy = LayerStrategy(tp=4, dp=2, sp=sp_name, recompute="selective")
        costs = model.layer_costs(0, [strategy], ctx)
        return {k: float(costs.parts_s[k][0]) for k in ("recompute", "tp_comm")}

    for framework, share in (("torchtitan", replayed / 2), ("megatron-core", 0.0)):
        fast, slow = parts(framework, 450.0), parts(framework, 150.0)
        assert slow["tp_comm"] > 1.5 * fast["tp_comm"] > 0
        assert slow["recompute"] - fast["recompute"] == pytest.approx(share * (slow["tp_comm"] - fast["tp_comm"]),
                                                                      rel=1e-9, abs=1e-12)


MIXTRAL = ModelSpec(num_layers=2, hidden_size=4096, num_attention_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                    vocab_size=32000, mlp="swiglu", hidden_dropout=0.0, attention_dropout=0.0,
                    moe={"num_experts": 8, "top_k": 2})


def test_torchtitan_per_op_selective_keeps_no_expert_output_and_recomputes_every_expert_gemm() -> None:
    """torchtitan runs an MoE layer's experts as grouped GEMMs, which its per-op policy does not save: of the layer
    it keeps the input, the attention output, q and v; the experts' GEMMs all run again in backward (so a wider
    expert adds to the recompute a third of what it adds to the forward and backward, against a ninth of the GEMMs
    for a dense SwiGLU, whose w1 and w2 are kept); with expert parallelism it keeps the dispatch and combine
    all-to-alls' outputs (each the busiest rank's routed rows: tokens x top-k x 1.2, the load over the mean)."""
    h, q, kv = 4096, 4096, 1024
    shape = layer_shape(MIXTRAL, 0)
    kept, _ = mem.activation_bytes(shape, S, B, 1, 1, mem.SP_NONE, mem.RC_SELECTIVE, flash=True, per_op=True)
    assert float(kept) == pytest.approx(S * B * 2 * (h + q + q + kv), rel=1e-12)

    cluster = ClusterSpec(gpu="H100-SXM", nodes=1, gpus_per_node=8)
    training = TrainingSpec(global_batch_size=2, seq_length=S, stack={"framework": "torchtitan"})
    ctx = StageContext(pp=1, stage=0, micro_batches=1, micro_batch_samples=2 * B)

    def costs(model: ModelSpec, ep: int) -> LayerCosts:
        return AnalyticCostModel(model, cluster, training).layer_costs(
            0, [LayerStrategy(tp=1, dp=2, ep=ep, recompute="selective")], ctx)

    def parts(model: ModelSpec) -> tuple[float, float]:
        c = costs(model, 1)
        return float(c.parts_s["compute"][0]), float(c.parts_s["recompute"][0])

    def wider_expert_share(model: ModelSpec) -> float:
        (c1, r1), (c2, r2) = parts(model), parts(model.model_copy(update={"ffn_hidden_size": 2 * 14336}))
        return (r2 - r1) / (c2 - c1)

    assert wider_expert_share(MIXTRAL) == pytest.approx(1 / 3, rel=1e-9)
    assert wider_expert_share(LLAMA) < 0.2  # (a ninth of the GEMMs, its elementwise ops besides)
    routed = S * B * 2 * 1.2 * h * 2  # one all-to-all's rows on the busiest rank, 2-byte elements
    frag = 1 + DEFAULT_CALIBRATION.fragmentation  # (the allocator's share on every activation)
    assert float(costs(MIXTRAL, 2).activation_bytes[0] - costs(MIXTRAL, 1).activation_bytes[0]) == pytest.approx(
        2 * routed * frag, rel=1e-9)
