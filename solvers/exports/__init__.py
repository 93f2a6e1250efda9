"""Export a hybrid plan to the launch formats people run: Megatron-LM arguments, a DeepSpeed config, a
torchtitan TOML and Galvatron's ``galvatron_config_*.json``, one module per framework.

Only Galvatron can express a per-layer strategy. For the others the plan's *dominant* layer strategy (the
one most layers use; ties go to the more memory-frugal one) is written, and every approximation is listed
in the output (comments, or a ``_paraplan_notes`` key in JSON): layers that differ, uneven stage sizes,
ZeRO levels or sequence-parallel kinds the framework lacks. Recomputation that only some layers use maps to
each framework's per-layer-count knob where it has one (Megatron's block recompute); Megatron-LM takes one
granularity per run, so a plan mixing full and selective layers is written as the setting it accepts that runs
fastest within the memory limit by the plan's cost model.

This module is the only one that reads the result and request documents (``export``); the framework modules
get them parsed (``ExportInput``).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from solvers.cost_model.validate import check_structure
from solvers.errors import SpecError
from solvers.exports import deepspeed, galvatron, megatron, torchtitan
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request, UniformPlan
from solvers.specs import ModelSpec
from solvers.strategy import PlanStrategy

ExportFormat = Literal["megatron", "deepspeed", "torchtitan", "galvatron"]
ExportOf = Literal["plan", "megatron", "zero3_dp", "pure_dp"]  # the plan, or one of its baselines
FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)
EXPORT_OF: tuple[ExportOf, ...] = get_args(ExportOf)
EXPORTERS: dict[str, Exporter] = {
    e.name: e for e in (megatron.EXPORTER, deepspeed.EXPORTER, torchtitan.EXPORTER, galvatron.EXPORTER)}
if tuple(EXPORTERS) != FORMATS:  # a format the API accepts without a writer would fail only when asked for
    raise ImportError(f"export formats {FORMATS} and writers {tuple(EXPORTERS)} differ")

__all__ = ["EXPORTERS", "EXPORT_OF", "FORMATS", "ExportFormat", "ExportInput", "ExportOf", "Exporter", "export"]


def export(result: dict[str, Any], fmt: str, request: dict[str, Any] | None = None, of: str = "plan") -> str:
    """The plan of a hybrid ``result`` in ``fmt`` (``megatron``, ``deepspeed``, ``torchtitan``,
    ``galvatron``). ``request`` (the plan's request) supplies batch and model; without it the batch is
    recovered from the estimate and the model arguments are left out. ``of`` names what to export: the plan,
    or one of the result's baselines (``megatron``: the best uniform plan, which Megatron-LM runs as it is)."""
    if fmt not in EXPORTERS:
        raise SpecError.at(("format",), f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    if of != "plan":
        result = _baseline_result(result, of)
    try:
        plan = PlanStrategy.from_dict(result["strategy"])
    except (KeyError, TypeError, ValueError) as err:
        raise SpecError.at(("result", "strategy"), f"not a hybrid plan: {err}") from None
    # a stored result may be damaged or come from another version of paraplan: micro_batches 0 or ZeRO 7 raised
    # ZeroDivisionError / KeyError deep in the writers (an HTTP 500)
    problems = check_structure(plan, ("result", "strategy"))
    if problems:
        raise SpecError(problems)
    batch, seq = _batch(result, request)
    estimate = result.get("estimate") or {}
    job = ExportInput(plan=plan, batch=batch, seq=seq, model=_model(request), num_gpus=_num_gpus(request),
                      request=request, plan_step_time_s=float(estimate.get("step_time_s") or 0.0),
                      uniform=_uniform(result))
    return EXPORTERS[fmt].write(job)


def _baseline_result(result: dict[str, Any], name: str) -> dict[str, Any]:
    """A result whose plan is the baseline ``name`` (its strategy and estimate; the baselines kept)."""
    baselines = result.get("baselines") or {}
    if name not in baselines:
        known = ", ".join(["plan", *baselines])
        raise SpecError.at(("of",), f"unknown plan to export {name!r}; this result has: {known}")
    base = baselines[name] if isinstance(baselines[name], dict) else {}
    if not base.get("strategy"):
        why = base.get("note") or "it does not fit"
        raise SpecError.at(("of",), f"the {name} baseline has no plan to export: {why}")
    return {**result, "strategy": base["strategy"], "estimate": base.get("estimate") or {}}


def _batch(result: dict[str, Any], request: Request | None) -> tuple[int, int]:
    """(global batch, sequence length) from the request, else recovered from the estimate."""
    if request is not None:
        t = request.get("training", {})
        if "global_batch_size" in t:
            return int(t["global_batch_size"]), int(t.get("seq_length", 2048))
    est = result.get("estimate", {})
    thr, step = est.get("throughput_samples_per_s"), est.get("step_time_s")
    if not thr or not step:
        raise SpecError.at(("request", "training"), "exporting needs the request's training batch")
    return round(thr * step), round(est.get("tokens_per_s", 0.0) / thr)


def _model(request: Request | None) -> ModelSpec | None:
    if request is None or "model" not in request:
        return None
    try:
        return ModelSpec.model_validate(request["model"])
    except ValueError:
        return None


def _num_gpus(request: Request | None) -> int | None:
    if request is None:
        return None
    c = request.get("cluster", {})
    return int(c.get("nodes", 1)) * int(c.get("gpus_per_node", 8))


def _uniform(result: dict[str, Any]) -> UniformPlan | None:
    """The result's best uniform Megatron-style plan where it fits (a damaged one is left out: it only ever
    adds a hint to the Megatron export's note)."""
    base = (result.get("baselines") or {}).get("megatron") or {}
    step = (base.get("estimate") or {}).get("step_time_s")
    if not (base.get("fits") and step):
        return None
    try:
        return UniformPlan(PlanStrategy.from_dict(base["strategy"]), float(step))
    except (KeyError, TypeError, ValueError):
        return None
