"""Short labels for a plan request (model, cluster, batch) and the headline numbers of a plan's stored estimate.

Used by the plans list and the page headers. A request is the user's document as stored (each kind's parser
decides what it means), so the labels read it tolerantly: a shape they do not know shows dashes, never an
error page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.ui import format as fmt
from solvers.specs import DEFAULT_GPUS_PER_NODE, DEFAULT_NODES, DEFAULT_SEQ_LENGTH


def as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def cluster_size(request: Mapping[str, Any]) -> int:
    cluster = as_map(request.get("cluster"))
    try:
        return int(cluster.get("nodes", DEFAULT_NODES)) * int(cluster.get("gpus_per_node", DEFAULT_GPUS_PER_NODE))
    except (TypeError, ValueError):
        return 0


def model_label(request: Mapping[str, Any]) -> str:
    model = request.get("model")
    if isinstance(model, Mapping):
        hf = as_map(model.get("hf_config"))
        hf_name = hf.get("_name_or_path") or (f"{hf['model_type']} (HF config)" if hf.get("model_type") else None)
        return str(model.get("preset") or model.get("name") or hf_name or "custom")
    if isinstance(model, str):
        return model
    workload = as_map(request.get("workload"))
    if workload.get("preset"):
        return f"workload {workload['preset']}"
    ops = workload.get("metaops")
    if isinstance(ops, list) and ops:
        tasks = {str(as_map(op).get("task", "")) for op in ops} - {""}
        return f"{len(ops)} metaops, {len(tasks)} tasks"
    return fmt.DASH


def gpu_label(request: Mapping[str, Any]) -> str:
    """The device the request plans for, as it names it (a preset or a GPU object's name); "" when unnamed."""
    gpu = as_map(request.get("cluster")).get("gpu")
    if isinstance(gpu, Mapping):
        gpu = gpu.get("name") or gpu.get("preset")
    return str(gpu or "")


def has_profile(request: Mapping[str, Any]) -> bool:
    """Whether the request prices with a measured profile (cost_model.profile or profile_path)."""
    cost_model = as_map(request.get("cost_model"))
    return bool(cost_model.get("profile") or cost_model.get("profile_path"))


def cluster_label(request: Mapping[str, Any]) -> str:
    cluster = as_map(request.get("cluster"))
    if not cluster:
        return fmt.DASH
    gpu_name = gpu_label(request)
    nodes, per = cluster.get("nodes", DEFAULT_NODES), cluster.get("gpus_per_node", DEFAULT_GPUS_PER_NODE)
    return f"{nodes}×{per} {gpu_name}".strip()


def batch_label(request: Mapping[str, Any]) -> str:
    training = as_map(request.get("training"))
    if training:
        return f"batch {training.get('global_batch_size', '?')} × seq {training.get('seq_length', DEFAULT_SEQ_LENGTH)}"
    lengths = as_map(request.get("batch")).get("sequence_lengths")
    if isinstance(lengths, list):
        return f"{len(lengths)} sequences, {fmt.number(sum(x for x in lengths if isinstance(x, int | float)))} tokens"
    return ""


def headline(kind: str, estimate: Mapping[str, Any] | None) -> dict[str, float | None]:
    """Step time, throughput (samples/s) and MFU of a plan's stored estimate (None until it is solved), whatever
    the kind."""
    est = estimate or {}
    step = fmt.as_float(est.get("step_time_s"))
    if step is None:
        step = fmt.as_float(est.get("iteration_time_s"))
    return {"step_time_s": step, "throughput": fmt.as_float(est.get("throughput_samples_per_s")),
            "tokens_per_s": fmt.as_float(est.get("tokens_per_s")), "mfu": fmt.as_float(est.get("mfu"))}
