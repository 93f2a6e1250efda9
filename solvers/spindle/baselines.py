"""Baselines every Spindle plan is compared with, on the same cost model and timeline.

- sequential: tasks one after another, each metaop data-parallel over the whole cluster (Megatron/DeepSpeed
  style: one model replica spanning all GPUs, tasks interleaved in time);
- uniform: the cluster cut into equal contiguous blocks, one per task, each task's metaops in order on it;
- optimus: the same with block sizes chosen greedily by marginal gain (Optimus, EuroSys'18: give the next
  device to the task whose time drops most).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from solvers.spindle.bounds import DeviceRange, op_time_s
from solvers.spindle.planner import Planned
from solvers.spindle.schedule import Placement, Problem, evaluate, timeline


def _task_order(problem: Problem, rank: Callable[[int], int]) -> list[int]:
    """A topological order of metaops that runs lower-ranked tasks first where edges allow."""
    wl = problem.workload
    indeg = [len(p) for p in wl.preds]
    heap = [(rank(i), i) for i in range(len(wl.ops)) if indeg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, u = heapq.heappop(heap)
        out.append(u)
        for v in wl.succs[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (rank(v), v))
    return out


def _on_blocks(problem: Problem, ranges: list[DeviceRange], name: str,
               blocks: dict[str, tuple[int, int]]) -> Planned | None:
    """Each task's metaops, in order, on its block (lo, n); None when a metaop does not fit its block."""
    wl = problem.workload
    tasks = wl.tasks
    placements = []
    for i in _task_order(problem, lambda i: tasks.index(wl.ops[i].task)):
        lo, n = blocks[wl.ops[i].task]
        if ranges[i].lo > n:
            return None
        placements.append(Placement(i, wl.ops[i].layers, lo, min(n, ranges[i].hi)))
    slices = timeline(problem, placements)
    return Planned(name, placements, slices, evaluate(problem, slices))


def _blocks(sizes: list[int], tasks: list[str]) -> dict[str, tuple[int, int]]:
    """Contiguous blocks of the given sizes; with more tasks than blocks, tasks share blocks round-robin."""
    starts = [sum(sizes[:g]) for g in range(len(sizes))]
    return {t: (starts[k % len(sizes)], sizes[k % len(sizes)]) for k, t in enumerate(tasks)}


def sequential(problem: Problem, ranges: list[DeviceRange]) -> Planned | None:
    return _on_blocks(problem, ranges, "sequential", dict.fromkeys(problem.workload.tasks, (0, problem.num_devices)))


def _task_time_s(problem: Problem, ranges: list[DeviceRange], task: str, n: int) -> float:
    wl = problem.workload
    total = 0.0
    for op, r in zip(wl.ops, ranges, strict=True):
        if op.task == task:
            if r.lo > n:
                return float("inf")
            total += op_time_s(op, min(n, r.hi))
    return total


def _by_work(problem: Problem, ranges: list[DeviceRange]) -> list[str]:
    """Tasks biggest first, so that shared blocks (more tasks than devices) get balanced work."""
    return sorted(problem.workload.tasks, key=lambda t: -_task_time_s(problem, ranges, t, 1))


def uniform(problem: Problem, ranges: list[DeviceRange]) -> Planned | None:
    n_dev = problem.num_devices
    k = min(len(problem.workload.tasks), n_dev)
    sizes = [n_dev // k + (1 if g < n_dev % k else 0) for g in range(k)]
    return _on_blocks(problem, ranges, "uniform", _blocks(sizes, _by_work(problem, ranges)))


def optimus(problem: Problem, ranges: list[DeviceRange]) -> Planned | None:
    n_dev = problem.num_devices
    tasks = _by_work(problem, ranges)
    if len(tasks) > n_dev:
        return uniform(problem, ranges)
    size = dict.fromkeys(tasks, 1)
    memo: dict[tuple[str, int], float] = {}

    def time_of(t: str, n: int) -> float:
        if (t, n) not in memo:
            memo[(t, n)] = _task_time_s(problem, ranges, t, n)
        return memo[(t, n)]

    def gain(t: str) -> float:
        now = time_of(t, size[t])
        return float("inf") if now == float("inf") else now - time_of(t, size[t] + 1)

    for _ in range(n_dev - len(tasks)):
        size[max(tasks, key=gain)] += 1
    return _on_blocks(problem, ranges, "optimus", _blocks([size[t] for t in tasks], tasks))


def all_baselines(problem: Problem, ranges: list[DeviceRange]) -> dict[str, Planned | None]:
    return {"sequential_full_cluster_s": sequential(problem, ranges), "task_uniform_s": uniform(problem, ranges),
            "task_optimus_s": optimus(problem, ranges)}
