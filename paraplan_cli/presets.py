"""``paraplan presets``: the names a request may use for a model, a GPU and a Spindle workload, with what each is.

Read from the preset tables themselves, so a preset added there is listed here. Names that are one preset under
two spellings (``llama2-7b`` and ``llama-2-7b``) are one row with its aliases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _grouped(table: Mapping[str, dict[str, Any]]) -> list[tuple[str, list[str], dict[str, Any]]]:
    """(name, aliases, fields) per distinct preset, in the table's order (the first spelling is the name)."""
    out: list[tuple[str, list[str], dict[str, Any]]] = []
    for name, fields in table.items():
        same = next((row for row in out if row[2] == fields), None)
        if same is None:
            out.append((name, [], fields))
        else:
            same[1].append(name)
    return out


def _params(count: int) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def presets() -> dict[str, list[dict[str, Any]]]:
    """Every preset by kind: its name (``preset``), aliases and what it stands for."""
    from solvers.presets import GPU_PRESETS, MODEL_PRESETS
    from solvers.specs import ModelSpec
    from solvers.spindle.presets import WORKLOAD_PRESETS

    models = []
    for name, aliases, fields in _grouped(MODEL_PRESETS):
        spec = ModelSpec(**fields)
        models.append({**fields, "preset": name, "aliases": aliases, "parameters": spec.total_params()})
    gpus = [{**fields, "preset": name, "aliases": aliases} for name, aliases, fields in _grouped(GPU_PRESETS)]
    workloads = []
    for name, build in WORKLOAD_PRESETS.items():
        doc = build()
        workloads.append({"preset": name, "metaops": len(doc["metaops"]),
                          "tasks": sorted({op.get("task") or op["name"] for op in doc["metaops"]})})
    return {"models": models, "gpus": gpus, "workloads": workloads}


def render(found: Mapping[str, list[dict[str, Any]]]) -> str:
    lines = ['models ("model": {"preset": NAME}; fields given beside it override the preset\'s):',
             f"  {'name':<14} {'params':>7} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} {'mlp':<6} aliases"]
    for m in found["models"]:
        kv = m.get("num_kv_heads") or m["num_attention_heads"]
        moe = f" (MoE, {m['moe']['num_experts']} experts)" if m.get("moe") else ""
        lines.append(f"  {m['preset']:<14} {_params(m['parameters']):>7} {m['num_layers']:>6} {m['hidden_size']:>6} "
                     f"{m['num_attention_heads']:>5} {kv:>3} {m.get('mlp', 'gelu'):<6} "
                     f"{', '.join(m['aliases']) or '-'}{moe}")
    lines += ["", 'gpus ("cluster": {"gpu": NAME}, or {"gpu": {"preset": NAME, ...overrides}}):',
              f"  {'name':<11} {'TFLOP/s':>7} {'matmul':>7} {'memory':>10} {'NVLink':>9} {'network':>10}  aliases"]
    for g in found["gpus"]:
        nvlink, network = g.get("intra_node_bandwidth_GBps", 0), g.get("inter_node_bandwidth_Gbps", 0)
        # the measured matmul share of the bf16 peak the cost model prices GEMMs at ("-": assumed, the A100's)
        matmul = f"{100 * g['matmul_tflops'] / g['peak_tflops']:.1f}%" if g.get("matmul_tflops") else "-"
        lines.append(f"  {g['preset']:<11} {g['peak_tflops']:>7g} {matmul:>7} {g['memory_gib']:>6g} GiB "
                     f"{nvlink:>5g} GB/s {network:>5g} Gb/s  {', '.join(g['aliases']) or '-'}")
    lines += ["", 'spindle workloads ("kind": "spindle", "workload": {"preset": NAME, "batch_scale": K}):']
    for w in found["workloads"]:
        lines.append(f"  {w['preset']:<14} {w['metaops']:>3} metaops, tasks: {', '.join(w['tasks'])}")
    lines.append("(each preset's fields: paraplan presets --json)")
    return "\n".join(lines)
