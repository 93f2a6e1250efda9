"""``solve`` and ``estimate`` for ``kind = "hybrid"`` (the contract's hybrid result)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from typing import Any

from solvers.cost_model.api import estimate as _estimate
from solvers.cost_model.api import plan_of_request
from solvers.cost_model.base import CostModel
from solvers.cost_model.factory import make_cost_model
from solvers.cost_model.hetero import HeteroCostModel
from solvers.documents.hybrid import HybridEstimate, HybridEstimateResult, HybridResult
from solvers.errors import FieldProblem, InfeasibleError, SpecError
from solvers.hybrid import baselines, hetero, sizing, targets
from solvers.hybrid.cached import CachedStages
from solvers.hybrid.certificate import certify
from solvers.hybrid.min_memory import min_memory_bytes
from solvers.hybrid.planner import Planner, PlannerOptions
from solvers.hybrid.space import SearchSpace, build_space, expert_layers, layer_kinds, space_mode
from solvers.hybrid.summary import summarise as summarise  # (SolverKind.summarise)
from solvers.request import HybridRequest, parse
from solvers.strategy import PlanStrategy
from solvers.text import seconds

Progress = Callable[[float, str], None]
GIB = float(2**30)
# Wall-clock budget of a search unless the request sets constraints.time_limit_s: past it the best plan found
# so far (never worse than the baselines) is returned and search.time_limited says so. A user never waits
# minutes; typical searches take well under a second.
DEFAULT_TIME_LIMIT_S = 20.0
SIZING_START = 0.1  # the share of a sizing request's progress its own cluster's plan takes


def _no_interleaved_pipeline(space: SearchSpace) -> str:
    """Why no pipeline takes the interleaved schedule (the only schedule without a one-stage pipeline)."""
    chunks = min(space.virtual_stage_options)
    micro = f"constraints.micro_batches = {space.micro_batches[0]}" if space.micro_batches else \
        f"a global batch of {space.global_batch_size}"
    return (f"the interleaved schedule needs a pipeline of pp ≥ 2 stages (pp dividing the {space.num_gpus} GPUs, "
            f"pp ≤ {space.max_pp}), a number of micro-batches that pp divides and at least {chunks} layers a "
            f"stage; {space.num_layers} layers and {micro} allow none: choose another schedule")


def _gib(x: float) -> str:
    """GiB as the errors print them: a limit of 1 KiB read "0.0 GiB"."""
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def _infeasible(planner: Planner, cm: CostModel, galvatron: bool = False) -> InfeasibleError:
    need = min_memory_bytes(planner)
    limit = cm.memory_limit_bytes / GIB
    field: tuple[str, ...] = ("constraints", "memory_limit_gib")
    unsplittable = planner.space.unsplittable() if need == float("inf") else None
    if need == float("inf") and not planner.space.pipeline_configs():
        field, msg = ("constraints", "schedule"), _no_interleaved_pipeline(planner.space)
    elif unsplittable:  # (a fixed micro-batch count is what the degrees missed, when the request fixed it)
        field = ("constraints", "micro_batches") if planner.space.micro_batches else ("cluster",)
        msg = unsplittable
    elif need == float("inf"):  # no strategy is priced at all: memory is not what is short
        field = ("constraints",)
        rules = " and the Galvatron cost model's rules (cost_model: min_tp, max_tp, its micro-batching)" \
            if galvatron else ""
        msg = f"no plan satisfies the constraints (no legal strategy for this model on this cluster under them{rules})"
    elif need / GIB > limit:
        msg = (f"no plan fits in {_gib(limit)} GiB per GPU, even with ZeRO-3, full recompute and up to "
               f"pp={max(planner.space.pp_options())}; any plan needs at least {_gib(need / GIB)} GiB per GPU")
    elif planner.time_limited:
        field = ("constraints", "time_limit_s")
        msg = (f"the search stopped at its time limit before finding a plan; the leanest plan needs "
               f"{_gib(need / GIB)} GiB per GPU, within the {_gib(limit)} GiB limit: allow more time")
    else:  # the layer DP rounds memory up to its bins, so a plan this close to the limit can be missed
        msg = (f"the leanest plan needs {_gib(need / GIB)} GiB per GPU, within a memory bin of the {_gib(limit)} GiB "
               "limit, and the search's memory resolution missed it: raise the limit slightly")
    err = InfeasibleError([FieldProblem(field, msg)])
    err.min_memory_gib = need / GIB  # type: ignore[attr-defined]
    return err


def validate(request: dict[str, Any]) -> None:
    """What a request must pass before it is queued (the service's 422): its fields, its cost model's
    (calibration, profile, Galvatron's files) and its constraints against the batch; milliseconds."""
    req: HybridRequest = parse(HybridRequest, request)
    make_cost_model(req)
    build_space(req, space_mode(req))


def solve(request: dict[str, Any], progress: Progress | None = None,
          options: PlannerOptions | None = None) -> HybridResult:
    """The contract's hybrid result: the best plan, its estimate, the search and the baselines; on a cluster of
    groups also where each stage runs and the plan against the fastest group alone and a type-blind plan.

    The uniform baselines are solved first; the best one is the incumbent the planner must beat, so a
    configuration whose lower bound cannot beat it is never solved, and the plan never loses to it."""
    req: HybridRequest = parse(HybridRequest, request)
    model = make_cost_model(req)
    # with sizing, the request's own plan takes the first tenth of the progress and the sizes the rest
    own = progress if req.sizing is None else _progress_span(progress, 0.0, SIZING_START)
    result = _solve(req, request, model, own, options)
    if isinstance(model, HeteroCostModel):
        doc = hetero.report(result, req, request, model, lambda r: solve(r, options=options))
        result = result.model_copy(update={"hetero": doc})
    if req.sizing is not None:
        points, sized = sizing.front(req, request, quick_plan, progress=_progress_span(progress, SIZING_START, 1.0))
        result = result.model_copy(update={"front": points, "sizing": sized})
    return result


def _progress_span(progress: Progress | None, start: float, end: float) -> Progress | None:
    """``progress`` for a part of the work: its fractions 0..1 reported as ``start``..``end``."""
    if progress is None:
        return None
    report = progress
    return lambda f, msg: report(start + (end - start) * f, msg)


def quick_plan(request: dict[str, Any], beat_s: float = math.inf) -> tuple[PlanStrategy, HybridEstimate] | None:
    """The planner's plan for ``request``, seeded by its best uniform plan, without the certificate and the other
    baselines (a sizing front's many sizes); InfeasibleError where nothing fits. ``beat_s``: a step time the plan
    must beat (a sizing front's threshold): the search prunes against it from the start, and None means no plan
    does (every configuration's floor reaches it, or something fits and the search found nothing below it). The
    plan below ``beat_s`` is the one the search finds without it (a configuration is pruned only where its bound is
    at least the incumbent, which is then below ``beat_s``)."""
    req: HybridRequest = parse(HybridRequest, request)
    cm = CachedStages(make_cost_model(req))
    space = build_space(req, space_mode(req))
    kinds = layer_kinds(req.model)
    planner = Planner(cm, space, kinds, PlannerOptions(time_limit_s=req.constraints.time_limit_s or
                                                       DEFAULT_TIME_LIMIT_S))
    if math.isfinite(beat_s):  # every configuration's floor at the threshold: beaten before any baseline is priced
        floors = [f for f in map(planner.compute_floor, space.pipeline_configs()) if math.isfinite(f)]
        if floors and min(floors) >= beat_s:
            return None
    uniform = baselines.megatron(cm, space, kinds, expert_layers(req.model))
    uniform_s = uniform.step_time_s if uniform else math.inf
    try:
        plan = planner.search(incumbent_s=min(uniform_s, beat_s)).plan
    except LookupError:
        if uniform is not None and uniform_s < beat_s:
            plan = uniform.plan
        elif math.isfinite(beat_s) and (uniform is not None or
                                         min_memory_bytes(planner) <= cm.memory_limit_bytes):
            return None  # (something fits: nothing beats beat_s)
        else:
            raise _infeasible(planner, cm) from None
    return plan, cm.evaluate(plan)


def _solve(req: HybridRequest, request: dict[str, Any], model: CostModel, progress: Progress | None,
           options: PlannerOptions | None) -> HybridResult:
    t0, c0 = time.perf_counter(), time.process_time()
    cm = CachedStages(model)
    space = build_space(req, space_mode(req))
    kinds = layer_kinds(req.model)
    limit = req.constraints.time_limit_s or DEFAULT_TIME_LIMIT_S
    planner = Planner(cm, space, kinds, options or PlannerOptions(time_limit_s=limit))
    if progress:
        progress(0.0, "baselines")
    base = {
        "megatron": (baselines.megatron(cm, space, kinds, expert_layers(req.model)),
                     "no uniform Megatron-style plan fits"),
        "zero3_dp": (baselines.zero3_dp(cm, space, kinds), "ZeRO-3 data parallelism does not fit"),
        "pure_dp": (baselines.pure_dp(cm, space, kinds), "plain data parallelism does not fit"),
    }
    t_base, c_base = time.perf_counter() - t0, time.process_time() - c0
    if req.constraints.target != "paraplan":
        return _solve_for(req, request, cm, space, kinds, base, (t0, c0, t_base, c_base), progress)
    # only a baseline inside the constrained space may stand in for the plan (ZeRO-3 DP under zero=0 may not)
    found = [b for b, _ in base.values() if b is not None and space.allows(b.plan)]
    incumbent = min(found, key=lambda b: b.step_time_s) if found else None
    try:
        res = planner.search(progress, incumbent_s=incumbent.step_time_s if incumbent else float("inf"))
        plan, step, source = res.plan, res.step_time_s, "dp"
        stats: dict[str, Any] = {"configs_total": res.configs_total, "configs_solved": res.configs_solved,
                                 "configs_pruned_by_bound": res.configs_pruned_by_bound, "dp_runs": res.dp_runs,
                                 "time_limited": res.time_limited}
    except LookupError:
        if incumbent is None:
            raise _infeasible(planner, cm, req.cost_model.kind == "galvatron") from None
        plan, step, source = incumbent.plan, incumbent.step_time_s, f"baseline:{incumbent.name}"
        total, solved, pruned = planner.last_counts
        stats = {"configs_total": total, "configs_solved": solved, "configs_pruned_by_bound": pruned,
                 "dp_runs": planner.dp_runs, "time_limited": planner.time_limited}
    c_cert = time.process_time()
    if progress:
        progress(0.99, "optimality certificate")
    cert = certify(planner, ceiling=step)
    if cert.better is not None:  # a configuration the search's heuristic ordering left holds a faster plan
        plan, step = planner.finish(*cert.better)
        source = "dp"
    stats["configs_solved"] += cert.repaired
    stats["configs_solved_by_certificate"] = cert.repaired
    stats["configs_pruned_by_bound"] -= cert.repaired
    stats["time_limited"] = stats["time_limited"] or cert.time_limited
    stats["dp_runs"] = planner.dp_runs
    est = cm.evaluate(plan)
    # no bound exceeds a step the plan achieves: the planner's sum and the estimate's differ in the last bits
    bound = min(cert.bound_s, step, est.step_time_s)
    stats["lower_bound_step_time_s"] = bound if bound > 0 else None
    stats["optimality_gap"] = step / bound - 1.0 if bound > 0 else None
    stats["certificate_cpu_s"] = time.process_time() - c_cert
    search_s, search_cpu = time.perf_counter() - t0, time.process_time() - c0
    thr = est.throughput_samples_per_s
    out_base = {name: baselines.report(b, cm.evaluate(b.plan) if b else None, thr, why, bound, req.constraints)
                for name, (b, why) in base.items()}
    if progress:
        progress(1.0, "done")
    return HybridResult.model_validate({
        "estimate": _noting_given_strategy(req, cm, est.to_json()),
        "strategy": plan.to_dict(),
        "search": {
            "time_s": search_s,  # wall clock, baselines included
            "cpu_s": search_cpu,  # this process' CPU time: the fair figure on a shared machine
            "planner_cpu_s": c_cert - c0 - c_base,  # the DP search alone
            "solver": "dp",
            "target": "paraplan",
            "plan_from": source,
            **stats,
            "baselines_time_s": t_base,
            "baselines_cpu_s": c_base,
            "cost_model": req.cost_model.kind,
            "planner_step_time_s": step,
        },
        "baselines": out_base,
    })


Baselines = dict[str, tuple[baselines.Baseline | None, str]]


def _noting_given_strategy(req: HybridRequest, cm: CostModel, estimate: dict[str, Any]) -> dict[str, Any]:
    """The plan's estimate, with a note on the request's ``strategy`` where it has one: planning does not start
    from it (it searches every strategy; ``estimate`` prices a given one), so the note prices it by the same cost
    model against the plan, rather than leave it ignored without a word."""
    if req.strategy is None:
        return estimate
    head = "the request's strategy is not what planning starts from (it searches every strategy; `estimate` prices " \
           "a given one)"
    try:
        given = cm.evaluate(plan_of_request(req))
    except SpecError as err:
        note = f"{head}; it could not be priced: {err}"
    else:
        gain = given.step_time_s / estimate["step_time_s"] - 1
        fits = "" if given.fits else ", more than the memory limit"
        note = (f"{head}: priced by the same cost model it takes a step of {seconds(given.step_time_s)} and "
                f"{given.peak_memory_gib:.1f} GiB per GPU{fits}; this plan {100 * gain:+.1f}%")
    return {**estimate, "notes": [*estimate.get("notes", []), note]}


def _solve_for(req: HybridRequest, request: dict[str, Any], cm: CostModel, space: SearchSpace,
               kinds: list[Hashable], base: Baselines, clocks: tuple[float, float, float, float],
               progress: Progress | None) -> HybridResult:
    """The result for a framework ``constraints.target``: the fastest uniform plan the framework runs exactly as
    planned (``targets.solve_target``), the best of its own space (its bound is itself), and the baselines."""
    t0, c0, t_base, c_base = clocks
    target = req.constraints.target
    c1 = time.process_time()
    if progress:
        progress(0.5, f"uniform plans {target} runs")
    found = targets.solve_target(target, cm, space, kinds, expert_layers(req.model), request)
    if found is None:
        raise InfeasibleError([FieldProblem(("constraints", "target"), targets.why_none(target, space, cm))])
    est = cm.evaluate(found.plan)
    thr, step = est.throughput_samples_per_s, est.step_time_s
    out_base = {name: baselines.report(b, cm.evaluate(b.plan) if b else None, thr, why, 0.0, req.constraints)
                for name, (b, why) in base.items()}
    if progress:
        progress(1.0, "done")
    return HybridResult.model_validate({
        "estimate": _noting_given_strategy(req, cm, est.to_json()),
        "strategy": found.plan.to_dict(),
        "search": {
            "time_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0,
            "planner_cpu_s": time.process_time() - c1,
            "solver": f"uniform-grid:{target}",
            "target": target,
            "plan_from": f"uniform-grid:{target}",
            "target_plans_checked": found.grid_plans,
            "target_grid_best_step_time_s": found.grid_best_s,
            "time_limited": False,
            # the whole grid is priced: no plan the target runs in this space is faster (no claim beyond it)
            "lower_bound_step_time_s": step,
            "optimality_gap": 0.0,
            "baselines_time_s": t_base,
            "baselines_cpu_s": c_base,
            "cost_model": req.cost_model.kind,
            "planner_step_time_s": found.step_time_s,
        },
        "baselines": out_base,
    })


def estimate(request: dict[str, Any]) -> HybridEstimateResult:
    """What-if estimate of a given strategy: the cost model's business."""
    return HybridEstimateResult.model_validate(_estimate(request))
