"""Per-metaop device ranges (memory floor, batch ceiling) and the schedule lower bound."""

from __future__ import annotations

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


def lower_bound_s(problem: Problem, ranges: list[DeviceRange] | None = None) -> float:
    """max(total work / N, critical path): work at each metaop's most efficient width, path at its fastest."""
    wl = problem.workload
    ranges = ranges or device_ranges(problem)
    work = sum(min(n * op_time_s(op, n) for n in range(r.lo, r.hi + 1)) for op, r in zip(wl.ops, ranges, strict=True))
    fastest = [min(op_time_s(op, n) for n in range(r.lo, r.hi + 1)) for op, r in zip(wl.ops, ranges, strict=True)]
    finish = [0.0] * len(wl.ops)
    for v in wl.topo:
        finish[v] = fastest[v] + max((finish[u] for u in wl.preds[v]), default=0.0)
    return max(work / problem.num_devices, max(finish))


def bottom_levels_s(problem: Problem, ranges: list[DeviceRange]) -> list[float]:
    """Longest path from each metaop to the end, each metaop at its fastest."""
    wl = problem.workload
    out = [0.0] * len(wl.ops)
    for v in reversed(wl.topo):
        op, r = wl.ops[v], ranges[v]
        out[v] = op_time_s(op, r.hi) + max((out[w] for w in wl.succs[v]), default=0.0)
    return out
