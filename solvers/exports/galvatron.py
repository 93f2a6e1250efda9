"""Galvatron's plan file (``galvatron_config_*.json``). Galvatron is the one framework that takes a strategy per
layer; what it still runs differently is found by reading the written file back as a plan, and stated in
``_paraplan_notes`` (a key Galvatron ignores).

Galvatron has no context or expert parallelism and no interleaved schedule. A plan using them is written as the
nearest plan Galvatron runs: the experts sharded as the layer's MLP, 1F1B over the same stages, and each
context-parallel group folded into the layer's tensor-parallel group, as Ulysses (Galvatron's ``use_sp``) or
Megatron-style TP, or into its data parallelism; with the request, the fold that runs fastest within the memory
limit by the plan's cost model, else Ulysses (which keeps the sequence split over the same GPUs)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, get_args

from solvers.errors import SpecError
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request
from solvers.exports.pricing import as_run_notes, fastest_that_fits
from solvers.formats.galvatron import plan_from_galvatron_config, plan_to_galvatron_config
from solvers.strategy import LayerStrategy, PlanStrategy

CpAs = Literal["ulysses", "tp", "dp"]  # what a context-parallel group becomes in Galvatron
CP_AS: tuple[CpAs, ...] = get_args(CpAs)


def _expressible_layer(x: LayerStrategy, cp_as: CpAs) -> LayerStrategy:
    x = replace(x, ep=1, etp=None, lsh=False)
    if x.cp == 1:
        return x
    if cp_as == "dp":
        return replace(x, cp=1, dp=x.dp * x.cp)
    return replace(x, tp=x.tp * x.cp, cp=1, sp="ulysses" if cp_as == "ulysses" else "megatron")


def galvatron_expressible(plan: PlanStrategy, cp_as: CpAs = "ulysses") -> PlanStrategy:
    """The nearest plan Galvatron can write: no experts' layout, no interleaving, context parallelism folded
    as ``cp_as``."""
    interleaved = plan.schedule == "interleaved" or plan.virtual_stages > 1
    return replace(plan, layers=tuple(_expressible_layer(x, cp_as) for x in plan.layers),
                   schedule="1f1b" if interleaved else plan.schedule, virtual_stages=1)


def galvatron_cp_as(plan: PlanStrategy, request: Request | None) -> CpAs:
    """How the export folds the plan's context parallelism (module docstring)."""
    if request is None or all(x.cp == 1 for x in plan.layers):
        return "ulysses"
    runs = []
    for cp_as in CP_AS:
        try:
            runs.append((cp_as, _read_back(plan_to_galvatron_config(galvatron_expressible(plan, cp_as)), plan, None)))
        except SpecError:
            continue
    return fastest_that_fits(request, runs) or "ulysses"


def galvatron_notes(plan: PlanStrategy, run: PlanStrategy) -> list[str]:
    """What Galvatron runs differently from the plan (``run``: the written file read back), one note per kind of
    change with the number of layers it touches."""
    changes: Counter[tuple[str, Any, Any]] = Counter()
    for a, b in zip(plan.layers, run.layers, strict=True):
        for key in ("tp", "dp", "cp", "sp", "zero", "recompute", "ep", "etp"):
            if getattr(a, key) != getattr(b, key):
                changes[(key, getattr(a, key), getattr(b, key))] += 1
    why = {"recompute": "Galvatron checkpoints whole layers",
           "cp": "Galvatron has no context parallelism",
           "ep": "Galvatron has no expert parallelism: the experts are sharded as the layer's MLP",
           "zero": "Galvatron sets ZeRO-3 per layer and one default_dp_type, ddp or zero2, for all other layers",
           "sp": "Galvatron's sequence_parallel is one switch for every tensor-parallel layer"}

    def say(key: str, value: Any, named: bool = True) -> str:
        return f"ZeRO-{value}" if key == "zero" else f"{key} {value}" if named else str(value)

    notes = [f"{n} of {len(plan.layers)} layers: {say(key, a)} written as {say(key, b, named=False)}"
             + (f" ({why[key]})" if key in why else "") for (key, a, b), n in changes.items()]
    if plan.schedule == "interleaved" and run.schedule != plan.schedule:
        notes.append(f"interleaved schedule ({plan.virtual_stages} chunks per stage) written as {run.schedule} over "
                     "the same stages (Galvatron has GPipe and 1F1B)")
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
    where Galvatron cannot read it back."""
    try:
        written = galvatron_expressible(plan, galvatron_cp_as(plan, request))
        return _read_back(plan_to_galvatron_config(written), plan, None)
    except SpecError:
        return None


def with_both_embedding_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the embedding's ZeRO-3 switch under both names Galvatron has read: ``embed_sdp``
    (hetu-galvatron 2.4.0 on PyPI) and ``vocab_sdp`` (Galvatron's HEAD, which ignores ``embed_sdp``: a ZeRO-3
    embedding written only as that would silently run unsharded there). Each version ignores the other's key."""
    return {**config, "vocab_sdp": config.get("embed_sdp", 0)}


_FOLDS: dict[CpAs, str] = {"ulysses": "Ulysses over tp x cp GPUs (use_sp)",
                           "tp": "tensor parallelism over tp x cp GPUs", "dp": "more data parallelism (dp x cp)"}


def galvatron_json(job: ExportInput) -> str:
    """Galvatron's plan file, with ``_paraplan_notes`` saying what it runs differently: the file read back,
    against the plan (and, with the request, estimated as the other exports are)."""
    plan = job.plan
    cp_as = galvatron_cp_as(plan, job.request)
    config = with_both_embedding_keys(plan_to_galvatron_config(galvatron_expressible(plan, cp_as),
                                                               global_batch_size=job.batch, num_gpus=job.num_gpus))
    try:
        run = _read_back(config, plan, job.num_gpus)
    except SpecError as err:
        notes = [f"Galvatron cannot read this file back as a plan: {err}"]
    else:
        notes = as_run_notes(run, job, "Galvatron") + galvatron_notes(plan, run)
        if any(x.cp > 1 for x in plan.layers):
            notes.append(f"context parallelism runs as {_FOLDS[cp_as]}" + (
                ", the fold of the three that runs fastest within the memory limit by the plan's cost model"
                if job.request is not None else ""))
    if config["vocab_sdp"]:
        notes.append("the embedding's ZeRO-3 is written as both embed_sdp (hetu-galvatron 2.4.0) and vocab_sdp "
                     "(Galvatron HEAD): each version reads one and ignores the other")
    config["_paraplan_notes"] = notes
    return json.dumps(config, indent=2) + "\n"


EXPORTER = Exporter("galvatron", "application/json", "json", galvatron_run_plan, galvatron_json)
