"""Per-metaop device ranges (memory floor, batch ceiling) and the schedule lower bound."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from solvers.errors import InfeasibleError
from solvers.spindle.cost import slice_memory_bytes
from solvers.spindle.schedule import RESERVE_BYTES, Problem
from solvers.spindle.workload import MetaOp


def one_layer_bytes(op: MetaOp, n: int) -> float:
    """Bytes per device of one layer of ``op`` alone on ``n`` devices: the least it can ever need."""
    return sum(slice_memory_bytes(op, 1, n)) + RESERVE_BYTES


@dataclass(frozen=True)
class DeviceRange:
    lo: int  # fewest devices on which one layer fits in memory
    hi: int  # most devices worth using (one sample each, or the cluster)


def device_ranges(problem: Problem) -> list[DeviceRange]:
    n_max = problem.num_devices
    out = []
    for i, op in enumerate(problem.workload.ops):
        hi = min(n_max, op.max_devices)
        lo = 1
        if not problem.workload.explicit:
            while lo <= n_max and one_layer_bytes(op, lo) > problem.memory_limit_bytes:
                lo += 1
            if lo > n_max:
                need = one_layer_bytes(op, n_max) / 2**30
                raise InfeasibleError.at(
                    ("workload", "metaops", i),
                    f"one layer of {op.name} needs {need:.1f} GiB per device even on all {n_max} devices; "
                    f"the limit is {problem.memory_limit_bytes / 2**30:.1f} GiB")
        out.append(DeviceRange(lo, max(lo, hi)))
    return out


def op_time_s(op: MetaOp, n: int) -> float:
    return op.layers * op.layer_ms(n) / 1e3


def _hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Lower convex hull of (duration, work) points, by increasing duration, cut where work stops falling."""
    hull: list[tuple[float, float]] = []
    for d, w in sorted(points):
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (w - hull[-2][1])
                                  <= (hull[-1][1] - hull[-2][1]) * (d - hull[-2][0])):
            hull.pop()
        hull.append((d, w))
    least = min(range(len(hull)), key=lambda k: hull[k][1])
    return hull[:least + 1]


def _work_within(hull: list[tuple[float, float]], t: float) -> float:
    """The least device-time that completes the metaop within ``t``: its layers split between two widths (the
    hull's segment at ``t``), or its least-work width when that is fast enough."""
    if t >= hull[-1][0]:
        return hull[-1][1]
    k = bisect.bisect_right([d for d, _ in hull], t)
    (d0, w0), (d1, w1) = hull[k - 1], hull[k]
    return w0 + (w1 - w0) * (t - d0) / (d1 - d0)


def lower_bound_s(problem: Problem, ranges: list[DeviceRange] | None = None) -> float:
    """No schedule of the time model is shorter than the least T with T >= the critical path (each metaop at its
    fastest width) and sum over metaops of the least work that finishes each within T <= N * T.

    Every metaop of a schedule of makespan T runs within T, on widths (several, when split into stages) whose
    mix costs at least the lower convex envelope of its (duration, device-time) points at T; the N devices
    offer N * T. Tighter than max(least work / N, critical path) where the most efficient widths are too slow
    to fit in the makespan (narrow widths of many metaops on a big cluster)."""
    wl = problem.workload
    ranges = ranges or device_ranges(problem)
    hulls = [_hull([(op_time_s(op, n), n * op_time_s(op, n)) for n in range(r.lo, r.hi + 1)])
             for op, r in zip(wl.ops, ranges, strict=True)]
    fastest = [h[0][0] for h in hulls]
    finish = [0.0] * len(wl.ops)
    for v in wl.topo:
        finish[v] = fastest[v] + max((finish[u] for u in wl.preds[v]), default=0.0)
    n_dev = problem.num_devices

    def fits(t: float) -> bool:
        return sum(_work_within(h, t) for h in hulls) <= n_dev * t

    lo = max(finish)
    if fits(lo):
        return lo
    hi = max(lo, sum(h[-1][1] for h in hulls) / n_dev, max(h[-1][0] for h in hulls))
    for _ in range(100):
        if hi - lo <= 1e-12 * hi:
            break
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    # (lo: the largest T found not to fit: every schedule is longer; the last bits of the bisection go to it)
    return lo


def bottom_levels_s(problem: Problem, ranges: list[DeviceRange]) -> list[float]:
    """Longest path from each metaop to the end, each metaop at its fastest."""
    wl = problem.workload
    out = [0.0] * len(wl.ops)
    for v in reversed(wl.topo):
        op, r = wl.ops[v], ranges[v]
        out[v] = op_time_s(op, r.hi) + max((out[w] for w in wl.succs[v]), default=0.0)
    return out
