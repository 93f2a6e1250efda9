"""Test helpers: small explicit workloads and a brute-force optimum to check the planners against."""

from __future__ import annotations

import itertools
import random
from typing import Any

from solvers.spindle.api import build_problem, parse_request
from solvers.spindle.schedule import Placement, Problem, timeline


def explicit_request(ops: list[dict[str, Any]], edges: list[list[str]], gpus: int, per_node: int = 8,
                     **options: Any) -> dict[str, Any]:
    return {"kind": "spindle", "cluster": {"nodes": max(1, gpus // per_node), "gpus_per_node": min(per_node, gpus)},
            "workload": {"metaops": ops, "edges": edges}, "options": {"exact": False, **options}}


def random_workload(rng: random.Random, n_ops: int, max_layers: int = 12) -> tuple[list[dict[str, Any]],
                                                                                  list[list[str]]]:
    ops = []
    for i in range(n_ops):
        ops.append({"name": f"m{i}", "task": f"t{rng.randrange(3)}", "batch_size": rng.choice([1, 2, 3, 8, 16, 64]),
                    "num_layers": rng.randint(1, max_layers),
                    "time_ms_per_layer": {"slope_ms_per_sample": rng.choice([0.0, 0.05, 0.3, 1.0]),
                                          "intercept_ms": rng.choice([0.1, 0.5, 2.0])}})
    edges = [[f"m{i}", f"m{j}"] for i in range(n_ops) for j in range(i + 1, n_ops) if rng.random() < 0.3]
    return ops, edges


def problem_of(request: dict[str, Any]) -> Problem:
    return build_problem(parse_request(request))


def brute_force_makespan(problem: Problem) -> float:
    """Optimum over one slice per metaop: every width and block position, every precedence-respecting order.

    Any schedule with fixed blocks can be left-shifted into list order by start time without getting longer,
    so trying all orders with each slice started as early as possible finds the optimum."""
    wl = problem.workload
    n_dev = problem.num_devices
    options = [[(lo, n) for n in range(1, min(n_dev, op.max_devices) + 1) for lo in range(n_dev - n + 1)]
               for op in wl.ops]
    orders = [p for p in itertools.permutations(range(len(wl.ops)))
              if all(p.index(u) < p.index(v) for v in range(len(wl.ops)) for u in wl.preds[v])]
    best = float("inf")
    for choice in itertools.product(*options):
        for order in orders:
            placements = [Placement(i, wl.ops[i].layers, *choice[i]) for i in order]
            best = min(best, max(s.end_s for s in timeline(problem, placements)))
    return best
