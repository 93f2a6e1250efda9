"""Cluster sizing (``sizing``): the front of time-to-train against cost over cluster sizes and GPU types.

Every priced GPU type is tried on ``sizing.nodes``, by default the node counts 1, 2, 3, 4, 6, 8, 12, 16, ... (two
per doubling) up to ``max_nodes``, each with its own plan: the hybrid planner's search seeded by the size's best
uniform plan, without the optimality certificate (which costs as much again). A cheaper first pass of uniform plans
only was tried and dropped: on llama3-70b the planner gained up to 16 % over the best uniform plan of a size, so no
margin around the uniform front is safe. Days are the tokens over the plan's estimated throughput; the cost is GPU-
hours at the type's price. The front keeps the clusters no other tried cluster beats on both time and cost, fastest
first. A size whose global batch does not split over its GPUs, or on which nothing fits, is listed with the reason.

Work is shared across sizes in two ways. GPU types are planned in order of their price per unit of best-case
throughput, and a size of a later type is not planned at all where a plan already found beats its *floor* on both
time and cost: the floor is the step its matrix multiplies alone take with every GPU busy at the GEMM efficiency
curve's best (``step_floor_s``; a true lower bound of the analytic model, so no front point is lost). And the
sizes are planned in parallel, one process per CPU this process may run on (forked, so nothing is imported
again), where that is safe: never from a process with other threads running (a fork copies their held locks, not
the threads). ``SizingDoc.workers`` says how many ran, and its ``cpu_s`` counts their CPU time too."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any

from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.factory import make_cost_model
from solvers.cost_model.flops import expert_gemm_flops_per_token, gemm_flops_per_token
from solvers.cost_model.shapes import layer_shape
from solvers.documents.hybrid import FrontPoint, HybridEstimate, SizingDoc
from solvers.errors import SpecError
from solvers.request import HybridRequest, parse
from solvers.specs import SizingSpec
from solvers.strategy import PlanStrategy

# (request) -> (plan, estimate): the planner's plan for one cluster size
Planning = Callable[[dict[str, Any]], tuple[PlanStrategy, HybridEstimate]]
SECONDS_PER_DAY = 86_400.0
MAX_WORKERS = 16
Planned = tuple[PlanStrategy, HybridEstimate] | str  # a size's plan and estimate, or why it has none


def node_counts(most: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ...: two sizes per doubling, up to ``most``."""
    out, n = [], 1
    while n <= most:
        out += [n] + ([n * 3 // 2] if n >= 2 and n * 3 // 2 <= most else [])
        n *= 2
    return out


def pareto(points: list[FrontPoint]) -> list[FrontPoint]:
    """The points no other beats on both days and cost (ties: the fewer GPUs), fastest first."""
    ranked = sorted(points, key=lambda p: (p.days, p.cost, p.gpus))
    out: list[FrontPoint] = []
    for p in ranked:
        if not out or p.cost < out[-1].cost:
            out.append(p)
    return out


def step_floor_s(request: dict[str, Any]) -> float:
    """A step time no plan for ``request``'s cluster beats under the analytic cost model: every layer's matrix
    multiplies, forward and backward (3x forward), spread evenly over all GPUs at the GEMM curve's best efficiency
    (each GPU computes its share at least, and a step lasts at least as long as any GPU computes). Experts' GEMMs
    are left out (dropped tokens can make them lighter than their average). 0 for the other cost models."""
    req: HybridRequest = parse(HybridRequest, request)
    cm = make_cost_model(req)
    if not isinstance(cm, AnalyticCostModel):
        return 0.0
    model = req.model
    shapes = [layer_shape(model, i) for i in range(model.num_layers)]
    per_token = sum(gemm_flops_per_token(x) - expert_gemm_flops_per_token(x) for x in shapes)
    tokens = req.training.global_batch_size * req.training.seq_length
    gpus = req.cluster.nodes * req.cluster.gpus_per_node
    return 3.0 * per_token * tokens / (gpus * cm.peak_flops * cm.cal.gemm.eta_max)


def _floor_or_zero(request: dict[str, Any]) -> float:
    try:
        return step_floor_s(request)
    except SpecError:  # the size's own planning says what is wrong with it
        return 0.0


def worker_count(jobs: int) -> int:
    """How many processes plan ``jobs`` sizes: one per usable CPU, but 1 where forking is unsafe or unavailable."""
    if jobs < 2 or threading.active_count() > 1 or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(jobs, len(os.sched_getaffinity(0)), MAX_WORKERS))


def _die_with_parent() -> None:
    """A planning process ends with the process that asked for it (a cancelled solve leaves no orphans)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _plan_or_reason(planned: Planning, request: dict[str, Any]) -> Planned:
    try:
        return planned(request)
    except SpecError as err:
        return err.problems[0].msg


def plan_all(planned: Planning, requests: list[dict[str, Any]], workers: int) -> Iterable[Planned]:
    """Each request's plan (or why it has none), in order; ``workers`` processes share them out."""
    one = partial(_plan_or_reason, planned)
    if workers <= 1:
        return map(one, requests)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=_die_with_parent) as pool:
        return list(pool.map(one, requests))


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def front(req: HybridRequest, request: dict[str, Any], planned: Planning,
          workers: int | None = None) -> tuple[list[FrontPoint], SizingDoc]:
    """The result's ``front`` and ``sizing`` for a request with ``sizing`` (module docstring). ``workers``:
    processes to plan the sizes in (default ``worker_count``)."""
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu_s()
    sizing: SizingSpec | None = req.sizing
    assert sizing is not None
    base = {k: v for k, v in request.items() if k != "sizing"}
    per_node = req.cluster.gpus_per_node
    tokens_per_step = req.training.global_batch_size * req.training.seq_length

    def days_cost(cluster: dict[str, Any], step_s: float) -> tuple[float, float]:
        days = sizing.tokens / tokens_per_step * step_s / SECONDS_PER_DAY
        return days, days * 24.0 * cluster["nodes"] * per_node * sizing.price_per_gpu_hour[cluster["gpu"]]

    def point(cluster: dict[str, Any], strategy: PlanStrategy, est: HybridEstimate) -> FrontPoint:
        days, cost = days_cost(cluster, est.step_time_s)
        return FrontPoint.model_validate({
            "cluster": cluster, "gpus": cluster["nodes"] * per_node, "days": days, "cost": cost,
            "meets_deadline": None if sizing.deadline_days is None else days <= sizing.deadline_days,
            "step_time_s": est.step_time_s, "mfu": est.mfu, "strategy": strategy.to_dict()})

    points: list[FrontPoint] = []
    missing: list[str] = []
    counts = sizing.nodes or node_counts(sizing.max_nodes)
    clusters = [{"gpu": gpu, "nodes": n, "gpus_per_node": per_node} for gpu in sizing.price_per_gpu_hour
                for n in counts]
    n_workers = worker_count(len(counts)) if workers is None else max(1, workers)
    floors = {(c["gpu"], c["nodes"]): _floor_or_zero({**base, "cluster": c}) for c in clusters}

    def beaten(cluster: dict[str, Any]) -> bool:
        """A plan found beats this cluster's floor on both time and cost (and strictly on one: ties stay)."""
        days, cost = days_cost(cluster, floors[(cluster["gpu"], cluster["nodes"])])
        return any(p.days <= days and p.cost <= cost and (p.days < days or p.cost < cost) for p in points)

    def value(gpu: str) -> float:  # price per unit of the best-case throughput, on the largest size
        most = max(counts)
        return days_cost({"gpu": gpu, "nodes": most}, floors[(gpu, most)])[1]

    pruned = 0
    for gpu in sorted(sizing.price_per_gpu_hour, key=value):
        todo = [c for c in clusters if c["gpu"] == gpu and not beaten(c)]
        pruned += len(counts) - len(todo)
        for cluster, got in zip(todo, plan_all(planned, [{**base, "cluster": c} for c in todo], n_workers),
                                strict=True):
            if isinstance(got, str):
                missing.append(f"{cluster['nodes']} x {per_node} {cluster['gpu']}: {got}")
            else:
                points.append(point(cluster, *got))
    best = pareto(points)
    in_time = [i for i, p in enumerate(best) if p.meets_deadline]
    cheapest = min(in_time, key=lambda i: best[i].cost) if in_time else None
    doc = SizingDoc(cheapest_in_deadline=cheapest, clusters_tried=len(clusters), clusters_pruned=pruned,
                    clusters_without_plan=missing, workers=n_workers, time_s=time.perf_counter() - t0,
                    cpu_s=time.process_time() - c0 + _children_cpu_s() - k0)
    return best, doc
