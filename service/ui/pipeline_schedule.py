"""Replay a pipeline schedule (GPipe, 1F1B or interleaved 1F1B) from per-stage times, for the timeline chart.

Each stage runs its forward and backward passes in the order its schedule fixes; an operation starts as
soon as its stage is free and its input is there. A pass is (phase, model chunk, micro-batch); without
interleaving every stage holds one chunk. Forward of chunk c on stage s needs the forward of the same
chunk on stage s-1 (or, on stage 0, of chunk c-1 on the last stage); backward runs the chain the other way
and also needs the pass's own forward. Point-to-point transfer time is left out: the plan's stage times
already include it. With v chunks a chunk's pass takes 1/v of the stage's time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Phase = Literal["F", "B"]
Pass = tuple[Phase, int, int]  # (phase, chunk, micro-batch)


@dataclass(frozen=True, slots=True)
class Op:
    stage: int
    micro_batch: int
    phase: Phase
    start_s: float
    end_s: float
    chunk: int = 0


@dataclass(frozen=True)
class Timeline:
    ops: tuple[Op, ...]
    makespan_s: float
    bubble_fraction: float  # idle share of stages × makespan
    schedule: str
    virtual_stages: int = 1


def _one_f_one_b(warmup: int, forwards: Sequence[Pass], backwards: Sequence[Pass]) -> list[Pass]:
    """Warm up with ``warmup`` forwards, then alternate one forward and one backward, then drain."""
    order = list(forwards[:warmup])
    steady = len(forwards) - warmup
    for j in range(steady):
        order += [forwards[warmup + j], backwards[j]]
    return order + list(backwards[steady:])


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int, chunks: int = 1) -> list[Pass]:
    """The order in which one stage runs its passes."""
    p, m, v = stages, micro_batches, chunks
    if schedule == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if v == 1:
        # 1F1B (PipeDream-flush): the warm-up fills the pipe below this stage.
        fwd: list[Pass] = [("F", 0, i) for i in range(m)]
        bwd: list[Pass] = [("B", 0, i) for i in range(m)]
        return _one_f_one_b(min(p - stage - 1, m), fwd, bwd)
    # Megatron's interleaved 1F1B: virtual micro-batch k is micro-batch (k // pv)·p + k % p of chunk
    # (k // p) % v going forward, and of the mirrored chunk going backward.
    total = m * v
    fwd = [("F", (k // p) % v, (k // (p * v)) * p + k % p) for k in range(total)]
    bwd = [("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p) for k in range(total)]
    warmup = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)
    return _one_f_one_b(warmup, fwd, bwd)


def _inputs(phase: Phase, stage: int, chunk: int, mb: int, stages: int, chunks: int) -> list[tuple[int, Pass]]:
    """The (stage, pass) entries a pass waits for."""
    if phase == "F":
        if stage > 0:
            return [(stage - 1, ("F", chunk, mb))]
        return [(stages - 1, ("F", chunk - 1, mb))] if chunk > 0 else []
    deps: list[tuple[int, Pass]] = [(stage, ("F", chunk, mb))]
    if stage < stages - 1:
        deps.append((stage + 1, ("B", chunk, mb)))
    elif chunk < chunks - 1:
        deps.append((0, ("B", chunk + 1, mb)))
    return deps


def simulate(forward_s: Sequence[float], backward_s: Sequence[float], micro_batches: int,
             schedule: str = "1f1b", virtual_stages: int = 1) -> Timeline:
    """Earliest-start replay of the schedule. Interleaving needs micro-batches in multiples of the stage
    count (as in Megatron); otherwise the plan is replayed as plain 1F1B."""
    p, m = len(forward_s), micro_batches
    if p == 0 or m <= 0 or len(backward_s) != p:
        return Timeline((), 0.0, 0.0, schedule)
    kind = schedule if schedule in ("gpipe", "1f1b") else "1f1b"
    v = 1
    if schedule == "interleaved" and virtual_stages > 1 and p > 1 and m % p == 0:
        kind, v = "interleaved", virtual_stages
    orders = [stage_order(kind, s, p, m, v) for s in range(p)]
    done: dict[tuple[int, Pass], float] = {}
    cursor = [0] * p
    free = [0.0] * p
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            # Run every pass of this stage whose inputs are ready; the sweep over stages repeats until all
            # are placed (the orders are deadlock-free, so each sweep places at least one).
            while cursor[s] < len(orders[s]):
                phase, chunk, mb = orders[s][cursor[s]]
                deps = _inputs(phase, s, chunk, mb, p, v)
                if any(d not in done for d in deps):
                    break
                start = max([free[s], *(done[d] for d in deps)])
                end = start + (forward_s[s] if phase == "F" else backward_s[s]) / v
                done[(s, (phase, chunk, mb))] = end
                free[s] = end
                ops.append(Op(s, mb, phase, start, end, chunk))
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - would mean a malformed order
            raise RuntimeError("pipeline schedule deadlocked")
    makespan = max(op.end_s for op in ops)
    busy = m * sum(f + b for f, b in zip(forward_s, backward_s, strict=True))
    # Clamp float round-off (a single stage has no bubble, not "-0.0%").
    bubble = max(0.0, 1.0 - busy / (p * makespan)) if makespan > 0 else 0.0
    return Timeline(tuple(ops), makespan, bubble, kind, v)
