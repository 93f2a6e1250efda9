"""The exact model: OR-Tools CP-SAT over moldable segments on contiguous device blocks.

Each segment (a run of layers of one metaop) picks one width n from its options; per option an optional
time interval of the width's duration and an optional device interval [x, x+n) share presence. NoOverlap2D
on (time, device block) keeps devices single-booked and blocks contiguous; a cumulative constraint over
widths strengthens propagation; precedence chains a metaop's segments and follows the edges. The objective
is the makespan of the time model (transfers and gradient sync are added when the solution is timed).

Segments come from the warm start (the wavefront plan's slices), which is given as a complete hint, so the
solver only ever improves on it; with one segment per metaop and all widths it is exact for the time model.

Reproducibility: one worker with a fixed seed stops at a deterministic-time budget, so two runs of one request
on one OR-Tools build return the same schedule whatever the machine's load. The budget is derived from the
request's wall-clock limit at ``DTIME_PER_S``. On this model CP-SAT's deterministic time advances only ~0.02-0.08
units per wall second (one worker, the shared 2-core development machine: omni 0.044-0.061, clip-imagebind
0.078, seedance 0.029), far below the nominal one per second; the former budget of 4 units was therefore never
reached and every run ended on the wall clock, at a load-dependent point. The
wall limit stays as a safety net; ``stopped_by`` says which limit ended the search. More workers run CP-SAT's
parallel portfolio, which shares solutions by wall-clock timing (and in interleaved mode still overran its
deterministic limit in our runs): faster, not reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ortools.sat.python import cp_model

from solvers.spindle.bounds import DeviceRange
from solvers.spindle.cost import worst_transfer_s
from solvers.spindle.schedule import Placement, Problem

_US = 1e6
# deterministic-time units per second of the request's limit: about half the slowest rate measured on a loaded
# 2-core machine (see the module docstring), so the deterministic budget ends the search before the wall clock
DTIME_PER_S = 0.01
StoppedBy = Literal["solved", "deterministic_limit", "wall_clock"]


@dataclass(frozen=True)
class Segment:
    op: int
    layers: int
    wave: int = 0


@dataclass
class ExactResult:
    placements: list[Placement] | None
    status: str
    makespan_s: float | None
    bound_s: float | None
    wall_s: float
    deterministic_time: float = 0.0  # CP-SAT's deterministic time spent
    stopped_by: StoppedBy = "solved"

    @property
    def gap(self) -> float | None:
        """(objective - best bound) / objective of the model's makespan; 0 when proved optimal."""
        if self.makespan_s is None or self.bound_s is None or self.makespan_s <= 0:
            return None
        return (self.makespan_s - self.bound_s) / self.makespan_s


def deterministic_budget(time_limit_s: float) -> float:
    """The deterministic-time budget standing for ``time_limit_s`` seconds of search."""
    return DTIME_PER_S * time_limit_s


def _duration_us(problem: Problem, seg: Segment, n: int) -> int:
    return math.ceil(seg.layers * problem.workload.ops[seg.op].layer_ms(n) * 1e3 - 1e-6)


def width_options(problem: Problem, seg: Segment, r: DeviceRange, keep: Sequence[int] = ()) -> list[int]:
    """Widths worth trying: all when few, else a spread (powers of two, node multiples, near the hint);
    widths no faster than a narrower one are dropped (they only waste devices)."""
    if r.hi - r.lo < 16:
        cands = set(range(r.lo, r.hi + 1))
    else:
        g = problem.topo.gpus_per_node
        cands = {r.lo, r.hi, *(2**k for k in range(16)), *(g * k for k in range(1, r.hi // g + 1))}
        cands |= {k + d for k in keep for d in (-1, 0, 1)}
        cands |= set(range(r.lo, min(r.hi, r.lo + 8) + 1))
    cands = {n for n in cands if r.lo <= n <= r.hi} | {n for n in keep if r.lo <= n <= r.hi}
    out, best = [], math.inf
    for n in sorted(cands):
        d = _duration_us(problem, seg, n)
        if d < best or n in keep:
            out.append(n)
            best = min(best, d)
    return out


def _pairs(problem: Problem, segs: Sequence[Segment]) -> list[tuple[int, int]]:
    """(a, b): segment b may start only after a: a metaop's next stage, and the edges."""
    wl = problem.workload
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    out = []
    for k, seg in enumerate(segs):
        if seg.op in last:
            out.append((last[seg.op], k))
        first.setdefault(seg.op, k)
        last[seg.op] = k
    out += [(last[u], first[v]) for v, ps in enumerate(wl.preds) for u in ps]
    return out


def _hint_times(problem: Problem, segs: Sequence[Segment], hint: Sequence[Placement],
                delay: dict[tuple[int, int], int]) -> list[tuple[int, int]]:
    """Start/end (µs) of the hinted placements under the model's own durations and hand-over delays."""
    free = [0] * problem.num_devices
    before: dict[int, list[int]] = {}
    for a, b in delay:
        before.setdefault(b, []).append(a)
    out: list[tuple[int, int]] = []
    for k, (seg, p) in enumerate(zip(segs, hint, strict=True)):
        ready = 0
        for a in before.get(k, []):
            moved = (hint[a].lo, hint[a].n) != (p.lo, p.n)
            ready = max(ready, out[a][1] + (delay[(a, k)] if moved else 0))
        start = max(ready, *free[p.lo:p.lo + p.n])
        end = start + _duration_us(problem, seg, p.n)
        for d in range(p.lo, p.lo + p.n):
            free[d] = end
        out.append((start, end))
    return out


def solve(problem: Problem, ranges: list[DeviceRange], hint: Sequence[Placement] | None = None,
          segments: Sequence[Segment] | None = None, time_limit_s: float = 10.0,
          deterministic_time: float | None = None, workers: int = 1, seed: int = 0) -> ExactResult:
    """Minimise the makespan; ``hint`` (placements in run order) fixes the segments and warm-starts.

    Stops at ``deterministic_time`` (default: ``deterministic_budget(time_limit_s)``) or at ``time_limit_s`` of
    wall clock, whichever comes first; with one worker the first is reproducible, the second is not."""
    wl = problem.workload
    n_dev = problem.num_devices
    if hint is not None:
        segs = [Segment(p.op, p.layers, p.wave) for p in hint]
    else:
        segs = list(segments or [Segment(i, op.layers) for i, op in enumerate(wl.ops)])
    options = [width_options(problem, s, ranges[s.op], [hint[k].n] if hint else []) for k, s in enumerate(segs)]
    # hand-over of a segment's output to a block that is not its own: the worst case over the widths
    delay = {(a, b): (max(math.ceil(_US * worst_transfer_s(wl.ops[segs[a].op], n_a, n_b, problem.topo))
                          for n_a in options[a] for n_b in options[b]) if problem.costs_comm else 0)
             for a, b in _pairs(problem, segs)}
    hint_times = _hint_times(problem, segs, hint, delay) if hint is not None else None
    horizon = (max(e for _, e in hint_times) if hint_times else
               sum(_duration_us(problem, s, ranges[s.op].lo) + max([0, *(d for (a, _), d in delay.items()
                                                                       if a == k)])
                   for k, s in enumerate(segs)))

    m = cp_model.CpModel()
    starts, ends, xs, choice = [], [], [], []
    t_ivs, d_ivs, demands = [], [], []
    for k, seg in enumerate(segs):
        s = m.new_int_var(0, horizon, f"s{k}")
        e = m.new_int_var(0, horizon, f"e{k}")
        x = m.new_int_var(0, n_dev - min(options[k]), f"x{k}")
        lits = []
        for n in options[k]:
            p = m.new_bool_var(f"p{k}_{n}")
            t_ivs.append(m.new_optional_interval_var(s, _duration_us(problem, seg, n), e, p, f"t{k}_{n}"))
            d_ivs.append(m.new_optional_fixed_size_interval_var(x, n, p, f"d{k}_{n}"))
            demands.append(n)
            m.add(x <= n_dev - n).only_enforce_if(p)
            lits.append((n, p))
        m.add_exactly_one(p for _, p in lits)
        starts.append(s)
        ends.append(e)
        xs.append(x)
        choice.append(lits)
    m.add_no_overlap_2d(t_ivs, d_ivs)
    m.add_cumulative(t_ivs, demands, n_dev)
    same_block: list[tuple[int, int, cp_model.IntVar]] = []
    for (a, b), wait in delay.items():
        m.add(starts[b] >= ends[a])
        if wait <= 0:
            continue
        # the hand-over delay applies unless b runs on a's very block
        same = m.new_bool_var(f"same{a}_{b}")
        m.add(starts[b] >= ends[a] + wait).only_enforce_if(same.Not())
        m.add(xs[a] == xs[b]).only_enforce_if(same)
        widths_b = dict(choice[b])
        for n, lit in choice[a]:
            if n in widths_b:
                m.add(lit == widths_b[n]).only_enforce_if(same)
            else:
                m.add_implication(same, lit.Not())
        same_block.append((a, b, same))
    makespan = m.new_int_var(0, horizon, "makespan")
    m.add_max_equality(makespan, ends)
    m.minimize(makespan)
    if hint is not None and hint_times is not None:
        for k, placed in enumerate(hint):
            m.add_hint(starts[k], hint_times[k][0])
            m.add_hint(ends[k], hint_times[k][1])
            m.add_hint(xs[k], placed.lo)
            for n, lit in choice[k]:
                m.add_hint(lit, n == placed.n)
        for a, b, same in same_block:
            m.add_hint(same, (hint[a].lo, hint[a].n) == (hint[b].lo, hint[b].n))
        m.add_hint(makespan, max(e for _, e in hint_times))

    dtime_limit = deterministic_budget(time_limit_s) if deterministic_time is None else deterministic_time
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.max_deterministic_time = dtime_limit
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    code = solver.solve(m)
    status = solver.status_name(code)
    spent = solver.response_proto.deterministic_time
    stopped: StoppedBy = ("solved" if code in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID) else
                          "deterministic_limit" if spent >= dtime_limit else "wall_clock")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return ExactResult(None, status, None, None, solver.wall_time, spent, stopped)
    chosen = []
    for k, seg in enumerate(segs):
        n = next(n for n, lit in choice[k] if solver.value(lit))
        chosen.append((solver.value(starts[k]), solver.value(xs[k]), k, Placement(seg.op, seg.layers,
                                                                              solver.value(xs[k]), n, seg.wave)))
    chosen.sort(key=lambda c: (c[0], c[1], c[2]))
    return ExactResult([c[3] for c in chosen], status, solver.objective_value / _US,
                       solver.best_objective_bound / _US, solver.wall_time, spent, stopped)
