"""Tiny plan documents for the worker tests: a 4-layer Llama-style model on a CPU "cluster"."""

from __future__ import annotations

from typing import Any

from solvers.exports.layout import front_loaded_split
from tests.documents import hybrid_result

TINY_MODEL = {"name": "tiny-llama", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
              "num_kv_heads": 2, "ffn_hidden_size": 128, "vocab_size": 128, "mlp": "swiglu"}


def plan_doc(world: int = 4, gbs: int = 8, seq: int = 32, model: dict[str, Any] | None = None, pp: int = 1,
             micro_batches: int | None = None, schedule: str = "1f1b", virtual_stages: int = 1,
             **layer: Any) -> dict[str, Any]:
    """A plan document whose result puts one layer strategy (``tp=2, sp="megatron"`` ...) on every layer, split
    evenly into ``pp`` stages; one micro-batch per stage unless given. Nothing is checked here: the plans the
    worker must refuse are made alike."""
    model = model or TINY_MODEL
    layers = model["num_layers"]
    strategy = {"pp": pp, "micro_batches": micro_batches or pp, "schedule": schedule,
                "virtual_stages": virtual_stages, "stage_layers": list(front_loaded_split(layers, pp)),
                "layers": [layer] * layers}
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
    "tp2-dp2": plan_doc(tp=2, dp=2),
    "tp2-sp-fsdp2": plan_doc(tp=2, dp=2, sp="megatron", zero=3),
    "ulysses2-dp2": plan_doc(tp=2, dp=2, sp="ulysses"),
    "pp4-gpipe": plan_doc(pp=4, micro_batches=4, schedule="gpipe"),
    "pp2-tp2-1f1b": plan_doc(pp=2, tp=2, sp="megatron", micro_batches=4, schedule="1f1b"),
    "pp2-dp2-1f1b": plan_doc(pp=2, dp=2, micro_batches=2, schedule="1f1b"),
    "pp2-interleaved-fsdp2": plan_doc(pp=2, dp=2, zero=3, micro_batches=2, schedule="interleaved"),
}
