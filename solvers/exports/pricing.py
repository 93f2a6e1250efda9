"""What a framework's run of an export costs by the plan's own cost model: to choose, among the settings a
framework accepts, the one that runs fastest within the memory limit, and to tell the user how far the run is
from the plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from solvers.errors import SpecError
from solvers.exports.differences import differences
from solvers.exports.inputs import ExportInput, Request
from solvers.strategy import PlanStrategy

T = TypeVar("T")


@dataclass(frozen=True)
class RunEstimate:
    step_time_s: float
    peak_memory_gib: float
    fits: bool


def estimate_run(run: PlanStrategy, request: Request) -> RunEstimate:
    """``run`` priced under ``request``; SpecError where it is no valid plan there."""
    from solvers.cost_model.api import estimate  # the cost model is loaded only where an export is priced

    est = estimate({**request, "strategy": run.to_dict()})
    return RunEstimate(float(est["step_time_s"]), float(est["peak_memory_gib"]), bool(est["fits"]))


def fastest_that_fits(request: Request, options: Sequence[tuple[T, PlanStrategy]]) -> T | None:
    """Of (option, the plan a framework runs with it): the option whose plan runs fastest within the memory
    limit by the request's cost model, else the one needing the least memory; None where none can be
    estimated."""
    scored = []
    for option, run in options:
        try:
            est = estimate_run(run, request)
        except SpecError:
            continue
        scored.append(((not est.fits, est.step_time_s if est.fits else est.peak_memory_gib), option))
    return min(scored, key=lambda t: t[0])[1] if scored else None


def as_run(run: PlanStrategy, job: ExportInput, framework: str) -> tuple[list[str], RunEstimate | None]:
    """The notes on the framework's run of the export, estimated against the plan (none without the request):
    the whole run, then each difference from the plan priced alone; and the whole run's estimate (None where
    there is none)."""
    if job.request is None:
        return [], None
    try:
        est = estimate_run(run, job.request)
    except SpecError as err:  # the run is no valid plan: say why once, not once per layer of the run
        why = "; ".join(dict.fromkeys(p.msg for p in err.problems))
        return [f"{framework} cannot run it as exported: {why}"], None
    plan_step = job.plan_step_time_s
    slower = f" ({est.step_time_s / plan_step - 1:+.1%} against the plan's {plan_step:.4g} s)" if plan_step else ""
    fits = "" if est.fits else ": OVER THE MEMORY LIMIT, it would not run"
    whole = (f"as {framework} runs it, estimated step {est.step_time_s:.4g} s{slower}, "
             f"peak {est.peak_memory_gib:.1f} GiB per GPU{fits}")
    return [whole, *priced_differences(run, job)], est


def priced_differences(run: PlanStrategy, job: ExportInput) -> list[str]:
    """One line per difference between the plan and the framework's run, each the plan with only that difference
    estimated against the plan (the differences interact: their costs need not add up to the whole run's)."""
    assert job.request is not None
    diffs = differences(job.plan, run)
    if not diffs:
        return []
    try:
        base = estimate_run(job.plan, job.request)
    except SpecError:
        return [f"differs from the plan in: {d.what}" for d in diffs]
    lines = [f"{len(diffs)} difference(s) from the plan, each estimated alone (the plan with only that change; "
             "together they cost the run's figure above, not their sum):"]
    for d in diffs:
        try:
            est = estimate_run(d.changed, job.request)
        except SpecError as err:
            lines.append(f"- {d.what}: not a plan on its own ({err.problems[0].msg})")
            continue
        fits = "" if est.fits else ", over the memory limit"
        lines.append(f"- {d.what}: step {est.step_time_s / base.step_time_s - 1:+.1%}, "
                     f"peak {est.peak_memory_gib - base.peak_memory_gib:+.1f} GiB{fits}")
    return lines


def as_run_notes(run: PlanStrategy, job: ExportInput, framework: str) -> list[str]:
    """The framework's run of the export, estimated by the plan's own cost model against the plan, and each
    difference from the plan priced alone."""
    return as_run(run, job, framework)[0]
