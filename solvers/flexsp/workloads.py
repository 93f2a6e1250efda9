"""The reference's workloads (GPT-7B constants, synthetic and Wikipedia batches) as contract requests."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

GPT7B_COST_MODEL: dict[str, Any] = {
    "kind": "flexsp", "alpha1_ms_per_token2": 5.128e-6, "alpha2_ms_per_token": 0.1839576, "beta_ms": 629.3563,
    "activation_mb_per_token": 4.480441895, "params_billion": 7.117,
    "alltoall_GBps_by_group_size": {"2": 119.54, "4": 104.07, "8": 96.5, "16": 10.33, "32": 5.94, "64": 4.87},
}
GPT7B_MODEL: dict[str, Any] = {"name": "gpt-7b", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
CONTEXT_TOKENS = 192_000  # the reference's "192K": lengths are padded to 128 and kept up to 192000 − 128
PAD = 128


def gpt7b_request(lengths: list[int], nodes: int = 8, gpus_per_node: int = 8, memory_gib: float = 30,
                  **extra: Any) -> dict[str, Any]:
    return {
        "kind": "flexsp", "model": dict(GPT7B_MODEL),
        "cluster": {"gpu": "A100-80GB", "nodes": nodes, "gpus_per_node": gpus_per_node},
        "batch": {"sequence_lengths": [int(s) for s in lengths]},
        "constraints": {"memory_limit_gib": memory_gib, "zero": 3},
        "cost_model": dict(GPT7B_COST_MODEL), **extra,
    }


def pad_up(lengths: np.ndarray) -> np.ndarray:
    return ((lengths - 1) // PAD + 1) * PAD


def synthetic_lengths(n: int = 512, seed: int = 0) -> list[int]:
    """The issue's synthetic batch: lognormal around 4096, clipped to [1, 192K − 128], padded to 128."""
    raw = np.random.default_rng(seed).lognormal(math.log(4096), 1.6, n)
    clipped = np.clip(raw, 1, CONTEXT_TOKENS - PAD)
    return [int(x) for x in pad_up(np.ceil(clipped).astype(np.int64))]


def wikipedia_batches(path: Path, count: int, batch: int = 512, start: int = 0) -> list[list[int]]:
    """Consecutive global batches as the reference forms them: pad to 128, drop beyond the context."""
    need = (start + count) * batch
    out: list[int] = []
    with path.open() as f:
        for line in f:
            s = (int(line) - 1) // PAD * PAD + PAD
            if s <= CONTEXT_TOKENS - PAD:
                out.append(s)
                if len(out) >= need:
                    break
    return [out[(start + b) * batch : (start + b + 1) * batch] for b in range(count)]
