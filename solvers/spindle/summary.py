"""A Spindle schedule in a few lines of text: its iteration time, how far from the lower bound, and the
baseline schedules it is compared with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from solvers.documents.spindle import SpindleResult
from solvers.text import baseline_line, seconds, within_bound


def summarise(request: Mapping[str, Any], result: SpindleResult) -> list[str]:
    step = result.estimate.iteration_time_s
    lines = [f"spindle: step {seconds(step)}", *within_bound(step, result.lower_bound_s)]
    lines += ["baselines (same cost model):"] if result.baselines else []
    for key, t in result.baselines.items():
        name = key.removesuffix("_s").replace("_", " ")  # the keys are times: sequential_full_cluster_s, ...
        lines.append(baseline_line(name, t, step) if t is not None else f"  {name}: does not fit")
    return lines
