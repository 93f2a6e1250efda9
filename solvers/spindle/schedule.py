"""Schedules: planners decide placements (which layers of which metaop on which device block, in what order);
``timeline`` turns them into timed slices; ``evaluate`` costs a schedule and ``violations`` checks it.

Every planner goes through the same ``timeline`` and ``evaluate``, so their plans compare on one cost model.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from solvers.spindle.cost import (
    Topology,
    allreduce_by_node_s,
    slice_memory_bytes,
    state_bytes_per_layer,
    transfer_s,
)
from solvers.spindle.reshard import Reshard, reshards
from solvers.spindle.workload import BACKWARD_SHARE, Workload

_EPS = 1e-9
RESERVE_BYTES = 1.5 * 2**30  # CUDA context, NCCL buffers, allocator fragmentation


@dataclass(frozen=True)
class Problem:
    workload: Workload
    topo: Topology
    memory_limit_bytes: float
    sync_overlap: float = BACKWARD_SHARE  # share of a module's last slice its gradient sync may hide behind

    @property
    def num_devices(self) -> int:
        return self.topo.num_devices

    @property
    def costs_comm(self) -> bool:
        return not self.workload.explicit


@dataclass(frozen=True)
class Placement:
    """``layers`` consecutive layers of metaop ``op`` on devices ``lo .. lo+n-1``; ``wave`` groups slices."""

    op: int
    layers: int
    lo: int
    n: int
    wave: int = 0


@dataclass(frozen=True)
class Slice:
    op: int
    layer_start: int
    layers: int
    lo: int
    n: int
    start_s: float
    end_s: float
    wave: int = 0
    transfer_wait_s: float = 0.0  # part of the wait before start due to activation transfer

    @property
    def devices(self) -> range:
        return range(self.lo, self.lo + self.n)


def slice_time_s(problem: Problem, op: int, layers: int, n: int) -> float:
    return layers * problem.workload.ops[op].layer_ms(n) / 1e3


def timeline(problem: Problem, placements: Sequence[Placement]) -> list[Slice]:
    """Start every placement as early as its devices, its previous layers and its predecessors allow.

    Placements are taken in the given order (a device runs its slices in that order); a metaop's slices must
    come in layer order and after all slices of its predecessors.
    """
    wl = problem.workload
    free = [0.0] * problem.num_devices
    done = [0] * len(wl.ops)
    last: dict[int, Slice] = {}
    out: list[Slice] = []
    for p in placements:
        op = wl.ops[p.op]
        if p.n < 1 or p.lo < 0 or p.lo + p.n > problem.num_devices or p.layers < 1:
            raise ValueError(f"placement {p} outside the cluster")
        block = (p.lo, p.n)
        ready = transfer = 0.0
        if done[p.op] == 0:
            for u in wl.preds[p.op]:
                if done[u] != wl.ops[u].layers:
                    raise ValueError(f"{op.name} placed before its predecessor {wl.ops[u].name} finished")
                prev = last[u]
                t = transfer_s(wl.ops[u], (prev.lo, prev.n), block, problem.topo) if problem.costs_comm else 0.0
                if prev.end_s + t > ready:
                    ready, transfer = prev.end_s + t, t
        else:
            prev = last[p.op]
            transfer = transfer_s(op, (prev.lo, prev.n), block, problem.topo) if problem.costs_comm else 0.0
            ready = prev.end_s + transfer
        busy = max(free[p.lo:p.lo + p.n])
        start = max(ready, busy)
        end = start + slice_time_s(problem, p.op, p.layers, p.n)
        s = Slice(p.op, done[p.op], p.layers, p.lo, p.n, start, end, p.wave,
                  transfer if ready >= busy else 0.0)
        for d in s.devices:
            free[d] = end
        done[p.op] += p.layers
        last[p.op] = s
        out.append(s)
    missing = [wl.ops[i].name for i in range(len(wl.ops)) if done[i] != wl.ops[i].layers]
    if missing:
        raise ValueError(f"layers not all placed for {', '.join(missing[:5])}")
    return out


@dataclass
class Evaluation:
    iteration_time_s: float
    makespan_s: float
    grad_sync_exposed_s: float
    memory_bytes: list[float]
    fits: bool
    compute_s: float  # device-seconds of computation
    module_sync_s: dict[str, float] = field(default_factory=dict)
    reshards: list[Reshard] = field(default_factory=list)  # RL: updated weights into the generation layout

    @property
    def peak_memory_bytes(self) -> float:
        return max(self.memory_bytes) if self.memory_bytes else 0.0

    @property
    def utilization(self) -> float:
        denom = self.iteration_time_s * len(self.memory_bytes)
        return self.compute_s / denom if denom > 0 else 0.0


def _module_grid(problem: Problem, module: str) -> int:
    """Layers of a module (the highest layer any metaop of it runs)."""
    return max(op.layer_offset + op.layers for op in problem.workload.ops if op.module == module)


def memory_per_device(problem: Problem, slices: Sequence[Slice]) -> list[float]:
    """Resident bytes per device: states of every hosted layer (once) + training activations held at the turn
    + the largest working set (a layer's transient buffers; a generation slice's whole KV cache)."""
    wl = problem.workload
    n_dev = problem.num_devices
    if wl.explicit:
        return [0.0] * n_dev
    # per module, bytes of state per (device, layer): a layer hosted twice on a device is stored once
    states: dict[str, np.ndarray] = {}
    held = np.zeros(n_dev)
    transient = np.zeros(n_dev)
    for s in slices:
        op = wl.ops[s.op]
        _, act, work = slice_memory_bytes(op, s.layers, s.n)
        grid = states.get(op.module)
        if grid is None:
            grid = states[op.module] = np.zeros((n_dev, _module_grid(problem, op.module)))
        l0 = op.layer_offset + s.layer_start
        block = grid[s.lo:s.lo + s.n, l0:l0 + s.layers]
        np.maximum(block, state_bytes_per_layer(op, s.n), out=block)
        if op.mode == "train":
            held[s.lo:s.lo + s.n] += act
        else:  # a KV cache lives while its slice decodes (then freed, as RL engines do before the update)
            work += act
        transient[s.lo:s.lo + s.n] = np.maximum(transient[s.lo:s.lo + s.n], work)
    total = held + transient + RESERVE_BYTES
    for grid in states.values():
        total += grid.sum(axis=1)
    return [float(x) for x in total]


def grad_sync(problem: Problem, slices: Sequence[Slice]) -> tuple[dict[str, float], dict[str, float]]:
    """Per trained module: all-reduce time over the devices hosting each layer, and when it may start."""
    wl = problem.workload
    hosts: dict[str, np.ndarray] = {}  # module -> [layer, device] hosted
    params: dict[str, np.ndarray] = {}
    last: dict[str, Slice] = {}
    for s in slices:
        op = wl.ops[s.op]
        if op.mode != "train" or op.params_per_layer == 0 or op.layout(s.n) is not None:
            continue  # (a hybrid layout's data-parallel traffic is in its time: solvers.spindle.layouts)
        if op.module not in last or s.end_s > last[op.module].end_s:
            last[op.module] = s
        if op.module not in hosts:
            n_layers = _module_grid(problem, op.module)
            hosts[op.module] = np.zeros((n_layers, problem.num_devices), dtype=bool)
            params[op.module] = np.zeros(n_layers)
        l0 = op.layer_offset + s.layer_start
        hosts[op.module][l0:l0 + s.layers, s.lo:s.lo + s.n] = True
        params[op.module][l0:l0 + s.layers] = op.params_per_layer
    sync: dict[str, float] = {}
    for module, grid in hosts.items():
        # layers hosted on the same device set go in one bucketed all-reduce
        buckets: dict[bytes, tuple[np.ndarray, float]] = {}
        packed = np.packbits(grid, axis=1)
        for layer in np.flatnonzero(grid.any(axis=1)):
            key = packed[layer].tobytes()
            row, nbytes = buckets.get(key, (grid[layer], 0.0))
            buckets[key] = (row, nbytes + 2.0 * params[module][layer])
        sync[module] = sum(_allreduce_row_s(b, r, problem.topo) for r, b in buckets.values())
    # DDP overlaps the all-reduce with the backward of the module's last slice (by default its last 2/3)
    ready = {m: s.end_s - problem.sync_overlap * (s.end_s - s.start_s) for m, s in last.items()}
    return sync, ready


def _allreduce_row_s(nbytes: float, hosts: np.ndarray, topo: Topology) -> float:
    """All-reduce over the devices marked in ``hosts`` (node-major numbering)."""
    per_node = hosts.reshape(-1, topo.gpus_per_node).sum(axis=1)
    return allreduce_by_node_s(nbytes, int(per_node.max()), int(np.count_nonzero(per_node)), topo)


def evaluate(problem: Problem, slices: Sequence[Slice]) -> Evaluation:
    wl = problem.workload
    makespan = max((s.end_s for s in slices), default=0.0)
    compute = sum(slice_time_s(problem, s.op, s.layers, s.n) * s.n for s in slices)
    sync: dict[str, float] = {}
    finish = makespan
    moves: list[Reshard] = []
    if problem.costs_comm:
        sync, ready = grad_sync(problem, slices)
        finish = max([makespan, *(ready[m] + t for m, t in sync.items())])
        moves = reshards(problem, slices)
        for move in moves:
            # after the module's gradient sync (its last training slice, when a layout carries the sync)
            trained = max(s.end_s for s in slices
                          if wl.ops[s.op].module == move.module and wl.ops[s.op].mode == "train")
            start = ready[move.module] + sync[move.module] if move.module in sync else trained
            finish = max(finish, max(start, trained) + move.time_s)
    mem = memory_per_device(problem, slices)
    fits = problem.workload.explicit or max(mem) <= problem.memory_limit_bytes
    return Evaluation(finish, makespan, finish - makespan, mem, fits, compute, sync, moves)


def violations(problem: Problem, slices: Sequence[Slice], tol: float = 1e-7) -> list[str]:
    """Everything wrong with a timed schedule (empty when valid): the contract's validity rules."""
    wl = problem.workload
    out: list[str] = []
    by_device: dict[int, list[Slice]] = defaultdict(list)
    layers = [0] * len(wl.ops)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for s in slices:
        if s.lo < 0 or s.n < 1 or s.lo + s.n > problem.num_devices:
            out.append(f"slice of {wl.ops[s.op].name} on devices outside the cluster")
        if s.end_s + tol < s.start_s + slice_time_s(problem, s.op, s.layers, s.n):
            out.append(f"slice of {wl.ops[s.op].name} shorter than its {s.layers} layers take")
        layers[s.op] += s.layers
        first[s.op] = min(first.get(s.op, s.start_s), s.start_s)
        last[s.op] = max(last.get(s.op, s.end_s), s.end_s)
        for d in s.devices:
            by_device[d].append(s)
    for d, ss in by_device.items():
        ss.sort(key=lambda s: s.start_s)
        for a, b in itertools.pairwise(ss):
            if b.start_s < a.end_s - tol:
                out.append(f"device {d} double-booked: {wl.ops[a.op].name} and {wl.ops[b.op].name}")
    for i, op in enumerate(wl.ops):
        if layers[i] != op.layers:
            out.append(f"{op.name}: {layers[i]} of {op.layers} layers scheduled")
    for v, ps in enumerate(wl.preds):
        for u in ps:
            if u in last and v in first and first[v] < last[u] - tol:
                out.append(f"edge {wl.ops[u].name} -> {wl.ops[v].name} violated")
    by_op: dict[int, list[Slice]] = defaultdict(list)
    for s in slices:
        by_op[s.op].append(s)
    for i, ss in by_op.items():
        ss.sort(key=lambda s: s.layer_start)
        for a, b in itertools.pairwise(ss):
            if b.start_s < a.end_s - tol:
                out.append(f"{wl.ops[i].name}: layers {b.layer_start}+ start before layers {a.layer_start}+ end")
    return out
