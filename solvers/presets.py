"""Presets for GPUs and models (public spec sheets and model cards).

GPU peaks are dense tensor-core TFLOP/s (no sparsity); bandwidths are those of the usual system
(DGX/HGX): NVLink per GPU per direction, and all NICs of a node together.

``memory_gib`` is what the device gives CUDA (``torch.cuda.get_device_properties().total_memory``, the
"total capacity" of a CUDA out-of-memory message), rounded down, not the marketed size: an "80 GB" A100 or
H100 reports 79.15-79.2 GiB, so a plan the model puts at 79.9 GiB would not start. It is the default memory
limit of every request; the cost model's reserve (CUDA context, workspaces) comes out of it.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from solvers.errors import shown

# Dense peaks (the datasheets' sparsity figures halved), one-direction NVLink / Infinity Fabric bandwidth per GPU
# (the datasheets give both directions together), and the NICs of the vendor's 8-GPU reference system together.
# ``source`` names the datasheets; where a figure is assumed rather than read there, the source says so.
_DGX_A100 = {"intra_node_bandwidth_GBps": 300, "inter_node_bandwidth_Gbps": 1600}  # NVLink 3: 600 GB/s; 8x200 Gb/s
_HGX_H100 = {"intra_node_bandwidth_GBps": 450, "inter_node_bandwidth_Gbps": 3200}  # NVLink 4: 900 GB/s; 8x400 Gb/s
# Measured matmul throughput (``matmul_tflops``, ``matmul_tflops_fp8``: solvers/cost_model/matmul.py): the maximum
# achievable matmul FLOPS table of stas00/ml-engineering, compute/accelerator/README.md (mamf-finder.py, mean of
# 100 iterations of the best shape found; the v2 tables). Commit b9e29720 gives A100 SXM 271.2, H100 SXM 794.5 and
# 1402.6 (FP8), MI300X 668.4 (PYTORCH_TUNABLEOP_ENABLED=1); a later revision adds H200 1453.4 (FP8; its bf16 row
# says "H200 is the same" as the H100's) and B200 1745.0 and 3432.5. GPUs absent from that table state none.
_MAMF = "; matmul_tflops: maximum achievable matmul FLOPS table, stas00/ml-engineering (see solvers/presets.py)"
_MAMF_A100 = {"matmul_tflops": 271.2}  # the reference GPU of the shipped constants (matmul.REFERENCE_SHARE)
_MAMF_H100 = {"matmul_tflops": 794.5, "matmul_tflops_fp8": 1402.6}
GPU_PRESETS: dict[str, dict[str, Any]] = {
    "a100-40gb": {"name": "A100-40GB", "peak_tflops": 312, "peak_tflops_fp32": 19.5, "memory_gib": 39.5,
                  "memory_bandwidth_GBps": 1555, **_DGX_A100, **_MAMF_A100,
                  "source": "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB); NVIDIA DGX A100 datasheet (links)"
                            + _MAMF},
    "a100-80gb": {"name": "A100-80GB", "peak_tflops": 312, "peak_tflops_fp32": 19.5, "memory_gib": 79.1,
                  "memory_bandwidth_GBps": 2039, **_DGX_A100, **_MAMF_A100,
                  "source": "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); NVIDIA DGX A100 datasheet (links)"
                            + _MAMF},
    "h100-sxm": {"name": "H100-SXM", "peak_tflops": 989, "peak_tflops_fp8": 1979, "peak_tflops_fp32": 67,
                 "memory_gib": 79.1, "memory_bandwidth_GBps": 3350, **_HGX_H100, **_MAMF_H100,
                 "source": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM); NVIDIA DGX H100 datasheet (links)"
                           + _MAMF},
    "h100-pcie": {"name": "H100-PCIe", "peak_tflops": 756, "peak_tflops_fp8": 1513, "peak_tflops_fp32": 51,
                  "memory_gib": 79.1, "memory_bandwidth_GBps": 2000, "intra_node_bandwidth_GBps": 64,
                  "inter_node_bandwidth_Gbps": 1600,
                  "source": "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe); intra-node: PCIe Gen5 x16, 64 GB/s "
                            "a direction (the 600 GB/s NVLink bridge joins pairs only); network: assumed, one "
                            "400 Gb/s NIC per two GPUs (no reference system)"},
    "h200": {"name": "H200", "peak_tflops": 989, "peak_tflops_fp8": 1979, "peak_tflops_fp32": 67,
             "memory_gib": 139.8, "memory_bandwidth_GBps": 4800, **_HGX_H100, "matmul_tflops": 794.5,
             "matmul_tflops_fp8": 1453.4,
             "source": "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM); NVIDIA HGX H200 (NVLink 4, 8x400 Gb/s)"
                       + _MAMF},
    "h800": {"name": "H800", "peak_tflops": 989, "peak_tflops_fp8": 1979, "peak_tflops_fp32": 67,
             "memory_gib": 79.1, "memory_bandwidth_GBps": 3350, "intra_node_bandwidth_GBps": 200,
             "inter_node_bandwidth_Gbps": 3200, **_MAMF_H100,
             "source": "H100 SXM datasheet figures with NVLink cut to 400 GB/s (NVIDIA H800 product brief); "
                       "matmul_tflops: the H100 SXM's measured figures (the same chip), not measured on an H800"},
    "l4": {"name": "L4", "peak_tflops": 121, "peak_tflops_fp8": 242, "peak_tflops_fp32": 30, "memory_gib": 22.0,
           "memory_bandwidth_GBps": 300, "intra_node_bandwidth_GBps": 16, "inter_node_bandwidth_Gbps": 200,
           "source": "NVIDIA L4 Tensor Core GPU datasheet; links assumed: PCIe Gen4 x8, 200 Gb/s per node"},
    "l40s": {"name": "L40S", "peak_tflops": 362, "peak_tflops_fp8": 733, "peak_tflops_fp32": 91.6,
             "memory_gib": 44.4, "memory_bandwidth_GBps": 864, "intra_node_bandwidth_GBps": 32,
             "inter_node_bandwidth_Gbps": 1600,
             "source": "NVIDIA L40S GPU datasheet (48 GB GDDR6 with ECC: memory_gib estimated, not read from a "
                       "device); intra-node: PCIe Gen4 x16, 32 GB/s a direction (no NVLink); network: assumed, one "
                       "400 Gb/s NIC per two GPUs"},
    "rtx-4090": {"name": "RTX-4090", "peak_tflops": 165, "peak_tflops_fp8": 330, "peak_tflops_fp32": 82.6,
                 "memory_gib": 23.9, "memory_bandwidth_GBps": 1008, "intra_node_bandwidth_GBps": 16,
                 "inter_node_bandwidth_Gbps": 100,
                 "source": "NVIDIA Ada Lovelace architecture whitepaper (RTX 4090, FP16 accumulate); links assumed"},
    "b200": {"name": "B200", "peak_tflops": 2250, "peak_tflops_fp8": 4500, "peak_tflops_fp32": 80,
             "memory_gib": 178.3, "memory_bandwidth_GBps": 8000, "intra_node_bandwidth_GBps": 900,
             "inter_node_bandwidth_Gbps": 3200, "matmul_tflops": 1745.0, "matmul_tflops_fp8": 3432.5,
             "source": "NVIDIA DGX B200 datasheet (per GPU: 72 PF FP8 and 36 PF BF16 sparse per 8 GPUs, 64 TB/s "
                       "HBM3e, NVLink 5 1.8 TB/s, 8x400 Gb/s ConnectX-7)" + _MAMF},
    "mi300x": {"name": "MI300X", "peak_tflops": 1307.4, "peak_tflops_fp8": 2614.9, "peak_tflops_fp32": 163.4,
               "memory_gib": 191.5, "memory_bandwidth_GBps": 5300, "intra_node_bandwidth_GBps": 448,
               "inter_node_bandwidth_Gbps": 3200, "matmul_tflops": 668.4,
               "source": "AMD Instinct MI300X accelerator data sheet (dense matrix peaks, 192 GB HBM3 at 5.3 TB/s; "
                         "memory_gib estimated); AMD Instinct MI300X platform data sheet (Infinity Fabric: 7 links "
                         "of 64 GB/s a direction to the node's other GPUs; 8x400 Gb/s assumed, as HGX)" + _MAMF},
    # A CPU host for tests and demos: gpus_per_node is the number of gloo processes. Speed comes from
    # the worker's profile when one exists; these are modest defaults for a laptop-class core.
    "cpu": {"name": "cpu", "peak_tflops": 0.2, "peak_tflops_fp32": 0.2, "memory_gib": 4,
            "memory_bandwidth_GBps": 20, "intra_node_bandwidth_GBps": 5, "inter_node_bandwidth_Gbps": 10,
            "source": "modest defaults for a laptop-class core (no datasheet); a worker profile replaces them"},
}
GPU_PRESETS["rtx4090"] = GPU_PRESETS["rtx-4090"]
GPU_PRESETS["h100"] = GPU_PRESETS["h100-sxm"]
GPU_PRESETS["h200-sxm"] = GPU_PRESETS["h200"]
GPU_PRESETS["mi300"] = GPU_PRESETS["mi300x"]

_GPT = {"mlp": "gelu", "vocab_size": 51200}
_NO_DROPOUT = {"attention_dropout": 0.0, "hidden_dropout": 0.0}
_LLAMA2 = {"mlp": "swiglu", "vocab_size": 32000, **_NO_DROPOUT}
_LLAMA3 = {"mlp": "swiglu", "vocab_size": 128256, **_NO_DROPOUT}
_QWEN2 = {"mlp": "swiglu", "vocab_size": 152064, **_NO_DROPOUT}

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "gpt3-1.3b": {**_GPT, "name": "gpt3-1.3b", "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16},
    "gpt3-2.7b": {**_GPT, "name": "gpt3-2.7b", "num_layers": 32, "hidden_size": 2560, "num_attention_heads": 32},
    "gpt3-6.7b": {**_GPT, "name": "gpt3-6.7b", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32},
    "gpt3-13b": {**_GPT, "name": "gpt3-13b", "num_layers": 40, "hidden_size": 5120, "num_attention_heads": 40},
    "gpt3-175b": {**_GPT, "name": "gpt3-175b", "num_layers": 96, "hidden_size": 12288,
                  "num_attention_heads": 96},
    "llama2-7b": {**_LLAMA2, "name": "llama2-7b", "num_layers": 32, "hidden_size": 4096,
                  "num_attention_heads": 32, "ffn_hidden_size": 11008},
    "llama2-13b": {**_LLAMA2, "name": "llama2-13b", "num_layers": 40, "hidden_size": 5120,
                   "num_attention_heads": 40, "ffn_hidden_size": 13824},
    "llama2-70b": {**_LLAMA2, "name": "llama2-70b", "num_layers": 80, "hidden_size": 8192,
                   "num_attention_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 28672},
    "llama3-8b": {**_LLAMA3, "name": "llama3-8b", "num_layers": 32, "hidden_size": 4096,
                  "num_attention_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336},
    "llama3-70b": {**_LLAMA3, "name": "llama3-70b", "num_layers": 80, "hidden_size": 8192,
                   "num_attention_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 28672},
    "llama3-405b": {**_LLAMA3, "name": "llama3-405b", "num_layers": 126, "hidden_size": 16384,
                    "num_attention_heads": 128, "num_kv_heads": 8, "ffn_hidden_size": 53248},
    "mixtral-8x7b": {**_LLAMA2, "name": "mixtral-8x7b", "num_layers": 32, "hidden_size": 4096,
                     "num_attention_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336,
                     "moe": {"num_experts": 8, "top_k": 2}},
    # Mixtral 8x22B (141B parameters, 39B active): Mistral AI's config.json of Mixtral-8x22B-v0.1
    "mixtral-8x22b": {**_LLAMA2, "name": "mixtral-8x22b", "num_layers": 56, "hidden_size": 6144,
                      "num_attention_heads": 48, "num_kv_heads": 8, "ffn_hidden_size": 16384, "vocab_size": 32768,
                      "moe": {"num_experts": 8, "top_k": 2}},
    "qwen2-7b": {**_QWEN2, "name": "qwen2-7b", "num_layers": 28, "hidden_size": 3584,
                 "num_attention_heads": 28, "num_kv_heads": 4, "ffn_hidden_size": 18944},
    "qwen2-72b": {**_QWEN2, "name": "qwen2-72b", "num_layers": 80, "hidden_size": 8192,
                  "num_attention_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 29568},
    # Encoders: bidirectional attention, no LM head over a vocabulary for ViT.
    "vit-huge": {"name": "vit-huge", "num_layers": 32, "hidden_size": 1280, "num_attention_heads": 16,
                 "ffn_hidden_size": 5120, "vocab_size": 0, "mlp": "gelu", "causal": False, **_NO_DROPOUT},
    "bert-large": {"name": "bert-large", "num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16,
                   "ffn_hidden_size": 4096, "vocab_size": 30522, "mlp": "gelu", "causal": False,
                   "tied_embeddings": True},
    # T5-11B: 24 encoder + 24 decoder layers modelled as one stack of 48; 128 heads of size 128.
    "t5-11b": {"name": "t5-11b", "num_layers": 48, "hidden_size": 1024, "num_attention_heads": 128,
               "head_dim": 128, "ffn_hidden_size": 65536, "vocab_size": 32128, "mlp": "gelu",
               "tied_embeddings": True},
}
# Accept the spellings people use ("llama-2-7b", "gpt-175b", ...).
for _k, _v in list(MODEL_PRESETS.items()):
    MODEL_PRESETS.setdefault(_k.replace("llama2", "llama-2").replace("llama3", "llama-3"), _v)
    MODEL_PRESETS.setdefault(_k.replace("gpt3-", "gpt-"), _v)


def _read_config(path: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


# Architecture features a config can declare that the cost model does not represent: importing such a model
# as if it were a plain (MoE) transformer would count the wrong parameters, FLOPs and memory, so it is refused.
_UNSUPPORTED_HF_KEYS: dict[str, str] = {
    "kv_lora_rank": "multi-head latent attention (DeepSeek-V2/V3 style)",
    "q_lora_rank": "multi-head latent attention (DeepSeek-V2/V3 style)",
    "n_shared_experts": "shared experts beside the routed ones",
    "num_shared_experts": "shared experts beside the routed ones",
    "shared_expert_intermediate_size": "a shared expert beside the routed ones",
    "first_k_dense_replace": "dense layers before the first MoE layer",
    "mlp_only_layers": "dense layers at chosen positions among MoE layers",
}


# decoder families with gated (SwiGLU) MLPs that train without dropout, whether or not the config says so
_DROPOUT_FREE = {"llama", "llama4", "mistral", "mixtral", "qwen2", "qwen3"}


def unsupported_hf_features(config: dict[str, Any]) -> list[str]:
    """``key: what it declares`` for each feature of ``config`` the cost model cannot represent."""
    return [f"{k}: {what} is not modelled" for k, what in _UNSUPPORTED_HF_KEYS.items() if config.get(k)]


def model_from_hf_config(config: dict[str, Any] | str | Path, name: str | None = None,
                         given: Collection[str] = ()) -> dict[str, Any]:
    """Map a Hugging Face ``config.json`` (dict or path) to ModelSpec fields; ``given``: the fields the request
    sets alongside it (they win, so the config need not have them).

    Multimodal configs are read from their ``text_config``. Raises ValueError naming the keys of
    architecture features the cost model does not represent (see ``_UNSUPPORTED_HF_KEYS``)."""
    config = config if isinstance(config, dict) else _read_config(config)
    if isinstance(config.get("text_config"), dict) and "num_hidden_layers" not in config:
        config = {**config["text_config"], "_name_or_path": config.get("_name_or_path")}
    unsupported = unsupported_hf_features(config)
    if unsupported:
        raise ValueError("; ".join(unsupported))

    def pick(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if config.get(k) is not None:
                return config[k]
        return default

    def number(kind: type[int] | type[float], *keys: str, default: Any = None, field: str | None = None) -> Any:
        """The first of ``keys`` the config sets, as a ``kind``; ValueError naming the key if it is not one, or
        naming them all if none is set and the spec ``field`` it gives is required and not given alongside."""
        key = next((k for k in keys if config.get(k) is not None), None)
        if key is None:
            if field is not None and field not in given:
                raise ValueError(f"hf_config sets none of {', '.join(keys)}: a transformer's config.json does")
            return default
        value = config[key]
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            try:
                converted = float(value)
                if kind is float or converted.is_integer():
                    return kind(converted)
            except (ValueError, OverflowError):  # ("1e999", or an int past float's range: 10**400)
                pass
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"hf_config.{key} must be {what}, got {shown(value)}")

    def flag(key: str) -> bool:
        """A true/false key (``bool("false")`` is True: a string is refused, naming the key)."""
        value = config.get(key, False)
        if value is None or isinstance(value, bool):
            return bool(value)
        raise ValueError(f"hf_config.{key} must be true or false, got {shown(value)}")

    mtype = str(config.get("model_type", "")).lower()
    # sizes through ``number``: a wrong type names the config's key (not the spec field derived from it) and a
    # JSON true is refused, not read as 1
    layers = number(int, "num_hidden_layers", "n_layer", "num_layers", field="num_layers")
    if mtype == "t5":
        encoder = number(int, "num_layers", default=0)
        layers = encoder + (number(int, "num_decoder_layers") or encoder)
    hidden = number(int, "hidden_size", "n_embd", "d_model", field="hidden_size")
    heads = number(int, "num_attention_heads", "n_head", "num_heads", field="num_attention_heads")
    # Falcon: multi_query (one KV head) or, in its newer architecture, num_kv_heads
    kv_heads = number(int, "num_key_value_heads", "num_kv_heads", default=1 if flag("multi_query") else heads)
    act = str(pick("hidden_act", "activation_function", "feed_forward_proj", default="gelu")).lower()
    family = mtype.split("_")[0]  # qwen2_moe, qwen3_moe, llama4_text, ...
    gated = "silu" in act or "swiglu" in act or "gated" in act or family in _DROPOUT_FREE
    spec: dict[str, Any] = {
        "name": name or config.get("_name_or_path") or mtype or "hf-model",
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_hidden_size": number(int, "intermediate_size", "n_inner", "d_ff", "ffn_dim"),
        "vocab_size": number(int, "vocab_size", default=0),
        "mlp": "swiglu" if gated else "gelu",
        "tied_embeddings": flag("tie_word_embeddings"),
    }
    # absent from many decoder configs (older Llama ones): those architectures train without dropout
    no_dropout = 0.0 if family in _DROPOUT_FREE else None
    for field, keys in (("attention_dropout", ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")),
                        ("hidden_dropout", ("hidden_dropout", "resid_pdrop", "hidden_dropout_prob", "dropout_rate"))):
        p = number(float, *keys, default=no_dropout)
        if p is not None:
            spec[field] = p
    if config.get("head_dim") or config.get("d_kv"):
        spec["head_dim"] = number(int, "head_dim", "d_kv")
    if spec["ffn_hidden_size"] is None:
        spec.pop("ffn_hidden_size")
    experts = number(int, "num_local_experts", "num_experts", "n_routed_experts")
    if experts and experts > 1:
        moe: dict[str, Any] = {"num_experts": experts, "top_k": number(int, "num_experts_per_tok", default=2)}
        if config.get("moe_intermediate_size"):
            moe["expert_ffn_hidden_size"] = number(int, "moe_intermediate_size")
        # Qwen-MoE: layer i is sparse when (i + 1) % decoder_sparse_step == 0, the spec's own convention
        if config.get("decoder_sparse_step"):
            moe["moe_layer_frequency"] = number(int, "decoder_sparse_step")
        spec["moe"] = moe
    return spec
