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
    layers unless given (cp ranks folded into its dp, as the planner does). Nothing is checked here: the plans the
    worker must refuse are made alike."""
    model = model or TINY_MODEL
    layers = model["num_layers"]
    strategy = {"pp": pp, "micro_batches": micro_batches or pp, "schedule": schedule,
                "virtual_stages": virtual_stages, "stage_layers": list(front_loaded_split(layers, pp)),
                "layers": [layer] * layers,
                "embedding": embedding or {"tp": layer.get("tp", 1), "dp": layer.get("dp", 1) * layer.get("cp", 1),
                                           "zero": layer.get("zero", 0),
                                           **({"sp": "ulysses"} if layer.get("sp") == "ulysses" else {})}}
    return {
        "kind": "hybrid",
        "request": {"kind": "hybrid", "model": model,
                    "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": world},
                    "training": {"global_batch_size": gbs, "seq_length": seq, "precision": "fp32"}},
        "result": hybrid_result(strategy).to_json(),
    }


# Per-layer mixes run tp=4 layers: 8 query / 4 key-value heads (still grouped-query attention).
MIX_MODEL: dict[str, Any] = {**TINY_MODEL, "name": "tiny-llama-8h", "num_attention_heads": 8, "num_kv_heads": 4}


def mixed_doc(layers: list[dict[str, Any]], embedding: dict[str, Any], model: dict[str, Any] | None = None,
              **pipeline: Any) -> dict[str, Any]:
    """A plan of ``model`` (default ``MIX_MODEL``; 4 ranks) whose layer ``i`` is laid out as ``layers[i]``, the
    embedding and LM head as ``embedding``."""
    doc = plan_doc(model=model or MIX_MODEL, **pipeline)
    doc["result"]["strategy"]["layers"] = layers
    doc["result"]["strategy"]["embedding"] = embedding
    return doc


# name -> per-layer plan on 4 ranks: every layer its own tp / sp / dp / ZeRO, the embedding its own layout.
MIXED_PLANS: dict[str, dict[str, Any]] = {
    # TP changes between neighbours (tp2 x dp2 -> tp4 -> Ulysses 4 -> dp4), ZeRO-0 with TP
    "mix-tp2dp2-tp4-ulysses4-dp4": mixed_doc(
        [{"tp": 2, "dp": 2}, {"tp": 4, "sp": "megatron"}, {"tp": 4, "sp": "ulysses"}, {"dp": 4}], {"dp": 4}),
    # ZeRO-3, -2, -0 and -1 in one model, each layer over its own data-parallel ranks; a tp4 embedding and head
    "mix-zero3-zero2-zero0-zero1-embedding-tp4": mixed_doc(
        [{"dp": 4, "zero": 3}, {"tp": 2, "dp": 2, "sp": "megatron", "zero": 2}, {"tp": 4},
         {"tp": 2, "dp": 2, "sp": "ulysses", "zero": 1}], {"tp": 4}),
    # re-layouts across the stage boundary of a pipeline, ZeRO-0 / -1 beside FSDP in a stage
    "mix-pp2-1f1b": mixed_doc(
        [{"tp": 2, "sp": "megatron"}, {"dp": 2, "zero": 1}, {"tp": 2, "sp": "ulysses", "zero": 3},
         {"dp": 2, "zero": 2}], {"dp": 2}, pp=2, micro_batches=2),
    # ring attention on some layers: cp2 x dp2 -> tp4 -> cp2 x Ulysses 2 -> cp4, chunks re-dealt between them
    "mix-cp2dp2-tp4-cp2ulysses2-cp4": mixed_doc(
        [{"cp": 2, "dp": 2}, {"tp": 4, "sp": "megatron"}, {"cp": 2, "tp": 2, "sp": "ulysses", "zero": 1},
         {"cp": 4, "zero": 3}], {"dp": 4}),
    # interleaved: the plan lists stage 0's layers (model layers 0 and 2) before stage 1's (1 and 3), so each model
    # layer re-lays out from a layout on the other stage's ranks
    "mix-pp2-interleaved": mixed_doc(
        [{"tp": 2, "sp": "megatron"}, {"dp": 2, "zero": 3}, {"tp": 2, "sp": "ulysses", "zero": 1},
         {"dp": 2, "zero": 2}], {"dp": 2}, pp=2, micro_batches=2, schedule="interleaved", virtual_stages=2),
}

# name -> plan on 4 ranks; together they cover every parallelism and the combinations the issue names.
EQUIVALENCE_PLANS: dict[str, dict[str, Any]] = {
    "dp4-zero0": plan_doc(dp=4),
    "dp4-zero0-accumulate-recompute": plan_doc(dp=4, micro_batches=2, recompute="full"),
    "fsdp-zero3": plan_doc(dp=4, zero=3),
    "fsdp-zero2-selective": plan_doc(dp=4, zero=2, recompute="selective"),
    "tp2-dp2-zero2": plan_doc(tp=2, dp=2, zero=2),
    "tp2-sp-fsdp2": plan_doc(tp=2, dp=2, sp="megatron", zero=3),
    "ulysses2-dp2": plan_doc(tp=2, dp=2, sp="ulysses"),
    "pp4-gpipe": plan_doc(pp=4, micro_batches=4, schedule="gpipe"),
    "pp2-tp2-1f1b": plan_doc(pp=2, tp=2, sp="megatron", micro_batches=4, schedule="1f1b"),
    "pp2-dp2-1f1b-zero2": plan_doc(pp=2, dp=2, zero=2, micro_batches=2, schedule="1f1b"),
    "pp2-interleaved-fsdp2": plan_doc(pp=2, dp=2, zero=3, micro_batches=2, schedule="interleaved", virtual_stages=2),
    # ring-attention context parallelism (GQA: 4 heads, 2 K/V heads), alone and with each other parallelism
    "cp2-dp2-zero0-selective": plan_doc(cp=2, dp=2, recompute="selective"),
    "cp4-fsdp-zero3": plan_doc(cp=4, zero=3),
    "cp2-tp2-sp-fsdp2": plan_doc(cp=2, tp=2, sp="megatron", zero=2),
    "cp2-ulysses2": plan_doc(cp=2, tp=2, sp="ulysses"),
    "pp2-cp2-1f1b-zero2": plan_doc(pp=2, cp=2, zero=2, micro_batches=2, schedule="1f1b"),
    "zero1": plan_doc(dp=4, zero=1),
    "zero0-tp2-dp2": plan_doc(tp=2, dp=2),
    "zero0-pp2-dp2": plan_doc(pp=2, dp=2, micro_batches=2),
    **MIXED_PLANS,
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

# Plans whose every gradient of the first step is compared with the single-process model's (a gradient scaled
# wrongly by a constant barely moves an AdamW loss curve; it shows here).
GRADIENT_CHECKED = ["zero1", "zero0-tp2-dp2", *MIXED_PLANS]

# Plans trained again, interrupted after a checkpoint and resumed (test_equivalence.py).
RESUMED = ["mix-pp2-1f1b", "zero1"]

# name -> (plan, fault): a plan run with one part of the runtime broken on purpose (``faults.FAULTS``); its
# gradients must leave the reference's, and its loss the reference by far more than the tolerance.
CP_CONTROLS: dict[str, tuple[dict[str, Any], str]] = {
    "control-cp4-ring-unmerged": (EQUIVALENCE_PLANS["cp4-fsdp-zero3"], "ring-unmerged"),
    "control-cp4-grads-unsynced": (EQUIVALENCE_PLANS["cp4-fsdp-zero3"], "cp-grads-unsynced"),
}
LAYOUT_CONTROLS: dict[str, tuple[dict[str, Any], str]] = {
    "control-mix-no-relayout": (MIXED_PLANS["mix-tp2dp2-tp4-ulysses4-dp4"], "skip-relayout"),
    # the only ZeRO-0/1 parameters of this plan are layer 3's
    "control-mix-layer3-unsynced": (MIXED_PLANS["mix-zero3-zero2-zero0-zero1-embedding-tp4"], "skip-replicated-sync"),
    # caught by the gradients only (see GRADIENT_CHECKED)
    "control-mix-relayout-unscaled": (MIXED_PLANS["mix-tp2dp2-tp4-ulysses4-dp4"], "unscaled-relayout"),
}
CONTROLS = {**CP_CONTROLS, **LAYOUT_CONTROLS}


# 4 layers, the 2nd and 4th MoE: 4 experts, top-2. A capacity factor of num_experts / top_k can never drop a
# token (an expert's capacity is then every token of its routing group), so any layout computes the reference's
# function; MOE_DROPPING's factor 1.0 drops (tests/worker/test_moe_equivalence.py tests what).
MOE_MODEL: dict[str, Any] = {**TINY_MODEL, "name": "tiny-moe",
                              "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 64,
                                      "capacity_factor": 2.0, "moe_layer_frequency": 2}}
MOE_DROPPING: dict[str, Any] = {**MOE_MODEL, "moe": {**MOE_MODEL["moe"], "capacity_factor": 1.0}}


def moe_plan_doc(experts: dict[str, Any], model: dict[str, Any] | None = None, **layer: Any) -> dict[str, Any]:
    """``plan_doc`` on an MoE model, the expert fields (``ep``, ``etp``, ``lsh``) on its MoE layers only."""
    model = model or MOE_MODEL
    doc = plan_doc(model=model, **layer)
    layers = doc["result"]["strategy"]["layers"]
    every = model["moe"].get("moe_layer_frequency", 1)
    doc["result"]["strategy"]["layers"] = [{**x, **experts} if (i + 1) % every == 0 else x
                                           for i, x in enumerate(layers)]
    return doc


# name -> MoE plan on 4 ranks whose loss must equal the single-process model's
MOE_PLANS: dict[str, dict[str, Any]] = {
    "ep4-dp4-zero0": moe_plan_doc({"ep": 4}, dp=4),
    "ep2-edp2-fsdp3": moe_plan_doc({"ep": 2}, dp=4, zero=3),
    "ep2-etp2-tp2-zero2": moe_plan_doc({"ep": 2}, tp=2, dp=2, zero=2),  # etp = the layer's tp
    "ep2-etp2-tp2-sp-zero3-recompute": moe_plan_doc({"ep": 2}, tp=2, dp=2, sp="megatron", zero=3, recompute="full"),
    "ep2-etp2-dp4-zero2": moe_plan_doc({"ep": 2, "etp": 2}, dp=4, zero=2),
    "ep2-ulysses2-dp2": moe_plan_doc({"ep": 2}, tp=2, dp=2, sp="ulysses"),
    "pp2-ep2-dp2-1f1b": moe_plan_doc({"ep": 2}, pp=2, dp=2, zero=2, micro_batches=2),
    # ZeRO-1 over expert-dp (dense and expert parameters), and a per-layer mix: a dense TP+SP layer, an MoE layer
    # on dp4 ZeRO-1 (ep2 x edp2), a Ulysses layer, an MoE layer on tp2 x dp2 ZeRO-3 (ep2 x etp2)
    "ep2-edp2-zero1": moe_plan_doc({"ep": 2}, dp=4, zero=1),
    "mix-moe-per-layer": mixed_doc([{"tp": 2, "dp": 2, "sp": "megatron", "zero": 2}, {"dp": 4, "zero": 1, "ep": 2},
                                    {"tp": 2, "dp": 2, "sp": "ulysses"}, {"tp": 2, "dp": 2, "zero": 3, "ep": 2}],
                                   {"dp": 4}, model=MOE_MODEL),
}


def _with(doc: dict[str, Any], section: str, **fields: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["request"][section] = {**doc["request"][section], **fields}
    return doc


# name -> (plan the worker would have to approximate, the field naming it, words of the reason)
REFUSED: dict[str, tuple[dict[str, Any], list[Any], str]] = {
    "cp: sequence not in 2*cp chunks": (plan_doc(dp=2, cp=2, zero=3, seq=30), ["request", "training", "seq_length"],
                                        "not divisible by 2*cp = 4"),
    "a layer off its stage's ranks": (mixed_doc([{"dp": 4}, {"tp": 2}, {"dp": 4}, {"dp": 4}], {"dp": 4}),
                                      ["result", "strategy", "layers", 1], "but the run has 4 processes"),
    "the embedding off its stage's ranks": (mixed_doc([{"dp": 4}] * 4, {"tp": 2}),
                                            ["result", "strategy", "embedding"], "embedding and LM head"),
    "interleaved, a stage short of chunks": (
        _split(plan_doc(model={**TINY_MODEL, "num_layers": 6}, pp=2, dp=2, zero=3, micro_batches=2,
                        schedule="interleaved", virtual_stages=2), [5, 1]),
        ["result", "strategy", "stage_layers"], "fewer layers than its 2 virtual stages"),
    "virtual stages without interleaving": (plan_doc(pp=2, dp=2, zero=3, micro_batches=2, virtual_stages=2),
                                            ["result", "strategy", "virtual_stages"], "the interleaved schedule"),
    "interleaved, 1 virtual stage": (plan_doc(pp=2, dp=2, zero=3, micro_batches=2, schedule="interleaved"),
                                     ["result", "strategy", "virtual_stages"], "one virtual stage"),
    "expert fields on a dense layer": (plan_doc(model=MOE_MODEL, dp=4, ep=2), ["result", "strategy", "layers", 0, "ep"],
                                       "expert fields need an MoE layer"),
    "ep not dividing the experts": (moe_plan_doc({"ep": 3}, dp=4), ["result", "strategy", "layers", 1, "ep"],
                                    "must divide the 4 experts"),
    "ep*etp not dividing the ranks": (moe_plan_doc({"ep": 4, "etp": 2}, dp=4),
                                      ["result", "strategy", "layers", 1, "ep"], "parallel folding"),
    "etp not dividing the expert ffn": (
        moe_plan_doc({"etp": 4}, model={**MOE_MODEL, "moe": {**MOE_MODEL["moe"], "expert_ffn_hidden_size": 66}},
                     dp=4), ["result", "strategy", "layers", 1, "etp"], "expert FFN width 66"),
    "moe layer under cp": (mixed_doc([{"cp": 2, "dp": 2}, {"cp": 2, "dp": 2, "ep": 2}, {"dp": 4}, {"dp": 4, "ep": 2}],
                                     {"dp": 4}, model=MOE_MODEL), ["result", "strategy", "layers", 1, "cp"],
                           "cp=2 on an MoE layer"),
    "moe tokens not splitting over tp": (moe_plan_doc({"ep": 2}, tp=2, dp=2, zero=2, gbs=2, seq=33),
                                         ["request", "training", "seq_length"], "do not split evenly over tp=2"),
    "bf16 on cpu": (_with(plan_doc(dp=4), "training", precision="bf16"), ["request", "training", "precision"],
                    "CPU ranks compute in fp32"),
    # its autocast covers bf16 / fp16: on a GPU an FP8 plan would run its GEMMs in fp32
    "fp8 on a gpu": (_with(_with(plan_doc(dp=4), "training", precision="fp8"), "cluster", gpu="H100-SXM"),
                     ["request", "training", "precision"], "no FP8 GEMMs"),
}
