from __future__ import annotations

from typing import Any


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "hybrid",
        "model": {"preset": "llama2-7b"},
        "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
        "training": {"global_batch_size": 64, "seq_length": 2048},
    }
    base.update(overrides)
    return base
