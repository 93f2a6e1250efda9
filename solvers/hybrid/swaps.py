"""Layer swaps: a chosen plan improved one layer's strategy at a time under the exact pipeline formula.

The layer DP ranks a stage's plans by w x time + step time, so it finds only the points of each stage's lower
convex (time, step time) hull. A pipeline formula with a kink, such as Galvatron's ``max(0, sync - compute)``
on top of the pipelined time, can have its optimum off that hull: the fastest stage whose gradient sync
still hides behind its compute is a constrained optimum no weight ranks first (measured on random 2-4 layer
cases: 12 of 1,995 off the hull, up to 4.4 % slower). Steepest descent over single-layer changes, each
checked against the memory limit and priced by the cost model's own formula, closes most of that gap.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
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


def _moves(stage: _Stage, pos: int, limit: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidates, their stage time, their stage step time) for layer ``pos`` of ``stage``: every candidate
    that fits the memory limit in its place and is faster in time or in step time."""
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
    du = costs.step_time_s - costs.step_time_s[old]
    others = [float(st.costs[q].peak_extra_bytes[c]) for i, (q, c) in enumerate(stage.pairs()) if i != pos]
    peak = np.maximum(costs.peak_extra_bytes, max(others, default=0.0))
    # (a hair under the limit: the evaluator sums in another order)
    fits = stage.resident - mem[old] + mem + peak <= limit * (1 - 1e-9)
    keep = np.flatnonzero(fits & ((dt < 0) | (du < 0)))
    # a pipeline formula never falls as a stage's time or step time grows: only the (time, step time) front can
    # be the best move, and pricing the rest was most of a 128-layer search's swap time
    keep = keep[prune.front(dt[keep], du[keep])]
    return keep, stage.time_s + dt[keep], stage.step_s + du[keep]


def improve(stages: Sequence[StageInputs], kinds: Sequence[Sequence[Hashable]], choices: Sequence[Sequence[int]],
            limit: float, pipe: PipelineTime, max_moves: int = 64) -> tuple[list[list[int]], float]:
    """Steepest descent from ``choices`` (per stage, a candidate index per layer): each round makes the one
    single-layer change that lowers ``pipe``'s step time most, until none does or ``max_moves`` are made.
    Returns the choices and their step time."""
    state = [_Stage(st, list(k), list(c)) for st, k, c in zip(stages, kinds, choices, strict=True)]
    for s in state:
        s.total()
    value = pipe([s.time_s for s in state], [s.step_s for s in state])
    for _ in range(max_moves):
        best: tuple[float, int, int, int] | None = None
        times, steps = [s.time_s for s in state], [s.step_s for s in state]
        for i, s in enumerate(state):
            tried: set[tuple[Hashable, int, int, int]] = set()
            for pos in range(len(s.choice)):
                # identical neighbourhoods give identical moves: a run of equal layers is priced once
                key = (s.kinds[pos], s.choice[pos], s.choice[pos - 1] if pos else -1,
                       s.choice[pos + 1] if pos + 1 < len(s.choice) else -1)
                if key in tried:
                    continue
                tried.add(key)
                cands, t_new, u_new = _moves(s, pos, limit)
                for c, t, u in zip(cands, t_new, u_new, strict=True):
                    times[i], steps[i] = float(t), float(u)
                    v = pipe(times, steps)
                    if v < value * (1 - 1e-12) and (best is None or v < best[0]):
                        best = (v, i, pos, int(c))
                times[i], steps[i] = s.time_s, s.step_s
        if best is None:
            break
        _, i, pos, c = best
        state[i].choice[pos] = c
        state[i].total()
        value = pipe([s.time_s for s in state], [s.step_s for s in state])
    return [s.choice for s in state], value
