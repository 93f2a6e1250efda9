"""Export a hybrid plan to the launch formats people run: Megatron-LM arguments, a DeepSpeed config, a torchtitan
0.3.0 command line and Galvatron's ``galvatron_config_*.json``, one module per framework.

Only Galvatron can express a per-layer strategy. For the others the plan's *dominant* layer strategy (the one most
layers use; ties go to the more memory-frugal one) is written, and every approximation is listed in the output
(comments, or a ``_paraplan_notes`` key in JSON): layers that differ, uneven stage sizes, ZeRO levels or sequence-
parallel kinds the framework lacks. With the request, the output opens with the estimate of the framework's whole
run and then each difference from the plan priced alone (``differences``). Recomputation that only some layers use
maps to each framework's per-layer-count knob where it has one (Megatron's block recompute); Megatron-LM takes one
granularity per run, so a plan mixing full and selective layers is written as the setting it accepts that runs
fastest within the memory limit by the plan's cost model.

This module is the only one that reads the result document and the request (``export``); the framework modules get
what they need of them (``ExportInput``)."""

from __future__ import annotations

from typing import Literal, get_args

from solvers.cost_model.validate import check_structure
from solvers.documents.hybrid import BaselineDoc, BaselineName, HybridEstimate, HybridResult, StrategyDoc
from solvers.errors import SpecError
from solvers.exports import deepspeed, galvatron, megatron, torchtitan
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request, UniformPlan
from solvers.request import HybridRequest, parse

ExportFormat = Literal["megatron", "deepspeed", "torchtitan", "galvatron"]
ExportOf = Literal["plan", BaselineName]  # the plan, or one of its baselines
FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)
EXPORT_OF: tuple[ExportOf, ...] = get_args(ExportOf)
EXPORTERS: dict[str, Exporter] = {
    e.name: e for e in (megatron.EXPORTER, deepspeed.EXPORTER, torchtitan.EXPORTER, galvatron.EXPORTER)}
if tuple(EXPORTERS) != FORMATS:  # a format the API accepts without a writer would fail only when asked for
    raise ImportError(f"export formats {FORMATS} and writers {tuple(EXPORTERS)} differ")

__all__ = ["EXPORTERS", "EXPORT_OF", "FORMATS", "ExportFormat", "ExportInput", "ExportOf", "Exporter", "export"]


def export(result: HybridResult, fmt: str, request: Request | None = None, of: str = "plan") -> str:
    """The plan of a hybrid ``result`` in ``fmt`` (``megatron``, ``deepspeed``, ``torchtitan``,
    ``galvatron``). ``request`` (the plan's request) supplies batch and model; without it the batch is
    recovered from the estimate and the model arguments are left out. ``of`` names what to export: the plan,
    or one of the result's baselines (``megatron``: the best uniform plan, which Megatron-LM runs as it is)."""
    if fmt not in EXPORTERS:
        raise SpecError.at(("format",), f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    strategy, estimate = _exported(result, of)
    parsed = _parsed(request)
    try:
        plan = strategy.to_plan()
    except ValueError as err:  # stage_layers that do not match pp or the layers
        raise SpecError.at(("result", "strategy"), f"not a hybrid plan: {err}") from None
    # a stored result may be damaged or come from another version of paraplan: micro_batches 0 or ZeRO 7 raised
    # ZeroDivisionError / KeyError deep in the writers (an HTTP 500)
    problems = check_structure(plan, ("result", "strategy"))
    if problems:
        raise SpecError(problems)
    batch, seq = _batch(estimate, parsed)
    job = ExportInput(plan=plan, batch=batch, seq=seq, model=parsed.model if parsed else None,
                      num_gpus=parsed.cluster.num_gpus if parsed else None, request=request,
                      training=parsed.training if parsed else None,
                      plan_step_time_s=estimate.step_time_s if estimate else 0.0, uniform=_uniform(result))
    return EXPORTERS[fmt].write(job)


def _exported(result: HybridResult, of: str) -> tuple[StrategyDoc, HybridEstimate | None]:
    """The strategy and estimate to export: the plan's, or those of its baseline ``of``."""
    if of == "plan":
        return result.strategy, result.estimate
    baselines: dict[str, BaselineDoc | None] = {name: base for name, base in result.baselines.items()}
    if of not in baselines:
        known = ", ".join(["plan", *baselines])
        raise SpecError.at(("of",), f"unknown plan to export {of!r}; this result has: {known}")
    base = baselines[of]
    if base is None or base.strategy is None:
        why = (base.note if base is not None else None) or "it does not fit"
        raise SpecError.at(("of",), f"the {of} baseline has no plan to export: {why}")
    return base.strategy, base.estimate


def _parsed(request: Request | None) -> HybridRequest | None:
    if request is None:
        return None
    try:
        parsed: HybridRequest = parse(HybridRequest, request)
    except SpecError as err:
        raise err.under("request") from None
    return parsed


def _batch(estimate: HybridEstimate | None, request: HybridRequest | None) -> tuple[int, int]:
    """(global batch, sequence length) from the request, else recovered from the estimate."""
    if request is not None:
        return request.training.global_batch_size, request.training.seq_length
    if estimate is None or not estimate.throughput_samples_per_s or not estimate.step_time_s:
        raise SpecError.at(("request", "training"), "exporting needs the request's training batch")
    thr = estimate.throughput_samples_per_s
    return round(thr * estimate.step_time_s), round(estimate.tokens_per_s / thr)


def _uniform(result: HybridResult) -> UniformPlan | None:
    """The result's best uniform Megatron-style plan where it fits (a damaged one is left out: it only ever
    adds a hint to the Megatron export's note)."""
    base = result.baselines.get("megatron")
    if base is None or not base.fits or base.strategy is None or base.estimate is None or not base.estimate.step_time_s:
        return None
    try:
        return UniformPlan(base.strategy.to_plan(), base.estimate.step_time_s)
    except ValueError:
        return None
