"""Galvatron's plan file (``galvatron_config_*.json``). Galvatron is the one framework that takes a strategy per
layer; what it still runs differently is found by reading the written file back as a plan, and stated in
``_paraplan_notes`` (a key Galvatron ignores)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from solvers.errors import SpecError
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request
from solvers.exports.pricing import as_run_note
from solvers.formats.galvatron import plan_from_galvatron_config, plan_to_galvatron_config
from solvers.strategy import PlanStrategy


def galvatron_notes(plan: PlanStrategy, run: PlanStrategy) -> list[str]:
    """What Galvatron runs differently from the plan (``run``: the written file read back), one note per kind of
    change with the number of layers it touches."""
    changes: Counter[tuple[str, Any, Any]] = Counter()
    for a, b in zip(plan.layers, run.layers, strict=True):
        for key in ("tp", "dp", "cp", "sp", "zero", "recompute", "ep", "etp"):
            if getattr(a, key) != getattr(b, key):
                changes[(key, getattr(a, key), getattr(b, key))] += 1
    why = {"recompute": "Galvatron checkpoints whole layers",
           "zero": "Galvatron sets ZeRO-3 per layer and one default_dp_type, ddp or zero2, for all other layers",
           "sp": "Galvatron's sequence_parallel is one switch for every tensor-parallel layer"}

    def say(key: str, value: Any, named: bool = True) -> str:
        return f"ZeRO-{value}" if key == "zero" else f"{key} {value}" if named else str(value)

    notes = [f"{n} of {len(plan.layers)} layers: {say(key, a)} written as {say(key, b, named=False)}"
             + (f" ({why[key]})" if key in why else "") for (key, a, b), n in changes.items()]
    if plan.embedding != run.embedding:
        notes.append(f"embedding {plan.embedding.to_dict()} written as {run.embedding.to_dict()} "
                     "(Galvatron's embed_sdp is ZeRO-3, else the layers' default_dp_type)")
    return notes


def _read_back(config: dict[str, Any], plan: PlanStrategy, num_gpus: int | None) -> PlanStrategy:
    """The plan Galvatron runs from ``config``; without the cluster's GPU count, the plan's own."""
    return plan_from_galvatron_config(config, num_gpus or plan.pp * (plan.layers[0].world if plan.layers else 1))


def galvatron_run_plan(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                       request: Request | None = None) -> PlanStrategy | None:
    """What Galvatron runs from the plan's export (``RunPlan``): its file read back on the plan's GPUs; None
    where Galvatron cannot express the plan (context or expert parallelism, interleaving) or read it back."""
    try:
        return _read_back(plan_to_galvatron_config(plan), plan, None)
    except SpecError:
        return None


def with_both_embedding_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the embedding's ZeRO-3 switch under both names Galvatron has read: ``embed_sdp``
    (hetu-galvatron 2.4.0 on PyPI) and ``vocab_sdp`` (Galvatron's HEAD, which ignores ``embed_sdp``: a ZeRO-3
    embedding written only as that would silently run unsharded there). Each version ignores the other's key."""
    return {**config, "vocab_sdp": config.get("embed_sdp", 0)}


def galvatron_json(job: ExportInput) -> str:
    """Galvatron's plan file, with ``_paraplan_notes`` saying what it runs differently: the file read back,
    against the plan (and, with the request, estimated as the other exports are)."""
    plan = job.plan
    config = with_both_embedding_keys(plan_to_galvatron_config(plan, global_batch_size=job.batch,
                                                               num_gpus=job.num_gpus))
    try:
        run = _read_back(config, plan, job.num_gpus)
    except SpecError as err:
        notes = [f"Galvatron cannot read this file back as a plan: {err}"]
    else:
        note = as_run_note(run, job, "Galvatron")
        notes = ([note] if note else []) + galvatron_notes(plan, run)
    if config["vocab_sdp"]:
        notes.append("the embedding's ZeRO-3 is written as both embed_sdp (hetu-galvatron 2.4.0) and vocab_sdp "
                     "(Galvatron HEAD): each version reads one and ignores the other")
    config["_paraplan_notes"] = notes
    return json.dumps(config, indent=2) + "\n"


EXPORTER = Exporter("galvatron", "application/json", "json", galvatron_run_plan, galvatron_json)
