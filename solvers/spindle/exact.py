"""The exact model: OR-Tools CP-SAT over moldable segments on contiguous device blocks.

Each segment (a run of layers of one metaop) picks one width n from its options; per option an optional
time interval of the width's duration and an optional device interval [x, x+n) share presence. NoOverlap2D
on (time, device block) keeps devices single-booked and blocks contiguous; a cumulative constraint over
widths strengthens propagation; precedence chains a metaop's segments and follows the edges. The objective
is the makespan of the time model (transfers and gradient sync are added when the solution is timed).

Segments come from the warm start (the wavefront plan's slices), which is given as a complete hint, so the
solver only ever improves on it; with one segment per metaop and all widths it is exact for the time model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from solvers.spindle.bounds import DeviceRange
from solvers.spindle.schedule import Placement, Problem

_US = 1e6


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


def _hint_times(problem: Problem, segs: Sequence[Segment], hint: Sequence[Placement]) -> list[tuple[int, int]]:
    """Start/end (µs) of the hinted placements under the model's own integer durations, without transfers."""
    free = [0] * problem.num_devices
    end_of: dict[int, int] = {}
    done: dict[int, int] = {}
    out = []
    for seg, p in zip(segs, hint, strict=True):
        wl = problem.workload
        ready = end_of.get(p.op, 0) if p.op in done else max((end_of[u] for u in wl.preds[p.op]), default=0)
        start = max(ready, *free[p.lo:p.lo + p.n])
        end = start + _duration_us(problem, seg, p.n)
        for d in range(p.lo, p.lo + p.n):
            free[d] = end
        end_of[p.op] = end
        done[p.op] = done.get(p.op, 0) + p.layers
        out.append((start, end))
    return out


def solve(problem: Problem, ranges: list[DeviceRange], hint: Sequence[Placement] | None = None,
          segments: Sequence[Segment] | None = None, time_limit_s: float = 10.0,
          deterministic_time: float | None = None, workers: int = 2, seed: int = 0) -> ExactResult:
    """Minimise the makespan; ``hint`` (placements in run order) fixes the segments and warm-starts."""
    wl = problem.workload
    n_dev = problem.num_devices
    if hint is not None:
        segs = [Segment(p.op, p.layers, p.wave) for p in hint]
    else:
        segs = list(segments or [Segment(i, op.layers) for i, op in enumerate(wl.ops)])
    hint_times = _hint_times(problem, segs, hint) if hint is not None else None
    options = [width_options(problem, s, ranges[s.op], [hint[k].n] if hint else []) for k, s in enumerate(segs)]
    horizon = (max(e for _, e in hint_times) if hint_times else
               sum(_duration_us(problem, s, ranges[s.op].lo) for s in segs))

    m = cp_model.CpModel()
    starts, ends, xs, choice = [], [], [], []
    t_ivs, d_ivs, demands = [], [], []
    for k, seg in enumerate(segs):
        s = m.NewIntVar(0, horizon, f"s{k}")
        e = m.NewIntVar(0, horizon, f"e{k}")
        x = m.NewIntVar(0, n_dev - min(options[k]), f"x{k}")
        lits = []
        for n in options[k]:
            p = m.NewBoolVar(f"p{k}_{n}")
            t_ivs.append(m.NewOptionalIntervalVar(s, _duration_us(problem, seg, n), e, p, f"t{k}_{n}"))
            d_ivs.append(m.NewOptionalFixedSizeIntervalVar(x, n, p, f"d{k}_{n}"))
            demands.append(n)
            m.Add(x <= n_dev - n).OnlyEnforceIf(p)
            lits.append((n, p))
        m.AddExactlyOne(p for _, p in lits)
        starts.append(s)
        ends.append(e)
        xs.append(x)
        choice.append(lits)
    m.AddNoOverlap2D(t_ivs, d_ivs)
    m.AddCumulative(t_ivs, demands, n_dev)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, seg in enumerate(segs):
        if seg.op in last:
            m.Add(starts[k] >= ends[last[seg.op]])
        first.setdefault(seg.op, k)
        last[seg.op] = k
    for v, ps in enumerate(wl.preds):
        for u in ps:
            m.Add(starts[first[v]] >= ends[last[u]])
    makespan = m.NewIntVar(0, horizon, "makespan")
    m.AddMaxEquality(makespan, ends)
    m.Minimize(makespan)
    if hint is not None and hint_times is not None:
        for k, p in enumerate(hint):
            m.AddHint(starts[k], hint_times[k][0])
            m.AddHint(ends[k], hint_times[k][1])
            m.AddHint(xs[k], p.lo)
            for n, lit in choice[k]:
                m.AddHint(lit, n == p.n)
        m.AddHint(makespan, max(e for _, e in hint_times))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    if deterministic_time is not None:
        solver.parameters.max_deterministic_time = deterministic_time
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    code = solver.Solve(m)
    status = solver.StatusName(code)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return ExactResult(None, status, None, None, solver.WallTime())
    chosen = []
    for k, seg in enumerate(segs):
        n = next(n for n, lit in choice[k] if solver.Value(lit))
        chosen.append((solver.Value(starts[k]), solver.Value(xs[k]), k, Placement(seg.op, seg.layers,
                                                                              solver.Value(xs[k]), n, seg.wave)))
    chosen.sort(key=lambda c: (c[0], c[1], c[2]))
    return ExactResult([c[3] for c in chosen], status, solver.ObjectiveValue() / _US,
                       solver.BestObjectiveBound() / _US, solver.WallTime())
