"""Replay a pipeline schedule (GPipe or 1F1B) from per-stage times, for the timeline chart.

Each stage runs its forward and backward passes in the order its schedule fixes; an operation starts as
soon as its stage is free and its input is there (forward of micro-batch i on stage s needs stage s-1's
forward of i; backward of i on stage s needs stage s+1's backward of i and its own forward of i).
Point-to-point transfer time is left out: the plan's stage times already include it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Phase = Literal["F", "B"]


@dataclass(frozen=True, slots=True)
class Op:
    stage: int
    micro_batch: int
    phase: Phase
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    ops: tuple[Op, ...]
    makespan_s: float
    bubble_fraction: float  # idle share of stages × makespan
    schedule: str


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[Phase, int]]:
    """The order in which one stage runs its passes."""
    m = micro_batches
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    # 1F1B (PipeDream-flush): warm up with the forwards that fill the pipe below this stage, then
    # alternate one forward and one backward, then drain the remaining backwards.
    warmup = min(stages - stage - 1, m)
    order: list[tuple[Phase, int]] = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(m - warmup, m)]
    return order


def simulate(forward_s: Sequence[float], backward_s: Sequence[float], micro_batches: int,
             schedule: str = "1f1b") -> Timeline:
    """Earliest-start replay of the schedule; interleaved schedules are drawn as 1F1B."""
    p, m = len(forward_s), micro_batches
    if p == 0 or m <= 0 or len(backward_s) != p:
        return Timeline((), 0.0, 0.0, schedule)
    kind = "gpipe" if schedule == "gpipe" else "1f1b"
    orders = [stage_order(kind, s, p, m) for s in range(p)]
    done: dict[tuple[Phase, int, int], float] = {}
    cursor = [0] * p
    free = [0.0] * p
    ops: list[Op] = []
    remaining = 2 * p * m
    while remaining:
        progressed = False
        for s in range(p):
            # Run every operation of this stage whose input is ready; the loop over stages repeats until
            # all are placed (the orders are deadlock-free, so each sweep places at least one).
            while cursor[s] < len(orders[s]):
                phase, i = orders[s][cursor[s]]
                deps: list[tuple[Phase, int, int]] = []
                if phase == "F" and s > 0:
                    deps.append(("F", s - 1, i))
                if phase == "B":
                    deps.append(("F", s, i))
                    if s < p - 1:
                        deps.append(("B", s + 1, i))
                if any(d not in done for d in deps):
                    break
                start = max([free[s], *(done[d] for d in deps)])
                end = start + (forward_s[s] if phase == "F" else backward_s[s])
                done[(phase, s, i)] = end
                free[s] = end
                ops.append(Op(s, i, phase, start, end))
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - would mean a malformed order
            raise RuntimeError("pipeline schedule deadlocked")
    makespan = max(op.end_s for op in ops)
    busy = m * sum(f + b for f, b in zip(forward_s, backward_s, strict=True))
    bubble = 1.0 - busy / (p * makespan) if makespan > 0 else 0.0
    return Timeline(tuple(ops), makespan, bubble, kind)
