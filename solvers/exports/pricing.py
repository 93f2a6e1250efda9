"""What a framework's run of an export costs by the plan's own cost model: to choose, among the settings a
framework accepts, the one that runs fastest within the memory limit, and to tell the user how far the run is
from the plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from solvers.errors import SpecError
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


def as_run(run: PlanStrategy, job: ExportInput, framework: str) -> tuple[str, RunEstimate | None]:
    """The note on the framework's run of the export, estimated against the plan (empty without the request),
    and that estimate (None where there is none)."""
    if job.request is None:
        return "", None
    try:
        est = estimate_run(run, job.request)
    except SpecError as err:  # the run is no valid plan: say why once, not once per layer of the run
        return f"{framework} cannot run it as exported: " + "; ".join(dict.fromkeys(p.msg for p in err.problems)), None
    plan_step = job.plan_step_time_s
    slower = f" ({est.step_time_s / plan_step - 1:+.1%} against the plan's {plan_step:.4g} s)" if plan_step else ""
    fits = "" if est.fits else ": OVER THE MEMORY LIMIT, it would not run"
    return (f"as {framework} runs it, estimated step {est.step_time_s:.4g} s{slower}, "
            f"peak {est.peak_memory_gib:.1f} GiB per GPU{fits}"), est


def as_run_note(run: PlanStrategy, job: ExportInput, framework: str) -> str:
    """The framework's run of the export, estimated by the plan's own cost model against the plan."""
    return as_run(run, job, framework)[0]
