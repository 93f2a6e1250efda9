"""``kind = "spindle"`` entry points: ``solve`` (plan) and ``estimate`` (cost a given schedule)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeGuard

from solvers.documents.spindle import SliceDoc, SpindleEstimateResult, SpindleResult
from solvers.errors import InfeasibleError, SpecError, shown
from solvers.request import parse
from solvers.specs import ClusterSpec, Precision, memory_limit_bytes, memory_limit_note
from solvers.spindle import baselines, exact, planner
from solvers.spindle.bounds import DeviceRange, device_ranges, lower_bound_s
from solvers.spindle.cost import (
    DeviceModel,
    Topology,
    device_model,
    explicit_metaop,
    given_time_metaop,
    module_metaop,
    slice_memory_bytes,
)
from solvers.spindle.layouts import LayoutQuery, layout_table
from solvers.spindle.planner import Planned, better
from solvers.spindle.polish import polish
from solvers.spindle.schedule import (
    RESERVE_BYTES,
    Evaluation,
    Placement,
    Problem,
    Slice,
    evaluate,
    timeline,
    violations,
)
from solvers.spindle.summary import summarise as summarise  # (SolverKind.summarise)
from solvers.spindle.workload import MetaOp, MetaOpSpec, SpindleOptions, SpindleRequest, build_graph
from solvers.unknown_keys import unknown_key_problems

Progress = Callable[[float, str], None]
_GIB = 2**30


def parse_request(request: dict[str, Any]) -> SpindleRequest:
    if not isinstance(request, dict):
        raise SpecError.at((), "request must be a JSON object")
    data = dict(request)
    cluster = data.get("cluster")
    if isinstance(cluster, dict) and "gpu" not in cluster:
        # explicit-time workloads need no GPU; module shapes are costed on the usual A100 unless told
        data["cluster"] = {**cluster, "gpu": "A100-80GB"}
    req: SpindleRequest = parse(SpindleRequest, data)
    return req


MAX_SERIAL_MS = 1e10


def with_layouts(op: MetaOp, spec: MetaOpSpec, cluster: ClusterSpec, precision: Precision, limit: float) -> MetaOp:
    """A training metaop of a module shape, with the hybrid layout it runs at each width where one beats plain
    data parallelism or places what data parallelism cannot (``solvers.spindle.layouts``)."""
    if spec.module is None or op.mode != "train":
        return op
    widths = cluster.num_gpus
    dp_fits = tuple(sum(slice_memory_bytes(op, op.layers, n)) + RESERVE_BYTES <= limit for n in range(1, widths + 1))
    query = LayoutQuery(spec.module, spec.layer_offset, op.layers, op.batch, spec.recompute, cluster, precision,
                        limit, widths)
    table = layout_table(query, dp_fits)
    return replace(op, layouts=table) if any(lay is not None for lay in table) else op


def metaop(spec: MetaOpSpec, dev: DeviceModel) -> MetaOp:
    """The plain metaop: priced by its given time where it gives one, else derived from its module shape."""
    task = spec.task or spec.name
    if spec.module is None:
        return explicit_metaop(spec, task)
    if spec.time_ms_per_layer is not None:
        return given_time_metaop(spec, task, dev)
    return module_metaop(spec, task, dev)


def build_problem(req: SpindleRequest) -> Problem:
    dev = device_model(req.cluster, req.training.precision, req.options.efficiency, req.options.kernel_overhead_ms)
    specs = req.workload.metaops
    ops = [metaop(s, dev) for s in specs]
    explicit = all(s.module is None for s in specs)
    limit = memory_limit_bytes(req.cluster, req.constraints)
    if req.options.hybrid_layouts:
        precision = req.training.precision
        ops = [with_layouts(op, s, req.cluster, precision, limit) for op, s in zip(ops, specs, strict=True)]
    workload = build_graph(ops, req.workload.edges, explicit)
    # each metaop's range is physical, but together they could still run for centuries: then the exact solver's
    # integer microseconds overflowed CP-SAT's domains and start times too large for a short slice's duration
    # ordered a successor before its predecessor (found by a fuzz)
    serial_ms = sum(op.layers * op.layer_ms(1) for op in workload.ops)
    if not serial_ms <= MAX_SERIAL_MS:
        raise SpecError.at(("workload", "metaops"), f"the metaops take {serial_ms:.3g} ms one after another on one "
                                                    f"device, more than {MAX_SERIAL_MS:.0e} ms (about 116 days)")
    return Problem(workload, Topology.of(req.cluster, req.options.link_latency_us * 1e-6), limit,
                   req.options.grad_sync_overlap)


def _slice_dict(problem: Problem, s: Slice) -> dict[str, Any]:
    op = problem.workload.ops[s.op]
    return {"metaop": op.name, "task": op.task, "module": op.module, "devices": list(s.devices),
            "layers": s.layers, "layer_start": s.layer_start, "start_s": s.start_s, "end_s": s.end_s,
            "wave": s.wave, "compute_s": s.end_s - s.start_s, "transfer_wait_s": s.transfer_wait_s,
            "ms_per_layer": op.layer_ms(s.n), "layout": _layout_dict(op, s.n)}


def _layout_dict(op: MetaOp, n: int) -> dict[str, Any] | None:
    lay = op.layout(n)
    if lay is None:
        return None
    st = lay.strategy
    return {"tp": st.tp, "cp": st.cp, "dp": st.dp, "ep": st.ep, "zero": st.zero, "recompute": st.recompute}


def _waves(problem: Problem, slices: list[Slice]) -> list[dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for s in slices:
        w = out.setdefault(s.wave, {"index": s.wave, "start_s": s.start_s, "end_s": s.end_s, "metaops": []})
        w["start_s"], w["end_s"] = min(w["start_s"], s.start_s), max(w["end_s"], s.end_s)
        name = problem.workload.ops[s.op].name
        if name not in w["metaops"]:
            w["metaops"].append(name)
    return [out[k] for k in sorted(out)]


def estimate_dict(problem: Problem, ev: Evaluation) -> dict[str, Any]:
    # explicit times carry no shapes to size memory from: absent, not a zero that reads as a measurement
    estimated = not problem.workload.explicit
    return {"iteration_time_s": ev.iteration_time_s, "makespan_s": ev.makespan_s,
            "grad_sync_exposed_s": ev.grad_sync_exposed_s,
            "peak_memory_gib": ev.peak_memory_bytes / _GIB if estimated else None,
            "memory_gib_per_device": [m / _GIB for m in ev.memory_bytes] if estimated else [],
            "memory_estimated": estimated, "fits": ev.fits,
            "memory_limit_gib": problem.memory_limit_bytes / _GIB, "utilization": ev.utilization,
            "given_layer_times": [op.name for op in problem.workload.ops if op.given_time],
            "module_grad_sync_s": ev.module_sync_s,
            "weight_reshard": {r.module: {"time_s": r.time_s, "max_gib_per_device": r.max_bytes_per_device / _GIB,
                                          "generation_devices": r.generation_devices, "colocation": r.colocation}
                               for r in ev.reshards}}


def _exact(problem: Problem, ranges: list[DeviceRange], warm: Planned, opt: SpindleOptions,
           seed: int) -> tuple[Planned, dict[str, Any]]:
    """The CP-SAT model warm-started from ``warm``, its solution polished; the better of the two and the report.

    CP-SAT gets 90 % of the request's limit as a wall-clock safety net and a deterministic budget standing for
    the whole limit (``exact.deterministic_budget``); the polish after it a work budget of at most the other
    10 %, so with one worker the outcome depends on the request alone."""
    dtime = (exact.deterministic_budget(opt.exact_time_limit_s) if opt.exact_deterministic_time is None
             else opt.exact_deterministic_time)
    res = exact.solve(problem, ranges, hint=warm.placements, time_limit_s=0.9 * opt.exact_time_limit_s,
                      deterministic_time=dtime, workers=opt.exact_workers, seed=seed)
    out: dict[str, Any] = {
        "warm_start": warm.name, "warm_start_iteration_time_s": warm.evaluation.iteration_time_s,
        "status": res.status, "stopped_by": res.stopped_by, "wall_s": res.wall_s, "workers": opt.exact_workers,
        "seed": seed, "deterministic_time_limit": dtime, "deterministic_time": res.deterministic_time,
        "model_makespan_s": res.makespan_s, "model_bound_s": res.bound_s, "model_gap": res.gap,
        "polish_wall_capped": False}
    if res.placements is None:
        return warm, out
    slices = timeline(problem, res.placements)
    polished = polish(problem, ranges, Planned("cp-sat", res.placements, slices, evaluate(problem, slices)),
                      min(opt.polish_time_s, 0.1 * opt.exact_time_limit_s))
    cand = polished.plan
    out["polish_wall_capped"] = polished.wall_capped
    out["model_solution_iteration_time_s"] = cand.evaluation.iteration_time_s
    if not better(warm, cand):  # the model ignores gradient sync: keep the warm start if it is better
        cand = warm
    out["iteration_time_s"] = cand.evaluation.iteration_time_s
    return cand, out


def validate(request: dict[str, Any]) -> None:
    parse_request(request)


def solve(request: dict[str, Any], progress: Progress | None = None) -> SpindleResult:
    t0 = time.perf_counter()
    report = progress or (lambda f, m: None)
    req = parse_request(request)
    problem = build_problem(req)
    ranges = device_ranges(problem)
    lb = lower_bound_s(problem, ranges)
    report(0.05, "wavefront planner")
    opt = req.options
    portfolio = planner.plan(problem, ranges, seed=req.constraints.seed)
    scores = portfolio.scores
    # local search from the best plan and from the runners-up (other basins), the budget shared
    starts = [portfolio.best, *portfolio.runners_up]
    heur = portfolio.best
    wall_capped = False  # a wall-clock safety net ended a search: the plan may differ from run to run
    for start in starts:
        polished = polish(problem, ranges, start, opt.polish_time_s / len(starts))
        wall_capped |= polished.wall_capped
        if better(heur, polished.plan):
            heur = polished.plan
    t_heur = time.perf_counter() - t0
    best = heur
    search: dict[str, Any] = {"wavefront_s": t_heur, "wavefront_iteration_time_s": heur.evaluation.iteration_time_s,
                              "wavefront_ordering": heur.name,
                              # the reference algorithm alone: fluid shares, locality line-up, no polish
                              "reference_iteration_time_s": scores.get("wavefront/fluid/locality"),
                              "candidates_iteration_time_s": scores}
    if req.options.exact:
        report(0.2, "exact model (CP-SAT)")
        # with transfers and gradient sync in the cost, a metaop moving between blocks mid-way costs what
        # the model can only bound; its search does best from a plan that keeps each metaop on one block
        warm = heur if problem.workload.explicit or portfolio.best_single is None else portfolio.best_single
        found, exact_report = _exact(problem, ranges, warm, opt, req.constraints.seed)
        search["exact"] = exact_report
        wall_capped |= exact_report["stopped_by"] == "wall_clock" or exact_report["polish_wall_capped"]
        if better(best, found):
            best = found
    search["reproducible"] = not wall_capped and (not opt.exact or opt.exact_workers == 1)
    report(0.9, "baselines")
    base = baselines.all_baselines(problem, ranges)
    for cand_b in base.values():
        if cand_b is not None and better(best, cand_b):
            best = cand_b  # a plan no better than a baseline is not worth returning
    if not best.evaluation.fits:
        raise InfeasibleError.at(("constraints", "memory_limit_gib"),
                                 f"no plan found fits: the best needs {best.evaluation.peak_memory_bytes / _GIB:.1f} "
                                 f"GiB on a device, limit {problem.memory_limit_bytes / _GIB:.1f} GiB")
    search["time_s"] = time.perf_counter() - t0
    search["solver"] = best.name
    est = estimate_dict(problem, best.evaluation)
    seq = base["sequential_full_cluster_s"]
    if seq is not None:
        est["speedup_vs_sequential"] = seq.evaluation.iteration_time_s / best.evaluation.iteration_time_s
    report(1.0, "done")
    return SpindleResult.model_validate({
        "estimate": est,
        "slices": [_slice_dict(problem, s) for s in best.slices],
        "waves": _waves(problem, best.slices),
        "lower_bound_s": lb,
        "ratio_to_lower_bound": best.evaluation.iteration_time_s / lb if lb > 0 else None,
        "baselines": {k: (v.evaluation.iteration_time_s if v is not None and v.evaluation.fits else None)
                      for k, v in base.items()},
        # the baselines' own schedules, on the same timeline and cost model (null: a metaop does not fit)
        "baseline_plans": {k.removesuffix("_s"): None if v is None else
                           {"iteration_time_s": v.evaluation.iteration_time_s, "fits": v.evaluation.fits,
                            "slices": [_slice_dict(problem, s) for s in v.slices]} for k, v in base.items()},
        "search": search,
        "notes": [note for note in (memory_limit_note(req.cluster, req.constraints),) if note],
    })


def _whole(x: object) -> TypeGuard[int]:
    """An integer of JSON's (true and false are not counts)."""
    return isinstance(x, int) and not isinstance(x, bool)


def placements_from_slices(problem: Problem, given: list[dict[str, Any]]) -> list[Placement]:
    """Turn contract slices into placements, run in order of their start_s (list order when absent)."""
    index = problem.workload.index
    keyed = []
    for k, s in enumerate(given):
        loc: tuple[str | int, ...] = ("slices", k)
        if not isinstance(s, dict):
            raise SpecError.at(loc, "a slice must be an object")
        if unknown := unknown_key_problems(s, SliceDoc.model_fields, loc):  # (a result's slices are taken back)
            raise SpecError(unknown)
        name = s.get("metaop")
        if not isinstance(name, str) or name not in index:  # (["a"] raised TypeError: unhashable)
            raise SpecError.at((*loc, "metaop"), f"unknown metaop {shown(name)}")
        devices = s.get("devices")
        if (not isinstance(devices, list) or not devices or not all(_whole(d) for d in devices)
                or sorted(devices) != list(range(min(devices), min(devices) + len(devices)))):
            raise SpecError.at((*loc, "devices"), "devices must be a non-empty contiguous list of device ids")
        if min(devices) < 0 or max(devices) >= problem.num_devices:
            raise SpecError.at((*loc, "devices"), f"devices outside the cluster's {problem.num_devices}")
        layers = s.get("layers")
        if not _whole(layers) or layers < 1:
            raise SpecError.at((*loc, "layers"), "layers must be a positive integer")
        start = s.get("start_s", k)
        if not isinstance(start, int | float) or isinstance(start, bool) or not math.isfinite(start):
            raise SpecError.at((*loc, "start_s"), f"start_s must be a finite number, got {shown(start)}")
        wave = s.get("wave", 0)
        if not _whole(wave) or wave < 0:  # ("a" or null raised out of int())
            raise SpecError.at((*loc, "wave"), f"wave must be a non-negative integer, got {shown(wave)}")
        keyed.append((float(start), k, Placement(index[name], layers, min(devices), len(devices), wave)))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return [p for *_, p in keyed]


def estimate(request: dict[str, Any]) -> SpindleEstimateResult:
    """Cost a given schedule (``slices`` in the request): slices start as early as order and edges allow."""
    req = parse_request(request)
    problem = build_problem(req)
    if not req.slices:
        raise SpecError.at(("slices",), "an estimate needs the schedule's slices")
    placements = placements_from_slices(problem, req.slices)
    try:
        slices = timeline(problem, placements)
    except ValueError as err:
        raise SpecError.at(("slices",), str(err)) from None
    bad = violations(problem, slices)
    if bad:
        raise SpecError.at(("slices",), "; ".join(bad[:5]))
    out = estimate_dict(problem, evaluate(problem, slices))
    out["lower_bound_s"] = lower_bound_s(problem)
    return SpindleEstimateResult.model_validate(out)
