"""Tiny plan documents for the worker tests: a 4-layer Llama-style model on a CPU "cluster"."""

from __future__ import annotations

import copy
from typing import Any

from solvers.exports.layout import front_loaded_split
from tests.documents import hybrid_result

TINY_MODEL: dict[str, Any] = {"name": "tiny-llama", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "num_kv_heads": 2, "ffn_hidden_size": 128, "vocab_size": 128, "mlp": "swiglu"}


def plan_doc(world: int = 4, gbs: int = 8, seq: int = 32, model: dict[str, Any] | None = None, pp: int = 1,
             micro_batches: int | None = None, schedule: str = "1f1b", virtual_stages: int = 1,
             embedding: dict[str, Any] | None = None, **layer: Any) -> dict[str, Any]:
    """A plan document whose result puts one layer strategy (``tp=2, sp="megatron"`` ...) on every layer, split
    evenly into ``pp`` stages; one micro-batch per stage unless given; the embedding and LM head laid out as the
    layers unless given. Nothing is checked here: the plans the worker must refuse are made alike."""
    model = model or TINY_MODEL
    layers = model["num_layers"]
    strategy = {"pp": pp, "micro_batches": micro_batches or pp, "schedule": schedule,
                "virtual_stages": virtual_stages, "stage_layers": list(front_loaded_split(layers, pp)),
                "layers": [layer] * layers,
                "embedding": embedding or {"tp": layer.get("tp", 1), "dp": layer.get("dp", 1),
                                           "zero": layer.get("zero", 0),
                                           **({"sp": "ulysses"} if layer.get("sp") == "ulysses" else {})}}
    return {
        "kind": "hybrid",
        "request": {"kind": "hybrid", "model": model,
                    "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": world},
                    "training": {"global_batch_size": gbs, "seq_length": seq, "precision": "fp32"}},
        "result": hybrid_result(strategy).to_json(),
    }


# name -> plan on 4 ranks; together they cover every parallelism and the combinations the issue names.
EQUIVALENCE_PLANS: dict[str, dict[str, Any]] = {
    "ddp": plan_doc(dp=4),
    "ddp-accumulate-recompute": plan_doc(dp=4, micro_batches=2, recompute="full"),
    "fsdp-zero3": plan_doc(dp=4, zero=3),
    "fsdp-zero2-selective": plan_doc(dp=4, zero=2, recompute="selective"),
    "tp2-dp2-zero2": plan_doc(tp=2, dp=2, zero=2),
    "tp2-sp-fsdp2": plan_doc(tp=2, dp=2, sp="megatron", zero=3),
    "ulysses2-dp2": plan_doc(tp=2, dp=2, sp="ulysses"),
    "pp4-gpipe": plan_doc(pp=4, micro_batches=4, schedule="gpipe"),
    "pp2-tp2-1f1b": plan_doc(pp=2, tp=2, sp="megatron", micro_batches=4, schedule="1f1b"),
    "pp2-dp2-1f1b-zero2": plan_doc(pp=2, dp=2, zero=2, micro_batches=2, schedule="1f1b"),
    "pp2-interleaved-fsdp2": plan_doc(pp=2, dp=2, zero=3, micro_batches=2, schedule="interleaved", virtual_stages=2),
    "pp4-1f1b-fewer-micro-batches": plan_doc(pp=4, micro_batches=2, schedule="1f1b"),
}


def _split(doc: dict[str, Any], stage_layers: list[int]) -> dict[str, Any]:
    doc["result"]["strategy"]["stage_layers"] = stage_layers
    return doc


# Pipelines cut as their plans say, not evenly: name -> plan; ``PLANNED_LAYERS[name]`` is the layers each rank
# must hold, per virtual stage (4 ranks: pp x dp, dp varying fastest).
EQUIVALENCE_PLANS["pp2-dp2-uneven-1f1b"] = _split(plan_doc(pp=2, dp=2, zero=2, micro_batches=2), [3, 1])
# 7 layers as [5, 2]: rank 0 runs chunks of 3 and 2 layers, rank 1 of 1 and 1 (model order [3, 1, 2, 1]); an
# even cut of 7 layers into 4 virtual stages ([2, 2, 2, 1]) would give the ranks 4 and 3.
EQUIVALENCE_PLANS["pp2-interleaved-uneven"] = _split(
    plan_doc(model={**TINY_MODEL, "num_layers": 7}, pp=2, dp=2, zero=3, micro_batches=2, schedule="interleaved",
             virtual_stages=2), [5, 2])
PLANNED_LAYERS: dict[str, list[list[list[int]]]] = {
    "pp2-dp2-uneven-1f1b": [[[0, 1, 2]]] * 2 + [[[3]]] * 2,
    "pp2-interleaved-uneven": [[[0, 1, 2], [4, 5]]] * 2 + [[[3], [6]]] * 2,
}


def _mixed_layers() -> dict[str, Any]:
    doc = plan_doc(tp=2, dp=2, zero=3)
    doc["result"]["strategy"]["layers"][2] = {"tp": 1, "dp": 4, "zero": 3}
    return doc


def _with(doc: dict[str, Any], section: str, **fields: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["request"][section] = {**doc["request"][section], **fields}
    return doc


# name -> (plan the worker would have to approximate, the field naming it, words of the reason)
REFUSED: dict[str, tuple[dict[str, Any], list[Any], str]] = {
    "per-layer mix": (_mixed_layers(), ["result", "strategy", "layers", 2], "one layout on every layer"),
    "cp": (plan_doc(dp=2, cp=2, zero=3), ["result", "strategy", "layers", 0, "cp"], "ring attention"),
    "zero-1": (plan_doc(dp=4, zero=1), ["result", "strategy", "layers", 0, "zero"], "ZeRO-1"),
    "zero-0 with tp": (plan_doc(tp=2, dp=2), ["result", "strategy", "layers", 0, "zero"], "ZeRO-0 with tensor"),
    "zero-0 with pp": (plan_doc(pp=2, dp=2, micro_batches=2), ["result", "strategy", "layers", 0, "zero"],
                       "ZeRO-0 with a pipeline"),
    "interleaved, a stage short of chunks": (
        _split(plan_doc(model={**TINY_MODEL, "num_layers": 6}, pp=2, dp=2, zero=3, micro_batches=2,
                        schedule="interleaved", virtual_stages=2), [5, 1]),
        ["result", "strategy", "stage_layers"], "fewer layers than its 2 virtual stages"),
    "virtual stages without interleaving": (plan_doc(pp=2, dp=2, zero=3, micro_batches=2, virtual_stages=2),
                                            ["result", "strategy", "virtual_stages"], "the interleaved schedule"),
    "interleaved, 1 virtual stage": (plan_doc(pp=2, dp=2, zero=3, micro_batches=2, schedule="interleaved"),
                                     ["result", "strategy", "virtual_stages"], "one virtual stage"),
    "embedding": (plan_doc(tp=2, dp=2, zero=3, embedding={"tp": 1, "dp": 4, "zero": 3}),
                  ["result", "strategy", "embedding", "tp"], "embedding and LM head"),
    "moe": (_with(plan_doc(dp=4), "model", moe={"num_experts": 4, "top_k": 2}), ["request", "model", "moe"], "MoE"),
    "bf16 on cpu": (_with(plan_doc(dp=4), "training", precision="bf16"), ["request", "training", "precision"],
                    "CPU ranks compute in fp32"),
}
