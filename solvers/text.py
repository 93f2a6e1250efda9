"""What every kind's summary (``solvers.<kind>.summary``) writes alike: durations, the plan against its lower
bound and against a baseline."""

from __future__ import annotations

from collections.abc import Sequence


def seconds(x: float | None) -> str:
    """A duration as a reader takes it in: milliseconds under a second, whole seconds past a hundred."""
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3g} s" if x < 100 else f"{x:.0f} s"


def within_bound(step: float, bound: float) -> list[str]:
    """The plan against the bound no plan beats (nothing where the plan has no time to compare)."""
    return [f"lower bound {seconds(bound)}: this plan is within {100 * (step / bound - 1):.2f}%"] if step else []


def baseline_line(name: str, t: float, step: float) -> str:
    """A baseline's time, with how much slower it is than the plan (``step``; 0: no gain to state)."""
    gain = f" (this plan {100 * (t / step - 1):+.1f}%)" if step else ""
    return f"  {name}: {seconds(t)}{gain}"


def device_span(devices: Sequence[int]) -> str:
    """A contiguous block of device (or rank) ids as ``devices 4-7`` (``device 3`` alone)."""
    if not devices:
        return "no device"
    lo, hi = min(devices), max(devices)
    return f"device {lo}" if lo == hi else f"devices {lo}-{hi}"


def capped(rows: list[str], limit: int, what: str) -> list[str]:
    """The first ``limit`` rows, and a line saying how many more the JSON has."""
    if len(rows) <= limit:
        return rows
    return [*rows[:limit], f"  ... and {len(rows) - limit} more {what} (--json)"]
