"""Local search on a plan's placements under the full cost model (transfers, gradient sync, memory).

The wavefront planner and the exact model both decide on a proxy (continuous shares; the time model alone);
this hill climb fixes what their rounding leaves: a layer moved between two stages of a metaop, a block
widened, narrowed or shifted by one device. Every candidate is re-timed by ``timeline``, so each one is a
valid schedule; a move is kept only if the evaluated plan is strictly better.

The budget is counted in work, not wall clock, so a request gives the same plan on a busy machine: each
candidate costs its number of slices, and a second of budget buys ``SLICE_EVALS_PER_S`` of them (one slice
timed and evaluated takes 80-160 µs on the 2-core development machine). A wall-clock cap at
``WALL_CAP`` times the budget stays as a safety net; ``Polished.wall_capped`` says when it ended the search.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from solvers.spindle.bounds import DeviceRange
from solvers.spindle.planner import Planned, better
from solvers.spindle.schedule import Placement, Problem, Slice, evaluate, timeline

_MIN_GAIN = 1e-9
SLICE_EVALS_PER_S = 10_000
WALL_CAP = 4.0


@dataclass
class Polished:
    plan: Planned
    wall_capped: bool  # the wall-clock safety net ended the search (the result may vary with the load)


def _moves(problem: Problem, ranges: list[DeviceRange], pl: list[Placement], k: int) -> Iterator[list[Placement]]:
    p = pl[k]
    r = ranges[p.op]
    n_dev = problem.num_devices

    def with_(q: Placement) -> list[Placement]:
        return [*pl[:k], q, *pl[k + 1:]]

    nxt = next((j for j in range(k + 1, len(pl)) if pl[j].op == p.op), None)
    if nxt is not None:
        q = pl[nxt]
        for d in (1, -1):  # one layer from this stage to the next one, or back
            if p.layers - d >= 1 and q.layers + d >= 1:
                out = with_(Placement(p.op, p.layers - d, p.lo, p.n, p.wave))
                out[nxt] = Placement(q.op, q.layers + d, q.lo, q.n, q.wave)
                yield out
        merged = with_(Placement(p.op, p.layers + q.layers, p.lo, p.n, p.wave))  # drop the next stage
        yield merged[:nxt] + merged[nxt + 1:]
    for lo, n in ((p.lo, p.n + 1), (p.lo - 1, p.n + 1), (p.lo, p.n - 1), (p.lo + 1, p.n - 1),
                  (p.lo - 1, p.n), (p.lo + 1, p.n)):
        if r.lo <= n <= r.hi and lo >= 0 and lo + n <= n_dev:
            yield with_(Placement(p.op, p.layers, lo, n, p.wave))


def critical_chain(slices: Sequence[Slice], tol: float = 1e-9) -> list[int]:
    """Indices of the slices on the longest chain, last first: from the slice that ends last, step back to
    whatever it waited for (the slice that freed one of its devices, or its own previous stage, or a
    predecessor metaop's last slice, which end at or before its start)."""
    if not slices:
        return []
    k = max(range(len(slices)), key=lambda i: slices[i].end_s)
    out = [k]
    while slices[k].start_s > tol:
        s = slices[k]
        # the latest-ending earlier slice that shares a device or is an earlier stage / metaop it follows
        cands = [j for j in range(k) if slices[j].end_s <= s.start_s + tol and
                 (slices[j].op == s.op or (slices[j].lo < s.lo + s.n and s.lo < slices[j].lo + slices[j].n))]
        if not cands:
            break
        k = max(cands, key=lambda j: slices[j].end_s)
        out.append(k)
    return out


def polish(problem: Problem, ranges: list[DeviceRange], start: Planned, budget_s: float) -> Polished:
    """First-improvement hill climbing over single-slice moves until no move helps or the budget is spent."""
    work_left = budget_s * SLICE_EVALS_PER_S
    deadline = time.perf_counter() + WALL_CAP * budget_s
    best = start
    improved = True
    while improved:
        improved = False
        # the chain that decides the iteration time first, then the other slices ending last
        chain = critical_chain(best.slices)
        order = chain + sorted(set(range(len(best.slices))) - set(chain), key=lambda i: -best.slices[i].end_s)
        pl = list(best.placements)
        for k in order:  # timeline keeps placement order: slice k is placement k
            for cand in _moves(problem, ranges, pl, k):
                if work_left <= 0:
                    return Polished(best, False)
                if time.perf_counter() >= deadline:
                    return Polished(best, True)
                work_left -= len(cand)
                try:
                    slices = timeline(problem, cand)
                except ValueError:
                    continue
                plan = Planned(start.name + "+polish", cand, slices, evaluate(problem, slices))
                if better(best, plan) and (plan.evaluation.fits != best.evaluation.fits or
                                           plan.evaluation.iteration_time_s < best.evaluation.iteration_time_s
                                           - _MIN_GAIN):
                    best = plan
                    improved = True
                    break
            if improved:
                break
    return Polished(best, False)
