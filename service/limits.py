"""Solver input size limits, checked before a request is stored (413 naming the limit)."""

from __future__ import annotations

import contextlib
from typing import Any

from service.errors import TooLarge
from service.settings import Settings
from solvers.presets import MODEL_PRESETS, model_from_hf_config


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def count_gpus(request: dict[str, Any]) -> int | None:
    cluster = request.get("cluster")
    if not isinstance(cluster, dict):
        return None
    nodes, per_node = _int(cluster.get("nodes", 1)), _int(cluster.get("gpus_per_node", 8))
    return nodes * per_node if nodes is not None and per_node is not None else None


def count_layers(request: dict[str, Any]) -> int | None:
    model = request.get("model")
    if isinstance(model, dict):
        layers = _int(model.get("num_layers"))
        if layers is None and isinstance(model.get("preset"), str):
            layers = _int(MODEL_PRESETS.get(model["preset"].lower(), {}).get("num_layers"))
        if layers is None and isinstance(model.get("hf_config"), dict):
            with contextlib.suppress(ValueError):  # the request's validation names what is wrong with the config
                layers = _int(model_from_hf_config(model["hf_config"]).get("num_layers"))
        return layers
    workload = request.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("metaops"), list):
        return sum(_int(m.get("num_layers")) or 0 for m in workload["metaops"] if isinstance(m, dict))
    return None


def check_limits(request: dict[str, Any], settings: Settings) -> None:
    """Raise TooLarge naming the first limit the request exceeds."""
    checks: list[tuple[str, int | None, int, str]] = [
        ("GPUs (cluster.nodes × cluster.gpus_per_node)", count_gpus(request), settings.max_gpus, "max_gpus"),
        ("layers", count_layers(request), settings.max_layers, "max_layers"),
    ]
    batch = request.get("batch")
    if isinstance(batch, dict) and isinstance(batch.get("sequence_lengths"), list):
        checks.append(("sequences (batch.sequence_lengths)", len(batch["sequence_lengths"]),
                       settings.max_sequences, "max_sequences"))
    workload = request.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("metaops"), list):
        checks.append(("metaops (workload.metaops)", len(workload["metaops"]), settings.max_metaops, "max_metaops"))
    for what, value, limit, name in checks:
        if value is not None and value > limit:
            raise TooLarge(f"request has {value} {what}; this service's limit {name} is {limit} "
                           f"(PARAPLAN_{name.upper()})")
