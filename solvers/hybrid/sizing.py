"""Cluster sizing (``sizing``): the front of time-to-train against cost over cluster sizes and GPU types.

Every priced GPU type is tried on ``sizing.nodes``, by default the node counts 1, 2, 3, 4, 6, 8, 12, 16, ... (two
per doubling) up to ``max_nodes``, each with its own plan: the hybrid planner's search seeded by the size's best
uniform plan, without the optimality certificate (which costs as much again). A cheaper first pass of uniform plans
only was tried and dropped: on llama3-70b the planner gained up to 16 % over the best uniform plan of a size, so no
margin around the uniform front is safe. Days are the tokens over the plan's estimated throughput; the cost is GPU-
hours at the type's price. The front keeps the clusters no other tried cluster beats on both time and cost, fastest
first. A size whose global batch does not split over its GPUs, or on which nothing fits, is listed with the reason."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from solvers.documents.hybrid import FrontPoint, HybridEstimate, SizingDoc
from solvers.errors import SpecError
from solvers.request import HybridRequest
from solvers.specs import SizingSpec
from solvers.strategy import PlanStrategy

# (request) -> (plan, estimate): the planner's plan for one cluster size
Planning = Callable[[dict[str, Any]], tuple[PlanStrategy, HybridEstimate]]
SECONDS_PER_DAY = 86_400.0


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


def front(req: HybridRequest, request: dict[str, Any], planned: Planning) -> tuple[list[FrontPoint], SizingDoc]:
    """The result's ``front`` and ``sizing`` for a request with ``sizing`` (module docstring)."""
    t0, c0 = time.perf_counter(), time.process_time()
    sizing: SizingSpec | None = req.sizing
    assert sizing is not None
    base = {k: v for k, v in request.items() if k != "sizing"}
    per_node = req.cluster.gpus_per_node
    tokens_per_step = req.training.global_batch_size * req.training.seq_length

    def point(cluster: dict[str, Any], strategy: PlanStrategy, est: HybridEstimate) -> FrontPoint:
        gpus = cluster["nodes"] * per_node
        days = sizing.tokens / tokens_per_step * est.step_time_s / SECONDS_PER_DAY
        return FrontPoint.model_validate({
            "cluster": cluster, "gpus": gpus, "days": days,
            "cost": days * 24.0 * gpus * sizing.price_per_gpu_hour[cluster["gpu"]],
            "meets_deadline": None if sizing.deadline_days is None else days <= sizing.deadline_days,
            "step_time_s": est.step_time_s, "mfu": est.mfu, "strategy": strategy.to_dict()})

    points: list[FrontPoint] = []
    missing: list[str] = []
    clusters = [{"gpu": gpu, "nodes": n, "gpus_per_node": per_node}
                for gpu in sizing.price_per_gpu_hour for n in (sizing.nodes or node_counts(sizing.max_nodes))]
    for cluster in clusters:
        try:
            points.append(point(cluster, *planned({**base, "cluster": cluster})))
        except SpecError as err:
            missing.append(f"{cluster['nodes']} x {per_node} {cluster['gpu']}: {err.problems[0].msg}")
    best = pareto(points)
    in_time = [i for i, p in enumerate(best) if p.meets_deadline]
    cheapest = min(in_time, key=lambda i: best[i].cost) if in_time else None
    doc = SizingDoc(cheapest_in_deadline=cheapest, clusters_tried=len(clusters),
                    clusters_without_plan=missing,
                    time_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)
    return best, doc
