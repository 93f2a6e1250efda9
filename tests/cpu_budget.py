"""CPU-time budgets that follow the machine's speed.

The same commit's 100,000-GPU plan took 3.0 s of CPU on one 2-core CI VM and 12-14 s on another, so a fixed
limit either fails on slow hosts or guards nothing on fast ones. A budget here is written in units of a fixed
reference workload (interpreted Python and small numpy calls, the mix the planner's search runs), timed once per
test session on the machine at hand: a test then fails on a blow-up of its own code, not on a slower host."""

from __future__ import annotations

import functools
import time

import numpy as np

# What the reference workload took (CPU seconds, best of five) on the VM where the planner's figures in
# bench/hybrid.py were taken (the 100,000-GPU plan in 3.0 s). Budgets scale by (this machine's time / it).
REFERENCE_CPU_S = 0.047


def _reference_workload() -> float:
    acc = 0.0
    table: dict[int, float] = {}
    for i in range(200_000):
        table[i % 97] = table.get(i % 97, 0.0) + i * 0.5
        acc += table[i % 97] % 7.0
    a = np.arange(64, dtype=float)
    for _ in range(10_000):
        a = np.minimum(a + 1.0, a[::-1] * 1.0001)
    return acc + float(a.sum())


@functools.cache
def machine_factor() -> float:
    """How many times slower than the reference VM this machine runs the workload (never below 1)."""
    best = float("inf")
    for _ in range(5):
        c0 = time.process_time()
        _reference_workload()
        best = min(best, time.process_time() - c0)
    return max(1.0, best / REFERENCE_CPU_S)


def cpu_budget(reference_s: float) -> float:
    """A CPU-time limit of `reference_s` on the reference VM, scaled to this machine."""
    return reference_s * machine_factor()
