"""Small, fast, valid requests of each kind (solved in well under a second)."""

from __future__ import annotations

from typing import Any

CLUSTER8 = {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8}

REQUESTS: dict[str, dict[str, Any]] = {
    "hybrid": {"kind": "hybrid", "model": {"preset": "gpt3-1.3b"}, "cluster": CLUSTER8,
               "training": {"global_batch_size": 32, "seq_length": 2048}},
    "flexsp": {"kind": "flexsp", "model": {"preset": "llama2-7b"}, "cluster": CLUSTER8,
               "batch": {"sequence_lengths": [32768, 16384, 8192, 4096, 4096, 2048, 1024, 1024, 512, 512]}},
    "spindle": {"kind": "spindle", "cluster": {"nodes": 1, "gpus_per_node": 8}, "workload": {
        "metaops": [{"name": "vision", "task": "cap", "batch_size": 64, "num_layers": 24,
                     "time_ms_per_layer": {"slope_ms_per_sample": 0.29, "intercept_ms": 0.94}},
                    {"name": "llm", "task": "cap", "batch_size": 64, "num_layers": 32,
                     "time_ms_per_layer": {"slope_ms_per_sample": 0.5, "intercept_ms": 1.2}}],
        "edges": [["vision", "llm"]]}},
}


def tiny_spindle(i: int) -> dict[str, Any]:
    """The i-th of many distinct, cheap requests (one metaop; batch size varies)."""
    return {"kind": "spindle", "cluster": {"nodes": 1, "gpus_per_node": 8}, "workload": {"metaops": [
        {"name": "m", "task": "t", "batch_size": 8 + i, "num_layers": 4,
         "time_ms_per_layer": {"slope_ms_per_sample": 0.3, "intercept_ms": 1.0}}]}}


def tiny_cpu_hybrid() -> dict[str, Any]:
    """A cheap hybrid request on 4 CPU ranks whose plan (data parallelism) the worker runs exactly."""
    return {"kind": "hybrid", "model": {"name": "tiny", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                                        "ffn_hidden_size": 64, "vocab_size": 64},
            "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 4},
            "training": {"global_batch_size": 8, "seq_length": 16, "precision": "fp32"},
            "constraints": {"max_tp": 1, "max_pp": 1, "max_cp": 1, "zero": 0, "target": "torchtitan"}}


def slow_spindle(seconds: float) -> dict[str, Any]:
    """A request whose exact CP-SAT phase runs for about ``seconds`` (it cannot prove optimality quickly)."""
    ops = [{"name": f"m{i}", "task": f"t{i % 4}", "batch_size": 16 + 7 * i, "num_layers": 4 + i % 5,
            "time_ms_per_layer": {"slope_ms_per_sample": 0.29 + 0.01 * i, "intercept_ms": 0.94}} for i in range(24)]
    return {"kind": "spindle", "cluster": {"nodes": 2, "gpus_per_node": 8},
            "workload": {"metaops": ops, "edges": [[f"m{i}", f"m{i + 4}"] for i in range(20)]},
            "options": {"exact_time_limit_s": seconds, "exact_deterministic_time": 1000, "exact_workers": 1}}
