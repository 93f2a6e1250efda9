"""The "new plan" form: its choices (presets) and the translation of posted fields into a plan request.

The form only assembles a request document; validation is the solvers' and the service's (a bad value
comes back as a SpecError naming the request field, which the page shows next to the form).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

import numpy as np

from solvers.documents import DEFAULT_KIND, PLAN_KINDS
from solvers.errors import FieldProblem, shown
from solvers.presets import GPU_PRESETS, MODEL_PRESETS
from solvers.specs import DEFAULT_GPUS_PER_NODE, DEFAULT_NODES, DEFAULT_SEQ_LENGTH, AttentionKernel, StackSpec
from solvers.spindle.presets import WORKLOAD_PRESETS

# FlexSP needs concrete sequence lengths: the synthetic long-tailed batch (lognormal around 4K
# tokens) is drawn with a fixed seed so the same form input is the same request (and is deduplicated).
FLEXSP_MEDIAN_TOKENS = 4096
FLEXSP_SIGMA = 1.6
FLEXSP_PAD = 128


def model_choices() -> list[str]:
    return sorted({str(v["name"]) for v in MODEL_PRESETS.values()})


def gpu_choices() -> list[str]:
    return sorted({str(v["name"]) for v in GPU_PRESETS.values()})


# training.stack.attention as the form offers it (hybrid plans)
ATTENTION_LABELS: dict[AttentionKernel, str] = {"fused": "fused (FlashAttention, cuDNN: today's frameworks)",
                                                "unfused": "unfused (Megatron-LM of 2021)"}


def attention_choices() -> list[tuple[str, str]]:
    return [(a, ATTENTION_LABELS[a]) for a in get_args(AttentionKernel)]


def spindle_workloads() -> dict[str, dict[str, Any]]:
    """The Spindle solver's workload presets, each as the request's ``workload``."""
    return {name: {"preset": name} for name in WORKLOAD_PRESETS}


@dataclass
class FormInput:
    kind: str = DEFAULT_KIND
    model: str = "llama2-7b"
    gpu: str = "A100-80GB"
    nodes: int = DEFAULT_NODES
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    global_batch_size: int = 64
    seq_length: int = DEFAULT_SEQ_LENGTH
    memory_limit_gib: float | None = None
    attention: str = StackSpec().attention
    workload: str = ""
    exact: bool = True  # Spindle: run the CP-SAT model after the wavefront planner (up to its time limit)
    hf_config: str = ""  # a pasted Hugging Face config.json: the model instead of the preset
    errors: list[FieldProblem] = field(default_factory=list)


def _int(form: Mapping[str, Any], name: str, default: int, problems: list[FieldProblem]) -> int:
    raw = str(form.get(name, "")).strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        problems.append(FieldProblem((name,), f"must be a whole number, got {shown(raw)}"))
        return default


def read_form(form: Mapping[str, Any]) -> FormInput:
    """Posted fields -> FormInput, with ``errors`` naming every unparsable field (the page shows the form
    again with the user's values and the errors)."""
    problems: list[FieldProblem] = []
    out = FormInput()
    out.kind = str(form.get("kind") or DEFAULT_KIND)
    if out.kind not in PLAN_KINDS:
        problems.append(FieldProblem(("kind",), f"unknown plan kind {out.kind!r}; expected one of {list(PLAN_KINDS)}"))
    out.model = str(form.get("model") or out.model)
    out.gpu = str(form.get("gpu") or out.gpu)
    out.nodes = _int(form, "nodes", out.nodes, problems)
    out.gpus_per_node = _int(form, "gpus_per_node", out.gpus_per_node, problems)
    out.global_batch_size = _int(form, "global_batch_size", out.global_batch_size, problems)
    out.seq_length = _int(form, "seq_length", out.seq_length, problems)
    out.workload = str(form.get("workload") or "")
    out.attention = str(form.get("attention") or out.attention)
    if out.attention not in ATTENTION_LABELS:
        problems.append(FieldProblem(("attention",), f"must be one of {', '.join(ATTENTION_LABELS)}, "
                                                     f"got {shown(out.attention)}"))
    out.exact = str(form.get("spindle_search") or "exact") != "wavefront"
    out.hf_config = str(form.get("hf_config") or "").strip()
    if out.hf_config:
        try:
            if not isinstance(json.loads(out.hf_config), dict):
                problems.append(FieldProblem(("hf_config",), "must be a JSON object (the config.json)"))
        except json.JSONDecodeError as err:
            problems.append(FieldProblem(("hf_config",), f"not JSON: {err.msg} at line {err.lineno} column "
                                                         f"{err.colno}"))
    raw_limit = str(form.get("memory_limit_gib", "")).strip()
    if raw_limit:
        try:
            out.memory_limit_gib = float(raw_limit)
        except ValueError:
            problems.append(FieldProblem(("memory_limit_gib",), f"must be a number of GiB, got {shown(raw_limit)}"))
    for name in ("nodes", "gpus_per_node", "global_batch_size", "seq_length"):
        if getattr(out, name) <= 0:
            problems.append(FieldProblem((name,), "must be positive"))
    out.errors = problems
    return out


def synthetic_lengths(count: int, context: int) -> list[int]:
    """The long-tailed batch of the FlexSP issue, clipped to the context and padded to 128 tokens."""
    rng = np.random.default_rng(0)
    raw = rng.lognormal(math.log(FLEXSP_MEDIAN_TOKENS), FLEXSP_SIGMA, count)
    clipped = np.clip(raw, 1, max(context - FLEXSP_PAD, 1))
    padded = np.ceil(clipped / FLEXSP_PAD) * FLEXSP_PAD
    return [int(x) for x in padded]


def to_request(inp: FormInput) -> dict[str, Any]:
    """The plan request the form describes."""
    cluster = {"gpu": inp.gpu, "nodes": inp.nodes, "gpus_per_node": inp.gpus_per_node}
    constraints = {"memory_limit_gib": inp.memory_limit_gib} if inp.memory_limit_gib else {}
    req: dict[str, Any] = {"kind": inp.kind, "cluster": cluster}
    if inp.kind == "spindle":
        workloads = spindle_workloads()
        chosen = workloads.get(inp.workload) or next(iter(workloads.values()))
        req["workload"] = chosen
        if not inp.exact:
            req["options"] = {"exact": False}
        return req
    req["model"] = {"hf_config": json.loads(inp.hf_config)} if inp.hf_config else {"preset": inp.model}
    if inp.kind == "flexsp":
        req["batch"] = {"sequence_lengths": synthetic_lengths(inp.global_batch_size, inp.seq_length)}
    else:
        req["training"] = {"global_batch_size": inp.global_batch_size, "seq_length": inp.seq_length,
                           "stack": {"attention": inp.attention}}
    if constraints:
        req["constraints"] = constraints
    return req
