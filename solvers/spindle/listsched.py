"""Moldable list scheduling (earliest finish time) on contiguous device blocks.

Where a wave holds one dominant metaop with coarse efficient widths (Seedance's video stack: 32 samples on
16 or 11 devices), running every ready metaop at once is wrong and the wavefront loses to plain sequential
execution. This planner takes metaops by bottom level and gives each the (width, block) that finishes it
earliest, among widths whose device-time stays within ``1 / efficiency`` of the metaop's cheapest; ties go
to fewer devices, blocks inside one node, and blocks next to the predecessors. It is one more candidate for
the planner to pick from, on the same timeline and cost model.
"""

from __future__ import annotations

import heapq

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from solvers.spindle.bounds import DeviceRange, bottom_levels_s, op_time_s
from solvers.spindle.schedule import Placement, Problem
from solvers.spindle.workload import MetaOp

EFFICIENCIES = (0.0, 0.75, 0.9)


def efficient_widths(op: MetaOp, r: DeviceRange) -> list[int]:
    """Widths at which the per-device batch drops (the fewest devices for each local batch size); with hybrid
    layouts, the widths at which the layer time drops."""
    out: list[int] = []
    prev: float | None = None
    for n in range(r.lo, r.hi + 1):
        key = op.layer_ms(n) if op.layouts else float(-(-op.batch // n))
        if prev is None or (key < prev if op.layouts else key != prev):
            out.append(n)
            prev = key
    return out


def plan_list(problem: Problem, ranges: list[DeviceRange], efficiency: float) -> list[Placement]:
    wl = problem.workload
    n_dev, per_node = problem.num_devices, problem.topo.gpus_per_node
    blevel = bottom_levels_s(problem, ranges)
    free = np.zeros(n_dev)
    end = [0.0] * len(wl.ops)
    block: dict[int, tuple[int, int]] = {}
    depth = [0] * len(wl.ops)  # waves of a list schedule: the metaop's depth in the DAG
    indeg = [len(p) for p in wl.preds]
    heap = [(-blevel[i], i) for i in range(len(wl.ops)) if indeg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        op, r = wl.ops[i], ranges[i]
        ready = max((end[u] for u in wl.preds[i]), default=0.0)
        centre = np.mean([block[u][0] + block[u][1] / 2 for u in wl.preds[i]]) if wl.preds[i] else None
        widths = efficient_widths(op, r)
        cheapest = min(n * op_time_s(op, n) for n in widths)
        best: tuple[float, int, bool, float] | None = None
        choice = (0, r.lo)
        for n in widths:
            if efficiency and cheapest / (n * op_time_s(op, n)) < efficiency:
                continue
            starts = np.maximum(sliding_window_view(free, n).max(axis=1), ready)
            finish = starts + op_time_s(op, n)
            lows = np.arange(n_dev - n + 1)
            crosses = (lows // per_node) != ((lows + n - 1) // per_node)
            near = np.abs(lows + n / 2 - centre) if centre is not None else np.zeros(len(lows))
            # earliest finish (to 0.1%), then inside a node, then next to the predecessors
            lo = int(np.lexsort((near, crosses, np.round(finish / finish.min(), 3)))[0])
            key = (float(finish[lo]), n, bool(crosses[lo]), float(near[lo]))
            if best is None or key[0] < best[0] * (1 - 1e-3) or (key[0] <= best[0] * (1 + 1e-3) and key[1:] < best[1:]):
                best, choice = key, (lo, n)
        lo, n = choice
        t_end = max(float(free[lo:lo + n].max()), ready) + op_time_s(op, n)
        free[lo:lo + n] = t_end
        end[i] = t_end
        block[i] = (lo, n)
        depth[i] = 1 + max((depth[u] for u in wl.preds[i]), default=-1)
        out.append((t_end - op_time_s(op, n), lo, Placement(i, op.layers, lo, n, depth[i])))
        for v in wl.succs[i]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, (-blevel[v], v))
    out.sort(key=lambda x: (x[0], x[1]))
    return [p for *_, p in out]
