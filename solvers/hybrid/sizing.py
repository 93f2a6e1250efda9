"""Cluster sizing (``sizing``): the front of time-to-train against cost over cluster sizes and GPU types.

Every priced GPU type is tried on ``sizing.nodes``, by default the node counts 1, 2, 3, 4, 6, 8, 12, 16, ... (two
per doubling) up to ``max_nodes``, each with its own plan: the hybrid planner's search seeded by the size's best
uniform plan, without the optimality certificate (which costs as much again). A cheaper first pass of uniform plans
only was tried and dropped: on llama3-70b the planner gained up to 16 % over the best uniform plan of a size, so no
margin around the uniform front is safe. Days are the tokens over the plan's estimated throughput; the cost is GPU-
hours at the type's price. The front keeps the clusters no other tried cluster beats on both time and cost, fastest
first. A size whose global batch does not split over its GPUs, or on which nothing fits, is listed with the reason.

Work is shared across sizes: each size is planned against the points found before it. A plan on a cluster of
step time t takes t x (days per second of step) days at the cluster's cost per day, so the points found give each
cluster a *threshold*, the step time from which one of them beats its plan on both time and cost. A cluster whose
*floor* (the step its matrix multiplies alone take with every GPU busy at the GEMM efficiency curve's best,
``step_floor_s``: a true lower bound of the analytic model) reaches its threshold is not planned at all
(``clusters_pruned``); the others are planned with the threshold as the search's incumbent, so every pipeline
configuration whose bound reaches it is pruned, and a size none of whose configurations beats it is counted in
``clusters_beaten_in_search``. A configuration is pruned only where its bound is at least the incumbent, so a plan
that beats the threshold is the plan the search finds without it, and the front is the front of every size's own
plan. Thresholds are tight where strong points come first: GPU types are planned in order of their cost at the
largest size's floor, and each type's largest size first (a size's plan is beaten by a larger size of at least its
efficiency, or by a better-value type; never by a smaller size of its own type, which is slower too).

The sizes are planned in parallel, one process per CPU this process may run on (forked, so nothing is imported
again), each task taking its threshold from every plan finished when it starts (so the counts of pruned and beaten
clusters, not the front, can differ with the number of processes), where that is safe: never from a process with
other threads running (a fork copies their held locks, not the threads). ``SizingDoc.workers`` says how many ran,
and its ``cpu_s`` counts their CPU time too."""

from __future__ import annotations

import contextlib
import ctypes
import math
import multiprocessing
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
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

# (request, beat_s) -> (plan, estimate), or None where no plan beats the step time beat_s (quick_plan's contract)
Planning = Callable[[dict[str, Any], float], tuple[PlanStrategy, HybridEstimate] | None]
SECONDS_PER_DAY = 86_400.0
MAX_WORKERS = 16
# a size's plan and estimate, None (no plan beats its threshold), or why it has none
Planned = tuple[PlanStrategy, HybridEstimate] | str | None


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
    return 3.0 * per_token * tokens / (gpus * cm.gemm_flops * cm.cal.gemm.eta_max)


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


def _plan_or_reason(planned: Planning, request: dict[str, Any], beat_s: float) -> Planned:
    try:
        return planned(request, beat_s)
    except SpecError as err:
        return err.problems[0].msg


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


Task = tuple[dict[str, Any], float]  # a cluster, and the step time its plan must beat


def plan_in_order(planned: Planning, base: dict[str, Any], tasks: Iterable[Task | None], workers: int,
                  on_done: Callable[[dict[str, Any], Planned], None]) -> None:
    """Plans each task's cluster, ``workers`` at a time, calling ``on_done`` as each finishes. ``tasks`` is a lazy
    iterable read one task at a time, when a process is free (None: a task skipped), so that each task's threshold
    is taken from every plan finished before it starts."""
    if workers <= 1:
        for task in tasks:
            if task is not None:
                on_done(task[0], _plan_or_reason(planned, {**base, "cluster": task[0]}, task[1]))
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                             initializer=_die_with_parent) as pool:
        inflight: dict[Future[Planned], dict[str, Any]] = {}
        todo = iter(tasks)
        while True:
            for task in todo:
                if task is not None:
                    inflight[pool.submit(_plan_or_reason, planned, {**base, "cluster": task[0]}, task[1])] = task[0]
                if len(inflight) >= workers:
                    break
            if not inflight:
                return
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            for fut in done:
                on_done(inflight.pop(fut), fut.result())


def front(req: HybridRequest, request: dict[str, Any], planned: Planning, workers: int | None = None,
          progress: Callable[[float, str], None] | None = None) -> tuple[list[FrontPoint], SizingDoc]:
    """The result's ``front`` and ``sizing`` for a request with ``sizing`` (module docstring). ``workers``:
    processes to plan the sizes in (default ``worker_count``); ``progress``: told the fraction of the clusters
    settled (planned or pruned) as each is."""
    t0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu_s()
    sizing: SizingSpec | None = req.sizing
    assert sizing is not None
    base = {k: v for k, v in request.items() if k not in ("sizing", "cluster")}
    per_node = req.cluster.gpus_per_node
    tokens_per_step = req.training.global_batch_size * req.training.seq_length

    def days(step_s: float) -> float:  # to train the tokens
        return sizing.tokens / tokens_per_step * step_s / SECONDS_PER_DAY

    def cost(cluster: dict[str, Any], d: float) -> float:  # of ``d`` days on ``cluster``
        return d * 24.0 * cluster["nodes"] * per_node * sizing.price_per_gpu_hour[cluster["gpu"]]

    def point(cluster: dict[str, Any], strategy: PlanStrategy, est: HybridEstimate) -> FrontPoint:
        d = days(est.step_time_s)
        return FrontPoint.model_validate({
            "cluster": cluster, "gpus": cluster["nodes"] * per_node, "days": d, "cost": cost(cluster, d),
            "meets_deadline": None if sizing.deadline_days is None else d <= sizing.deadline_days,
            "step_time_s": est.step_time_s, "mfu": est.mfu, "strategy": strategy.to_dict()})

    points: list[FrontPoint] = []
    missing: list[str] = []
    counts = sizing.nodes or node_counts(sizing.max_nodes)
    clusters: list[dict[str, Any]] = [{"gpu": gpu, "nodes": n, "gpus_per_node": per_node}
                                      for gpu in sizing.price_per_gpu_hour for n in counts]
    n_workers = worker_count(len(clusters)) if workers is None else max(1, workers)
    floors = {(c["gpu"], c["nodes"]): _floor_or_zero({**base, "cluster": c}) for c in clusters}

    def threshold(cluster: dict[str, Any]) -> float:
        """The step time from which a plan on ``cluster`` is beaten on both time and cost by a point found: one
        point's days at most the plan's and its cost at most the plan's (a tie counts as beaten: the point found
        first stays)."""
        per_day = cost(cluster, 1.0)
        return min((max(p.days, p.cost / per_day) / days(1.0) for p in points), default=math.inf)

    def value(gpu: str) -> float:  # cost per day of training at the largest size's floor
        most = max(counts)
        return cost({"gpu": gpu, "nodes": most}, days(floors[(gpu, most)]))

    pruned, beaten = 0, 0

    def settled(what: str) -> None:
        if progress:
            done = len(points) + len(missing) + pruned + beaten
            progress(done / len(clusters), f"sizing: {done}/{len(clusters)} clusters settled ({what})")

    def tasks() -> Iterator[Task | None]:
        nonlocal pruned
        for cluster in order:
            beat_s = threshold(cluster)
            if floors[(cluster["gpu"], cluster["nodes"])] >= beat_s:
                pruned += 1
                settled(f"{cluster['nodes']} x {per_node} {cluster['gpu']} pruned by its floor")
                yield None
            else:
                yield cluster, beat_s

    def on_done(cluster: dict[str, Any], got: Planned) -> None:
        nonlocal beaten
        name = f"{cluster['nodes']} x {per_node} {cluster['gpu']}"
        if got is None:
            beaten += 1
            settled(f"{name} beaten in its search")
        elif isinstance(got, str):
            missing.append(f"{name}: {got}")
            settled(f"{name}: no plan")
        else:
            points.append(point(cluster, *got))
            settled(f"{name} planned: {points[-1].days:.1f} days")

    # best-value type first and each type's largest size first: a size is beaten by a larger one of at least its
    # efficiency or by a better-value type, never by a smaller size of its own type (that is slower too)
    order = sorted(clusters, key=lambda c: (value(c["gpu"]), -c["nodes"]))
    plan_in_order(planned, base, tasks(), n_workers, on_done)
    best = pareto(points)
    in_time = [i for i, p in enumerate(best) if p.meets_deadline]
    cheapest = min(in_time, key=lambda i: best[i].cost) if in_time else None
    doc = SizingDoc(cheapest_in_deadline=cheapest, clusters_tried=len(clusters), clusters_pruned=pruned,
                    clusters_beaten_in_search=beaten, clusters_without_plan=missing, workers=n_workers,
                    time_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0 + _children_cpu_s() - k0)
    return best, doc
