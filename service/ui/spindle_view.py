"""What the Spindle plan page shows: a devices × time Gantt chart of the slices, and the baselines.

Colours: each task gets a hue family and each module (metaop) of that task its own shade, so a glance
shows which task occupies which devices and a tooltip names the module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.ui import format as fmt
from service.ui.charts import Chart, bars
from service.ui.request_info import as_map, cluster_size
from service.ui.svg import Svg, text_colour, time_axis
from solvers.documents import SpindleResult
from solvers.documents.spindle import SliceDoc

# Per task a family of shades (dark to light) from one hue.
TASK_SHADES = (
    ("#08519c", "#3182bd", "#6baed6", "#9ecae1"), ("#a63603", "#e6550d", "#fd8d3c", "#fdae6b"),
    ("#006d2c", "#31a354", "#74c476", "#a1d99b"), ("#54278f", "#756bb1", "#9e9ac8", "#bcbddc"),
    ("#a50f15", "#de2d26", "#fb6a4a", "#fc9272"), ("#252525", "#636363", "#969696", "#bdbdbd"),
    ("#7a0177", "#c51b8a", "#f768a1", "#fbb4b9"), ("#8c6d31", "#bd9e39", "#e7ba52", "#e7cb94"),
)


LABEL_PX_PER_CHAR = 6.0  # a 10 px sans-serif character is about this wide: label a block only if it fits


@dataclass
class SpindleView:
    iteration_time_s: float
    lower_bound_s: float
    num_devices: int
    gantt_svg: str | None = None
    legend: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)  # task -> (metaop, colour)
    baselines: list[tuple[str, float, float | None]] = field(default_factory=list)
    baseline_chart: Chart | None = None
    slices: int = 0
    breakdown: list[tuple[str, float]] = field(default_factory=list)
    memory_chart: Chart | None = None
    memory_absent: str | None = None  # why there is no memory chart
    layouts: list[tuple[str, str, str]] = field(default_factory=list)  # (metaop, devices, hybrid layout)
    given_layer_times: list[str] = field(default_factory=list)  # metaops priced by the request's layer time


EXPLICIT_MEMORY = ("No memory estimate: every metaop of this workload gives an explicit time_ms_per_layer and no "
                   "module shape, so the time model is the whole cost (the reference planner's setting) and there "
                   "is nothing to size memory from. Give the metaops a module shape to have memory, activation "
                   "transfers and gradient sync estimated.")


def slice_keys(request: Mapping[str, Any], slices: Sequence[SliceDoc]) -> dict[str, tuple[str, str]]:
    """metaop name -> (task, module). Slices name them when the solver knows; else the request's workload
    gives the task and the metaop stands for its own module."""
    workload = as_map(request.get("workload"))
    keys: dict[str, tuple[str, str]] = {}
    for op in workload.get("metaops") or []:
        if isinstance(op, Mapping) and "name" in op:
            name = str(op["name"])
            module = as_map(op.get("module")).get("name") or name
            keys[name] = (str(op.get("task") or name), str(module))
    for sl in slices:
        task, module = keys.get(sl.metaop, (sl.metaop, sl.metaop))
        keys[sl.metaop] = (sl.task or task, sl.module or module)
    return keys


def colours(keys: Mapping[str, tuple[str, str]]) -> tuple[dict[str, str], list[tuple[str, list[tuple[str, str]]]]]:
    """Fill per metaop: a shade family per task, one shade per module within it; and the legend."""
    modules_by_task: dict[str, set[str]] = {}
    for task, module in keys.values():
        modules_by_task.setdefault(task, set()).add(module)
    shade: dict[tuple[str, str], str] = {}
    legend = []
    for t, (task, modules) in enumerate(sorted(modules_by_task.items())):
        family = TASK_SHADES[t % len(TASK_SHADES)]
        entries = []
        for k, module in enumerate(sorted(modules)):
            shade[(task, module)] = family[k % len(family)]
            entries.append((module, shade[(task, module)]))
        legend.append((task, entries))
    return {name: shade[key] for name, key in keys.items()}, legend


def gantt_svg(slices: Sequence[SliceDoc], devices: int, span_s: float, fills: Mapping[str, str],
              keys: Mapping[str, tuple[str, str]]) -> str:
    left, top, row_h, width = 64.0, 6.0, max(8.0, min(22.0, 480.0 / max(devices, 1))), 1000.0
    svg = Svg(left + width + 30, top + row_h * devices + 26, "Gantt chart: devices by time")
    scale = width / span_s if span_s > 0 else 0.0
    for d in range(devices):
        if devices <= 32 or d % max(1, devices // 32) == 0:
            svg.text(left - 6, top + d * row_h + row_h * 0.7, f"dev {d}", size=min(11, row_h * 0.8), anchor="end")
    for sl in slices:
        start, end, devs = sl.start_s, sl.end_s, sorted(sl.devices)
        if not devs:
            continue
        name = sl.metaop
        fill = fills.get(name, "#999")
        task, module = keys.get(name, (name, name))
        # An older document does not say where a slice's layers start: its default (0) would be a guess.
        first = sl.layer_start if "layer_start" in sl.model_fields_set else None
        span = f" {first}–{first + sl.layers - 1}" if first is not None else ""
        tip = (f"{name} (task {task}, module {module}): {sl.layers} layers{span} on devices "
               f"{devs[0]}–{devs[-1]} ({len(devs)}), {fmt.seconds(start)} → {fmt.seconds(end)}")
        if sl.layout is not None:
            tip += f", layout {sl.layout.label()}"
        if sl.transfer_wait_s:
            tip += f", waited {fmt.seconds(sl.transfer_wait_s)} for activations"
        # Contiguous device runs become one block each, so a slice on a device block is one shape.
        runs: list[list[int]] = [[devs[0], devs[0]]]
        for d in devs[1:]:
            if d == runs[-1][1] + 1:
                runs[-1][1] = d
            else:
                runs.append([d, d])
        x, w = left + start * scale, (end - start) * scale
        for a, b in runs:
            h = (b - a + 1) * row_h
            svg.rect(x, top + a * row_h, w, h - 1, fill, stroke="#fff", title=tip, data={"metaop": name})
            if w >= LABEL_PX_PER_CHAR * len(name) + 8 and h >= 12:
                svg.text(x + w / 2, top + a * row_h + h / 2 + 4, name, size=10, anchor="middle",
                         fill=text_colour(fill))
    time_axis(svg, left, width, top + row_h * devices + 2, span_s, fmt.seconds)
    return svg.render()


def num_devices(request: Mapping[str, Any], slices: Sequence[SliceDoc]) -> int:
    n = cluster_size(request)
    top = max((d + 1 for sl in slices for d in sl.devices), default=0)
    return max(n, top)


def build(request: Mapping[str, Any], result: SpindleResult) -> SpindleView:
    est, slices = result.estimate, result.slices
    it = est.iteration_time_s
    devices = num_devices(request, slices)
    view = SpindleView(it, result.lower_bound_s, devices, slices=len(slices),
                       given_layer_times=list(est.given_layer_times))
    keys = slice_keys(request, slices)
    fills, view.legend = colours(keys)
    span = max((s.end_s for s in slices), default=0.0)
    if slices and devices:
        view.gantt_svg = gantt_svg(slices, devices, span, fills, keys)
    for sl in sorted(slices, key=lambda x: x.start_s):
        if sl.layout is not None and sl.devices:
            view.layouts.append((sl.metaop, f"{min(sl.devices)}–{max(sl.devices)}", sl.layout.label()))
    if est.makespan_s is not None:
        view.breakdown.append(("schedule makespan", est.makespan_s))
    for module, secs in sorted(est.module_grad_sync_s.items()):
        if secs:
            view.breakdown.append((f"gradient sync {module} (total, partly hidden)", secs))
    if est.grad_sync_exposed_s is not None:
        view.breakdown.append(("gradient sync exposed", est.grad_sync_exposed_s))
    if not est.memory_estimated:
        view.memory_absent = EXPLICIT_MEMORY
    elif not est.memory_gib_per_device:
        view.memory_absent = "The result holds no per-device memory figures."
    if est.memory_gib_per_device:
        limit = est.memory_limit_gib
        view.memory_chart = bars("memory-chart", "Peak memory per device",
                                 [f"dev {d}" for d in range(len(est.memory_gib_per_device))], est.memory_gib_per_device,
                                 "peak memory (GiB)", "GiB", reference=limit,
                                 reference_label=f"limit {fmt.gib(limit)}" if limit is not None else "")
    for key, t in result.baselines.items():
        if t is not None:  # None: the baseline does not fit
            name = key.removesuffix("_s").replace("_", " ")
            view.baselines.append((name, t, t / it if it else None))
    lb = view.lower_bound_s
    view.baseline_chart = bars("baseline-chart", "Iteration time: plan vs baselines",
                               ["this plan", *(b[0] for b in view.baselines)], [it, *(b[1] for b in view.baselines)],
                               "iteration time (s)", "seconds", highlight=0, rest_label="baselines", reference=lb,
                               reference_label=f"lower bound {fmt.seconds(lb)}")
    return view
