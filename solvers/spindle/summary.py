"""A Spindle schedule in a few lines of text: its iteration time, how far from the lower bound, the schedule
itself (which layers of which metaop run on which devices, when), and the baseline schedules it is compared
with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from solvers.documents.spindle import ExactReport, SliceDoc, SpindleResult
from solvers.text import baseline_line, capped, device_span, seconds, within_bound

MAX_SLICES_SHOWN = 40  # (a 64-GPU seedance plan has a few hundred; --json has them all)


def schedule_lines(slices: Sequence[SliceDoc]) -> list[str]:
    """One line per slice in start order: its devices, metaop, layers and time span."""
    ordered = sorted(slices, key=lambda s: (s.start_s, min(s.devices, default=0)))
    width = max((len(s.metaop) for s in ordered), default=0)
    rows = []
    for s in ordered:
        layers = f"layer {s.layer_start}" if s.layers == 1 else f"layers {s.layer_start}-{s.layer_start + s.layers - 1}"
        layout = f"  [{s.layout.label()}]" if s.layout is not None else ""
        rows.append(f"  {device_span(s.devices):>12}  {s.metaop:<{width}}  {layers:<14} "
                    f"{seconds(s.start_s)} -> {seconds(s.end_s)}{layout}")
    return capped(rows, MAX_SLICES_SHOWN, "slices")


_STOPPED = {"solved": "proved optimal", "deterministic_limit": "stopped at its deterministic budget",
            "wall_clock": "stopped by the wall clock (a rerun may differ)"}


def exact_line(ex: ExactReport) -> str:
    """The CP-SAT run: how it ended, its makespan against its bound (the time model's), and its gap."""
    gap = f", gap {100 * ex.model_gap:.2f}%" if ex.model_gap is not None else ""
    found = (f"; model makespan {seconds(ex.model_makespan_s)}, bound {seconds(ex.model_bound_s)}{gap}"
             if ex.model_makespan_s is not None else "; no solution")
    return (f"exact (CP-SAT, {ex.workers} worker{'s' if ex.workers != 1 else ''}, seed {ex.seed}): {ex.status}, "
            f"{_STOPPED[ex.stopped_by]} ({ex.deterministic_time:.3g} of {ex.deterministic_time_limit:.3g} "
            f"deterministic units, {ex.wall_s:.1f} s){found}")


def summarise(request: Mapping[str, Any], result: SpindleResult) -> list[str]:
    step = result.estimate.iteration_time_s
    lines = [f"spindle: step {seconds(step)}", *within_bound(step, result.lower_bound_s)]
    est = result.estimate
    if est.peak_memory_gib is not None:
        limit = f" (limit {est.memory_limit_gib:.1f})" if est.memory_limit_gib is not None else ""
        lines.append(f"peak memory {est.peak_memory_gib:.1f} GiB per device{limit}")
    elif not est.memory_estimated:
        lines.append("memory not estimated: explicit per-layer times, no module shapes")
    for module, move in est.weight_reshard.items():
        lines.append(f"weight reshard of {module} into the generation layout: {seconds(move.time_s)} "
                     f"({move.colocation}, up to {move.max_gib_per_device:.2f} GiB per generation device)")
    if result.search.exact is not None:
        lines.append(exact_line(result.search.exact))
    if not result.search.reproducible:
        lines.append("not reproducible: a wall-clock limit ended a search, or CP-SAT ran several workers")
    waves = len({s.wave for s in result.slices})
    lines.append(f"schedule ({len(result.slices)} slices in {waves} wave{'s' if waves != 1 else ''}; devices, "
                 "metaop, layers, start -> end, [hybrid layout] where not plain data parallelism):")
    lines += schedule_lines(result.slices)
    lines += ["baselines (same cost model):"] if result.baselines else []
    for key, t in result.baselines.items():
        name = key.removesuffix("_s").replace("_", " ")  # the keys are times: sequential_full_cluster_s, ...
        lines.append(baseline_line(name, t, step) if t is not None else f"  {name}: does not fit")
    return lines
