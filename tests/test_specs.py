"""Specs and presets: closed-form parameter counts, preset expansion, errors that name the field."""

from __future__ import annotations

import math
from typing import Any

import pytest

from solvers.errors import SpecError
from solvers.presets import MODEL_PRESETS, model_from_hf_config
from solvers.request import HybridRequest, parse
from solvers.specs import ClusterSpec, ModelSpec, memory_limit_bytes


def test_llama2_7b_parameter_count_matches_closed_form() -> None:
    m = ModelSpec.model_validate({"preset": "llama2-7b"})
    h, f, v, L = 4096, 11008, 32000, 32
    per_layer = 4 * h * h + 3 * h * f + 2 * h
    assert m.layer_params() == per_layer
    assert m.total_params() == L * per_layer + 2 * v * h + h
    assert 6.7e9 < m.total_params() < 6.8e9  # the published 6.74B


def test_gqa_and_moe_counts() -> None:
    m = ModelSpec.model_validate({"preset": "mixtral-8x7b"})
    h, kv_dim = 4096, 8 * 128
    attn = h * h + 2 * h * kv_dim + h * h
    assert m.attention_params() == attn
    assert m.layer_params() == attn + 8 * 3 * h * 14336 + h * 8 + 2 * h
    assert 46.0e9 < m.total_params() < 47.5e9  # Mixtral's 46.7B


def test_preset_overrides_and_defaults() -> None:
    m = ModelSpec.model_validate({"preset": "llama2-7b", "num_layers": 4})
    assert m.num_layers == 4 and m.hidden_size == 4096
    g = ModelSpec.model_validate({"num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "mlp": "swiglu"})
    assert g.ffn_size == 11008 and g.kv_heads == 32
    assert ModelSpec.model_validate({"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8}).ffn_size == 2048


def test_every_model_preset_validates() -> None:
    for name in MODEL_PRESETS:
        assert ModelSpec.model_validate({"preset": name}).total_params() > 0


def test_gpu_preset_by_string_and_object() -> None:
    c = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8})
    assert c.gpu.peak_tflops == 312 and c.num_gpus == 16 and c.intra_GBps == 300
    c2 = ClusterSpec.model_validate({"gpu": {"name": "H100-SXM", "memory_gib": 64}, "nodes": 1})
    assert c2.gpu.memory_gib == 64 and c2.gpu.peak_tflops == 989
    assert ClusterSpec.model_validate({"gpu": "h100", "inter_node_bandwidth_Gbps": 800}).inter_GBps_per_gpu == 12.5



# What the devices give CUDA, MiB (torch.cuda.get_device_properties().total_memory, or the "total capacity"
# of an out-of-memory message), the least seen in public logs; the H800 has the H100's memory.
DEVICE_REPORTED_MIB = {"A100-40GB": 40536, "A100-80GB": 81050, "H100-SXM": 81082, "H800": 81082, "H200": 143156,
                       "L4": 22559, "RTX-4090": 24563, "B200": 182631}


@pytest.mark.parametrize(("gpu", "reported_mib"), sorted(DEVICE_REPORTED_MIB.items()))
def test_default_memory_limit_is_what_the_device_reports_not_the_marketed_size(gpu: str, reported_mib: int) -> None:
    """A plan sized to the marketed 80 GB does not start on an H100, which gives CUDA 79.2 GiB: the default
    limit must not exceed what the device reports, nor waste more than half a GiB of it."""
    limit = memory_limit_bytes(ClusterSpec.model_validate({"gpu": gpu}), None)
    assert reported_mib * 2**20 - 0.5 * 2**30 <= limit <= reported_mib * 2**20

@pytest.mark.parametrize(
    ("patch", "loc"),
    [
        ({"model": {"preset": "no-such-model"}}, ("model",)),
        ({"cluster": {"gpu": "Z9000"}}, ("cluster", "gpu")),
        ({"model": {"num_layers": 2, "hidden_size": 100, "num_attention_heads": 3}}, ("model",)),
        ({"training": {"global_batch_size": 0}}, ("training", "global_batch_size")),
        ({"model": {"preset": "llama2-7b", "num_layer": 3}}, ("model", "num_layer")),
        # Python's JSON reader (the CLI's and the server's) accepts Infinity and NaN: no spec number may be either
        ({"cluster": {"gpu": {"name": "x", "peak_tflops": 300, "memory_gib": float("inf")}}},
         ("cluster", "gpu", "memory_gib")),
        ({"cluster": {"gpu": "A100-80GB", "inter_node_bandwidth_Gbps": float("nan")}},
         ("cluster", "inter_node_bandwidth_Gbps")),
        ({"constraints": {"memory_limit_gib": float("inf")}}, ("constraints", "memory_limit_gib")),
        # Finite but beyond any hardware: times overflowed to inf and the planner blamed the memory limit.
        ({"cluster": {"gpu": {"name": "x", "peak_tflops": 1e-300, "memory_gib": 80}}},
         ("cluster", "gpu", "peak_tflops")),
        ({"cluster": {"gpu": "A100-80GB", "intra_node_bandwidth_GBps": 1e-300}},
         ("cluster", "intra_node_bandwidth_GBps")),
        ({"training": {"global_batch_size": 8, "seq_length": 2**40}}, ("training", "seq_length")),
        ({"model": {"preset": "llama2-7b", "hidden_size": 2**40}}, ("model", "hidden_size")),
        # a JSON true is no count (lax validation read it as 1 layer)
        ({"model": {"preset": "llama2-7b", "num_layers": True}}, ("model", "num_layers")),
        ({"training": {"global_batch_size": True}}, ("training", "global_batch_size")),
        # 1e308 experts overflowed the FLOP count (OverflowError: HTTP 500); 2^31 gave negative memory
        ({"model": {"preset": "mixtral-8x7b", "moe": {"num_experts": 10**308}}}, ("model", "moe", "num_experts")),
        ({"model": {"preset": "mixtral-8x7b", "moe": {"num_experts": 2**31}}}, ("model", "moe", "num_experts")),
    ],
)
def test_bad_specs_name_the_field(patch: dict, loc: tuple) -> None:
    req = {"kind": "hybrid", "model": {"preset": "llama2-7b"}, "cluster": {"gpu": "A100-80GB"},
           "training": {"global_batch_size": 8}}
    req.update(patch)
    with pytest.raises(SpecError) as info:
        parse(HybridRequest, req)
    assert any(tuple(p.loc[: len(loc)]) == loc for p in info.value.problems), info.value
    assert str(info.value)


def test_hf_config_import() -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu"}
    m = ModelSpec.model_validate(model_from_hf_config(cfg, name="l3"))
    assert m == ModelSpec.model_validate({"preset": "llama3-8b", "name": "l3"})
    mix = model_from_hf_config({**cfg, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2})
    assert ModelSpec.model_validate(mix).moe is not None
    # dropout as each family spells it; a Llama config without the key trains without dropout
    assert (m.attention_dropout, m.hidden_dropout) == (0.0, 0.0)
    gpt2 = ModelSpec.model_validate(model_from_hf_config(
        {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
         "attn_pdrop": 0.1, "resid_pdrop": 0.05}))
    assert (gpt2.attention_dropout, gpt2.hidden_dropout) == (0.1, 0.05)
    bert = ModelSpec.model_validate(model_from_hf_config(
        {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.2}))
    assert (bert.attention_dropout, bert.hidden_dropout) == (0.0, 0.2)
    # Falcon spells one KV head multi_query, and its newer architecture num_kv_heads (71 KV heads made
    # Falcon-7B 8.5 B parameters)
    falcon = {"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71,
              "vocab_size": 65024}
    assert ModelSpec.model_validate(model_from_hf_config({**falcon, "multi_query": True})).kv_heads == 1
    assert ModelSpec.model_validate(model_from_hf_config({**falcon, "num_kv_heads": 1})).kv_heads == 1
    assert ModelSpec.model_validate(model_from_hf_config(falcon)).kv_heads == 71
    # a size the request gives alongside the config need not be in it
    assert ModelSpec.model_validate({"hf_config": {"n_embd": 64, "n_head": 4}, "num_layers": 3}).num_layers == 3



@pytest.mark.parametrize(("change", "key"), [
    ({"model_type": "t5", "num_layers": None, "d_model": 512, "num_heads": 8}, "num_layers"),  # 0 layers
    ({"model_type": "t5", "num_layers": [2], "d_model": 512, "num_heads": 8}, "num_layers"),
    ({"model_type": "t5", "num_layers": 2, "num_decoder_layers": "two", "d_model": 512, "num_heads": 8},
     "num_decoder_layers"),
    ({"num_local_experts": [8]}, "num_local_experts"),
    ({"num_experts": 8, "num_experts_per_tok": {"k": 2}}, "num_experts_per_tok"),
    ({"num_experts": 8, "moe_intermediate_size": 25.5}, "moe_intermediate_size"),
    ({"num_experts": 8, "decoder_sparse_step": "x"}, "decoder_sparse_step"),
    ({"attention_dropout": [0.1]}, "attention_dropout"),
    ({"resid_pdrop": "x"}, "resid_pdrop"),
    # past float's range: OverflowError escaped the validator (HTTP 500, a CLI traceback)
    ({"num_local_experts": 10**400}, "num_local_experts"),
    ({"attn_pdrop": 10**400}, "attn_pdrop"),
    # a JSON true is no size (it was read as 1), a string no flag (bool("false") is true)
    ({"n_layer": True}, "n_layer"),
    ({"n_embd": True}, "n_embd"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    # a wrong type is named by the config's key, not the spec field derived from it
    ({"n_head": "abc"}, "n_head"),
    # no key for a required size: each key the importer reads is named
    ({"n_layer": None}, "n_layer, num_layers"),
])
def test_hf_config_values_of_the_wrong_type_name_the_key(change: dict[str, Any], key: str) -> None:
    """(Lists, objects and nulls raised TypeError out of the model's validator: HTTP 500.)"""
    cfg = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, **change}
    req = {"model": {"hf_config": cfg}, "cluster": {"gpu": "A100-80GB"}, "training": {"global_batch_size": 8}}
    with pytest.raises(SpecError) as info:
        parse(HybridRequest, req)
    assert [p.loc[0] for p in info.value.problems] == ["model"]
    assert key in str(info.value)


# Qwen3-30B-A3B's config.json (the fields that shape the model): 30.5 B parameters as published
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 48,
             "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
             "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
             "hidden_act": "silu", "tie_word_embeddings": False}


def test_hf_moe_config_import_counts_the_published_parameters() -> None:
    m = ModelSpec.model_validate({"hf_config": QWEN3_MOE, "name": "qwen3-30b-a3b"})
    assert m.name == "qwen3-30b-a3b" and m.moe is not None
    assert (m.moe.num_experts, m.moe.top_k, m.moe.expert_ffn_hidden_size) == (128, 8, 768)
    assert round(m.total_params() / 1e9, 1) == 30.5
    # embedding 2 x 151936 x 2048; per layer attention (32 + 2 x 4) x 128 x 2048 + 32 x 128 x 2048, router
    # 128 x 2048, 128 experts of 3 x 2048 x 768 (norms excluded)
    per_layer = 40 * 128 * 2048 + 32 * 128 * 2048 + 128 * 2048 + 128 * 3 * 2048 * 768
    assert abs(m.total_params() - (2 * 151936 * 2048 + 48 * per_layer)) / m.total_params() < 1e-3
    # every other layer sparse (Qwen's decoder_sparse_step) maps onto the spec's own convention
    sparse2 = ModelSpec.model_validate({"hf_config": {**QWEN3_MOE, "decoder_sparse_step": 2}})
    assert [sparse2.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    # a multimodal config is read from its text_config
    wrapped = {"model_type": "some_vlm", "text_config": QWEN3_MOE, "vision_config": {"hidden_size": 1}}
    assert ModelSpec.model_validate({"hf_config": wrapped}).total_params() == m.total_params()


@pytest.mark.parametrize("key,value", [("kv_lora_rank", 512), ("n_shared_experts", 2),
                                       ("shared_expert_intermediate_size", 5632), ("first_k_dense_replace", 1),
                                       ("mlp_only_layers", [0, 1])])
def test_hf_config_with_an_unmodelled_feature_is_refused_naming_the_key(key: str, value: object) -> None:
    """Importing DeepSeek's latent attention or Qwen2-MoE's shared expert as a plain MoE would count the
    wrong parameters, FLOPs and memory: refused, naming the key, at parse time."""
    req = {"kind": "hybrid", "model": {"hf_config": {**QWEN3_MOE, key: value}}, "cluster": {"gpu": "A100-80GB"},
           "training": {"global_batch_size": 8}}
    with pytest.raises(SpecError) as info:
        parse(HybridRequest, req)
    assert info.value.problems[0].loc[0] == "model" and key in str(info.value)
    with pytest.raises(SpecError) as info:
        parse(HybridRequest, {**req, "model": {"hf_config": "config.json"}})  # a server reads no paths
    assert "config.json" in str(info.value)


def test_a_global_batch_beyond_any_training_run_is_refused() -> None:
    """(2^63 samples was accepted, and planning it ran for minutes enumerating the batch's divisors.)"""
    req = {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "A100-80GB"},
           "training": {"global_batch_size": 2**63}}
    with pytest.raises(SpecError) as info:
        parse(HybridRequest, req)
    assert [p.loc for p in info.value.problems] == [("training", "global_batch_size")]
    assert parse(HybridRequest, {**req, "training": {"global_batch_size": 2**40}})


def test_a_gpu_at_the_edge_of_the_ranges_is_planned_with_finite_numbers() -> None:
    """The ranges are what float arithmetic prices: the slowest GPU and links they allow still give a plan."""
    from solvers.specs import MIN_BANDWIDTH, MIN_TFLOPS
    from tests.contract_json import solve

    req = {"kind": "hybrid", "model": {"preset": "llama2-7b", "num_layers": 2},
           "cluster": {"gpu": {"name": "x", "peak_tflops": MIN_TFLOPS, "memory_gib": 80}, "gpus_per_node": 4,
                       "intra_node_bandwidth_GBps": MIN_BANDWIDTH},
           "training": {"global_batch_size": 8}}
    slow = solve(req)["estimate"]["step_time_s"]
    fast = solve({**req, "cluster": {**req["cluster"], "gpu": {"name": "x", "peak_tflops": 1.0, "memory_gib": 80},
                                     "intra_node_bandwidth_GBps": 1.0}})["estimate"]["step_time_s"]
    assert math.isfinite(slow) and slow > 1e5 * fast
