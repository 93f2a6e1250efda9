"""The heuristic planner: a portfolio of wavefront and list schedules, the best by full evaluation.

Every candidate is timed by ``schedule.timeline`` and costed by ``schedule.evaluate`` (transfers, gradient
sync, memory), so they compare on one cost model. When no candidate fits in memory, the metaops crowding
the fullest device get wider minimum blocks (less state and activation per device) and the portfolio reruns.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from solvers.spindle.bounds import DeviceRange
from solvers.spindle.cost import slice_memory_bytes
from solvers.spindle.listsched import EFFICIENCIES, plan_list
from solvers.spindle.schedule import Evaluation, Placement, Problem, Slice, evaluate, timeline
from solvers.spindle.wavefront import ORDERS, SHARES, Shares, SplitMemo, plan_waves

SPLIT_SHARES: tuple[Shares, ...] = ("fluid", "mix")  # wave splitting (``wavefront.split_wave``) with these share models


@dataclass
class Planned:
    name: str
    placements: list[Placement]
    slices: list[Slice]
    evaluation: Evaluation


def better(a: Planned | None, b: Planned) -> bool:
    """Is ``b`` better than ``a``: plans that fit beat plans that do not, then the shorter iteration."""
    if a is None:
        return True
    return (b.evaluation.fits, -b.evaluation.iteration_time_s) > (a.evaluation.fits, -a.evaluation.iteration_time_s)


def _widen_for_memory(problem: Problem, plan_: Planned, ranges: list[DeviceRange]) -> list[DeviceRange] | None:
    """Raise the minimum width of the metaops holding the most memory on the fullest device, or None."""
    ev = plan_.evaluation
    worst = max(range(len(ev.memory_bytes)), key=lambda d: ev.memory_bytes[d])
    held: dict[int, float] = {}
    for s in plan_.slices:
        if s.lo <= worst < s.lo + s.n:
            op = problem.workload.ops[s.op]
            held[s.op] = held.get(s.op, 0.0) + sum(slice_memory_bytes(op, s.layers, s.n))
    out = list(ranges)
    for i in sorted(held, key=lambda i: -held[i]):
        r = ranges[i]
        if r.lo < r.hi:
            out[i] = DeviceRange(min(r.hi, 2 * r.lo), r.hi)
            return out
    return None


def _candidates(problem: Problem, ranges: list[DeviceRange], shuffles: int, seed: int) -> Iterator[
        tuple[str, list[Placement]]]:
    for (name, order), shares in itertools.product(ORDERS.items(), SHARES):
        yield f"wavefront/{shares}/{name}", plan_waves(problem, ranges, order, shares)
    memos: dict[str, SplitMemo] = {shares: {} for shares in SPLIT_SHARES}
    for (name, order), shares in itertools.product(ORDERS.items(), SPLIT_SHARES):
        yield f"wavefront/{shares}/{name}/split", plan_waves(problem, ranges, order, shares, split=memos[shares])
    for eff in EFFICIENCIES:
        yield f"list/eff{eff:g}", plan_list(problem, ranges, eff)
    # which shares sit next to each other decides who waits for whom on a shared device: a few seeded
    # random line-ups of the fluid wavefront are cheap insurance against a bad fixed ordering
    rng = random.Random(seed)
    for k in range(shuffles):
        def shuffled(problem: Problem, ready: list[int], share: list[float], centre: dict[int, float]) -> list[int]:
            idx = list(range(len(ready)))
            rng.shuffle(idx)
            return idx
        yield f"wavefront/fluid/shuffle{k}", plan_waves(problem, ranges, shuffled)


@dataclass
class Portfolio:
    best: Planned
    best_single: Planned | None  # best with one slice per metaop: the exact model's warm start with comm
    scores: dict[str, float | None]  # every candidate's iteration time (None: over the memory limit)
    runners_up: list[Planned]  # the next best distinct plans (other basins for the local search)


def _single(p: Planned) -> bool:
    return len({s.op for s in p.slices}) == len(p.slices)


def plan(problem: Problem, ranges: list[DeviceRange], memory_rounds: int = 12, shuffles: int = 24,
         seed: int = 0, runners_up: int = 2) -> Portfolio:
    """The best candidate that fits; widen the crowding metaops' minimum blocks while none does."""
    best: Planned | None = None
    single: Planned | None = None
    scores: dict[str, float | None] = {}
    seen: dict[tuple[Placement, ...], Planned] = {}
    for _ in range(memory_rounds):
        for name, placements in _candidates(problem, ranges, shuffles, seed):
            slices = timeline(problem, placements)
            cand = Planned(name, placements, slices, evaluate(problem, slices))
            scores[name] = cand.evaluation.iteration_time_s if cand.evaluation.fits else None
            seen.setdefault(tuple(placements), cand)
            if better(best, cand):
                best = cand
            if _single(cand) and better(single, cand):
                single = cand
        assert best is not None
        if best.evaluation.fits:
            break
        wider = _widen_for_memory(problem, best, ranges)
        if wider is None:
            break
        ranges = wider
    assert best is not None
    ranked = sorted(seen.values(), key=lambda p: (not p.evaluation.fits, p.evaluation.iteration_time_s))
    return Portfolio(best, single, scores, [p for p in ranked if p is not best][:runners_up])
