"""Contract-shaped plan documents (../shared/contract/plan-api.md) for dashboard tests that need no solver.

Values are generated, not copied from a solver: the tests check that the pages show what the documents
say, so any consistent document will do. Browser tests use the real solvers instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def hybrid(num_layers: int = 32, pp: int = 2, micro_batches: int = 8, runnable: bool = False
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A hybrid plan document and its request (1 node of 8 A100s). By default its layers mix layouts, ZeRO stages
    and recomputation; ``runnable``: one layout on every layer and the embedding, which the worker runs exactly."""
    per_stage = [num_layers // pp + (1 if s < num_layers % pp else 0) for s in range(pp)]
    layers = [{"tp": 2 if i % 3 else 4, "dp": 4 if i % 3 else 2, "sp": "megatron" if i % 2 else None, "cp": 1,
               "zero": 3 if i < num_layers // 2 else 1, "recompute": ("none", "selective", "full")[i % 3]}
              for i in range(num_layers)]
    embedding = {"tp": 2, "dp": 4, "zero": 2}
    if runnable:
        one = {"tp": 2, "dp": 8 // (2 * pp), "sp": "megatron", "cp": 1, "zero": 3, "recompute": "none"}
        layers, embedding = [one] * num_layers, {"tp": 2, "dp": one["dp"], "zero": 3}
    mem_parts = [{"parameters": 4.0 + s, "gradients": 2.0, "optimizer": 6.0, "activations": 10.0 - s,
                  "buffers": 1.5} for s in range(pp)]
    stage_time = [0.05 + 0.01 * s for s in range(pp)]
    breakdown = {"compute": 0.9, "tp_comm": 0.12, "dp_comm_exposed": 0.05, "pp_bubble": 0.08}
    step = sum(breakdown.values())
    estimate = {"step_time_s": step, "throughput_samples_per_s": 64 / step, "tokens_per_s": 64 * 2048 / step,
                "mfu": 0.47, "peak_memory_gib": max(sum(p.values()) for p in mem_parts),
                "memory_gib_per_stage": [sum(p.values()) for p in mem_parts], "breakdown_s": breakdown,
                "memory_breakdown_gib_per_stage": mem_parts, "stage_time_s": stage_time}
    uniform = {"tp": 4, "dp": 8 // (4 * pp) or 1, "sp": None, "cp": 1, "zero": 1, "recompute": "full"}
    megatron = {"fits": True,
                "strategy": {"pp": pp, "micro_batches": micro_batches, "schedule": "1f1b", "stage_layers": per_stage,
                             "layers": [uniform] * num_layers, "embedding": {"tp": 4, "dp": uniform["dp"], "zero": 1}},
                "estimate": {**estimate, "step_time_s": step * 1.2, "throughput_samples_per_s": 64 / (step * 1.2),
                             "mfu": 0.39, "breakdown_s": {**breakdown, "compute": 1.1}}}
    result = {"estimate": estimate,
              "strategy": {"pp": pp, "micro_batches": micro_batches, "schedule": "1f1b", "stage_layers": per_stage,
                           "layers": layers, "embedding": embedding},
              "baselines": {"megatron": megatron, "zero3_dp": None},
              "search": {"time_s": 0.4, "solver": "dp", "lower_bound_step_time_s": step / 1.02,
                         "optimality_gap": 0.02}}
    megatron["gain_bound"] = 1.2 * 1.02 - 1
    request = {"kind": "hybrid", "model": {"preset": "llama2-7b", "num_layers": num_layers},
               "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
               "training": {"global_batch_size": 64, "seq_length": 2048}, "constraints": {"memory_limit_gib": 36}}
    return request, result


def flexsp(num_sequences: int = 40, ranks: int = 16) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in np.ceil(rng.lognormal(np.log(4096), 1.6, num_sequences).clip(1, 65536) / 128) * 128]
    order = sorted(range(num_sequences), key=lambda i: -lengths[i])
    micro_batches = []
    # Two micro-batches: the longest sequence alone on half the ranks, the rest split over SP 4 groups.
    for half in (order[: num_sequences // 2], order[num_sequences // 2:]):
        groups = [{"sp": ranks // 2, "ranks": [0, ranks // 2 - 1], "sequences": half[:1]}]
        rest = half[1:]
        for g in range(ranks // 8):
            start = ranks // 2 + 4 * g
            groups.append({"sp": 4, "ranks": [start, start + 3], "sequences": rest[g:: ranks // 8]})
        micro_batches.append({"time_s": 4.0 + len(half) / 10, "groups": groups})
    step = sum(mb["time_s"] for mb in micro_batches)
    result = {"estimate": {"step_time_s": step}, "micro_batches": micro_batches,
              "baselines": {"static_sp": {"8": step * 1.3, "16": step * 1.2}, "best_static_sp": 16},
              "lower_bound_s": step * 0.85, "search": {"time_s": 0.3}}
    request = {"kind": "flexsp", "model": {"preset": "llama2-7b"},
               "cluster": {"gpu": "A100-80GB", "nodes": ranks // 8, "gpus_per_node": 8},
               "batch": {"sequence_lengths": lengths}, "constraints": {"memory_limit_gib": 30}}
    return request, result


def spindle() -> tuple[dict[str, Any], dict[str, Any]]:
    metaops = [{"name": "cap-vision", "task": "cap", "batch_size": 64, "num_layers": 24},
               {"name": "cap-llm", "task": "cap", "batch_size": 64, "num_layers": 32},
               {"name": "ret-text", "task": "ret", "batch_size": 128, "num_layers": 12}]
    slices = [{"metaop": "cap-vision", "devices": [0, 1, 2, 3], "layers": 24, "start_s": 0.0, "end_s": 0.05},
              {"metaop": "ret-text", "devices": [4, 5, 6, 7], "layers": 12, "start_s": 0.0, "end_s": 0.04},
              {"metaop": "cap-llm", "devices": [0, 1, 2, 3, 4, 5, 6, 7], "layers": 32, "start_s": 0.05, "end_s": 0.12}]
    result = {"estimate": {"iteration_time_s": 0.12}, "slices": slices, "lower_bound_s": 0.11,
              "baselines": {"sequential_full_cluster_s": 0.15, "task_uniform_s": 0.2},
              "search": {"time_s": 0.05}}
    request = {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
               "workload": {"metaops": metaops, "edges": [["cap-vision", "cap-llm"]]}}
    return request, result
