"""Layer swaps: a chosen plan improved one layer's strategy at a time under the exact pipeline formula.

The layer DP ranks a stage's plans by w x time + step time, so it finds only the points of each stage's lower convex
(time, step time) hull. A pipeline formula with a kink, such as Galvatron's ``max(0, sync - compute)`` on top of the
pipelined time, can have its optimum off that hull: the fastest stage whose gradient sync still hides behind its
compute is a constrained optimum no weight ranks first (measured on random 2-4 layer cases: 12 of 1,995 off the
hull, up to 4.4 % slower). So can the linear formula's max over the stages' step times: a stage of identical layers
mixing two strategies lies on the hull's edge between the two pure stages, where no weight ranks it first, and can
be the one whose step time meets the slowest stage's. Steepest descent over single-layer changes, each checked
against the memory limit and priced by the cost model's own formula, closes most of that gap; where no single change
helps, a change of two layers of one stage at once (one turning leaner and slower so another can turn faster, or two
trading strategies) closes more: ``bench/exactness.py --formula galvatron``, 1,995 cases, 6 inexact (worst 0.78 %)
with single changes, 2 (worst 0.38 %) with pairs too. The pairs are priced as outer sums of the two layers' changes
and only their (time, step time) front is priced by the formula.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from solvers.hybrid import prune
from solvers.hybrid.stage_costs import StageInputs

PipelineTime = Callable[[Sequence[float], Sequence[float]], float]


@dataclass
class _Stage:
    """One stage's chosen candidates and what they add up to (recomputed after every accepted change)."""

    inputs: StageInputs
    kinds: list[Hashable]
    choice: list[int]
    time_s: float = 0.0
    step_s: float = 0.0
    resident: float = 0.0

    def pairs(self) -> list[tuple[Hashable, int]]:
        return list(zip(self.kinds, self.choice, strict=True))

    def total(self) -> None:
        st, (cls, trans), pairs = self.inputs, self.inputs.transitions(), self.pairs()
        self.time_s = st.fixed.time_s + sum(float(st.costs[k].time_s[c]) for k, c in pairs)
        self.time_s += sum(float(trans[cls[a], cls[b]]) for a, b in itertools.pairwise(self.choice))
        self.step_s = st.fixed.step_time_s + sum(float(st.costs[k].step_time_s[c]) for k, c in pairs)
        self.resident = st.fixed_memory() + sum(float(st.memory(k)[c]) for k, c in pairs)


def _changes(stage: _Stage, pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate for layer ``pos`` of ``stage``, with its neighbours as they are: what the stage's time,
    step time and resident memory change by."""
    st, k, old = stage.inputs, stage.kinds[pos], stage.choice[pos]
    costs, mem = st.costs[k], st.memory(k)
    cls, trans = st.transitions()
    dt = costs.time_s - costs.time_s[old]
    if pos > 0:
        prev = cls[stage.choice[pos - 1]]
        dt = dt + trans[prev, cls] - trans[prev, cls[old]]
    if pos + 1 < len(stage.choice):
        nxt = cls[stage.choice[pos + 1]]
        dt = dt + trans[cls, nxt] - trans[cls[old], nxt]
    return dt, costs.step_time_s - costs.step_time_s[old], mem - mem[old]


def _peak_without(stage: _Stage, *positions: int) -> float:
    """The stage's largest transient buffer over its layers other than ``positions``."""
    st = stage.inputs
    return max((float(st.costs[q].peak_extra_bytes[c]) for i, (q, c) in enumerate(stage.pairs())
                if i not in positions), default=0.0)


def _improving(stage: _Stage, dt: np.ndarray, du: np.ndarray, dm: np.ndarray, peak: np.ndarray, limit: float
               ) -> np.ndarray:
    """Flat indices of the changes that fit the memory limit and are faster in time or in step time, on their
    (time, step time) front: a pipeline formula never falls as a stage's time or step time grows, so only the
    front can hold the best (pricing the rest was most of a 128-layer search's swap time)."""
    dt, du = dt.ravel(), du.ravel()
    # (a hair under the limit: the evaluator sums in another order)
    fits = (stage.resident + dm + peak).ravel() <= limit * (1 - 1e-9)
    keep = np.flatnonzero(fits & ((dt < 0) | (du < 0)))
    return keep[prune.front(dt[keep], du[keep])]


def _moves(stage: _Stage, pos: int, limit: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidates, their stage time, their stage step time) for layer ``pos`` of ``stage``: every candidate
    that fits the memory limit in its place and is faster in time or in step time."""
    dt, du, dm = _changes(stage, pos)
    peak = np.maximum(stage.inputs.costs[stage.kinds[pos]].peak_extra_bytes, _peak_without(stage, pos))
    keep = _improving(stage, dt, du, dm, peak, limit)
    return keep, stage.time_s + dt[keep], stage.step_s + du[keep]


def _pair_moves(stage: _Stage, a: int, b: int, limit: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(candidates for a, for b, stage times, stage step times) for layers ``a`` < ``b`` changed together: the
    fitting pairs faster in time or in step time. One layer turning leaner and slower to make room for another
    to turn faster is a move no single change makes (measured: 3 of 6 random misses under Galvatron's formula)."""
    st, (xa, xb) = stage.inputs, (stage.choice[a], stage.choice[b])
    (ta, ua, ma), (tb, ub, mb) = _changes(stage, a), _changes(stage, b)
    dt = ta[:, None] + tb[None, :]
    if b == a + 1:  # each counted the layers' transition with the other's old choice: make it the new pair's
        cls, trans = st.transitions()
        dt = dt + (trans[np.ix_(cls, cls)] - trans[cls, cls[xb]][:, None] - trans[cls[xa], cls][None, :]
                   + trans[cls[xa], cls[xb]])
    peak = np.maximum(np.maximum.outer(st.costs[stage.kinds[a]].peak_extra_bytes,
                                       st.costs[stage.kinds[b]].peak_extra_bytes), _peak_without(stage, a, b))
    du, dm = ua[:, None] + ub[None, :], ma[:, None] + mb[None, :]
    keep = _improving(stage, dt, du, dm, peak, limit)
    x, y = np.unravel_index(keep, dt.shape)
    both = (x != xa) & (y != xb)  # (one layer alone: a single change, already priced)
    return x[both], y[both], stage.time_s + dt.ravel()[keep[both]], stage.step_s + du.ravel()[keep[both]]


def _key(stage: _Stage, pos: int) -> tuple[Hashable, int, int, int]:
    """What a change of layer ``pos`` depends on: identical neighbourhoods give identical moves."""
    return (stage.kinds[pos], stage.choice[pos], stage.choice[pos - 1] if pos else -1,
            stage.choice[pos + 1] if pos + 1 < len(stage.choice) else -1)


# a change of a stage's layers: ({layer: candidate}, the stage's new time, its new step time)
Move = tuple[dict[int, int], float, float]


def _single_changes(stage: _Stage, limit: float) -> Iterator[Move]:
    """Every improving change of one layer (a run of identical neighbourhoods priced once)."""
    tried: set[tuple[Hashable, int, int, int]] = set()
    for pos in range(len(stage.choice)):
        key = _key(stage, pos)
        if key in tried:
            continue
        tried.add(key)
        cands, t_new, u_new = _moves(stage, pos, limit)
        for c, t, u in zip(cands, t_new, u_new, strict=True):
            yield {pos: int(c)}, float(t), float(u)


def _pair_changes(stage: _Stage, limit: float) -> Iterator[Move]:
    """Every improving change of two layers at once (as ``_single_changes``, per pair of neighbourhoods)."""
    tried: set[tuple[object, ...]] = set()
    for a, b in itertools.combinations(range(len(stage.choice)), 2):
        key = (_key(stage, a), _key(stage, b), b - a == 1)
        if key in tried:
            continue
        tried.add(key)
        xs, ys, t_new, u_new = _pair_moves(stage, a, b, limit)
        for x, y, t, u in zip(xs, ys, t_new, u_new, strict=True):
            yield {a: int(x), b: int(y)}, float(t), float(u)


def _best(state: list[_Stage], pipe: PipelineTime, value: float, changes: Callable[[_Stage], Iterator[Move]]
          ) -> tuple[float, int, dict[int, int]] | None:
    """Of every stage's ``changes``, the one that lowers the step time most: (step time, stage, change)."""
    best: tuple[float, int, dict[int, int]] | None = None
    times, steps = [s.time_s for s in state], [s.step_s for s in state]
    for i, s in enumerate(state):
        for change, t, u in changes(s):
            times[i], steps[i] = t, u
            v = pipe(times, steps)
            if v < value * (1 - 1e-12) and (best is None or v < best[0]):
                best = (v, i, change)
        times[i], steps[i] = s.time_s, s.step_s
    return best


def improve(stages: Sequence[StageInputs], kinds: Sequence[Sequence[Hashable]], choices: Sequence[Sequence[int]],
            limit: float, pipe: PipelineTime, max_moves: int = 64, pairs: bool = True
            ) -> tuple[list[list[int]], float]:
    """Steepest descent from ``choices`` (per stage, a candidate index per layer): each round makes the one
    single-layer change that lowers ``pipe``'s step time most or, where none does and ``pairs``, the one change
    of two layers of a stage at once, until neither does or ``max_moves`` are made. Returns the choices and
    their step time."""
    state = [_Stage(st, list(k), list(c)) for st, k, c in zip(stages, kinds, choices, strict=True)]
    for s in state:
        s.total()
    value = pipe([s.time_s for s in state], [s.step_s for s in state])
    for _ in range(max_moves):
        best = _best(state, pipe, value, lambda s: _single_changes(s, limit))
        if best is None and pairs:
            best = _best(state, pipe, value, lambda s: _pair_changes(s, limit))
        if best is None:
            break
        _, i, change = best
        for pos, c in change.items():
            state[i].choice[pos] = c
        state[i].total()
        value = pipe([s.time_s for s in state], [s.step_s for s in state])
    return [s.choice for s in state], value
