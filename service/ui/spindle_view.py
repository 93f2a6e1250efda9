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
from service.ui.request_info import cluster_size
from service.ui.svg import Svg, text_colour, time_axis

# Per task a family of shades (dark to light) from one hue.
TASK_SHADES = (
    ("#08519c", "#3182bd", "#6baed6", "#9ecae1"), ("#a63603", "#e6550d", "#fd8d3c", "#fdae6b"),
    ("#006d2c", "#31a354", "#74c476", "#a1d99b"), ("#54278f", "#756bb1", "#9e9ac8", "#bcbddc"),
    ("#a50f15", "#de2d26", "#fb6a4a", "#fc9272"), ("#252525", "#636363", "#969696", "#bdbdbd"),
    ("#7a0177", "#c51b8a", "#f768a1", "#fbb4b9"), ("#8c6d31", "#bd9e39", "#e7ba52", "#e7cb94"),
)


@dataclass
class SpindleView:
    iteration_time_s: float | None
    lower_bound_s: float | None
    num_devices: int
    gantt_svg: str | None = None
    legend: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)  # task -> (metaop, colour)
    baselines: list[tuple[str, float, float | None]] = field(default_factory=list)
    baseline_chart: Chart | None = None
    slices: int = 0


def metaop_tasks(request: Mapping[str, Any], slices: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """metaop name -> task, from the request's workload (a metaop without a task is its own task)."""
    workload = request.get("workload") if isinstance(request.get("workload"), Mapping) else {}
    assert isinstance(workload, Mapping)
    tasks: dict[str, str] = {}
    for op in workload.get("metaops") or []:
        if isinstance(op, Mapping) and "name" in op:
            tasks[str(op["name"])] = str(op.get("task") or op["name"])
    for sl in slices:
        name = str(sl.get("metaop"))
        tasks.setdefault(name, str(sl.get("task") or name))
    return tasks


def colours(tasks: Mapping[str, str]) -> tuple[dict[str, str], list[tuple[str, list[tuple[str, str]]]]]:
    by_task: dict[str, list[str]] = {}
    for metaop, task in tasks.items():
        by_task.setdefault(task, []).append(metaop)
    fills: dict[str, str] = {}
    legend = []
    for t, (task, ops) in enumerate(sorted(by_task.items())):
        shades = TASK_SHADES[t % len(TASK_SHADES)]
        entries = []
        for k, op in enumerate(sorted(ops)):
            fills[op] = shades[k % len(shades)]
            entries.append((op, fills[op]))
        legend.append((task, entries))
    return fills, legend


def gantt_svg(slices: Sequence[Mapping[str, Any]], devices: int, span_s: float, fills: Mapping[str, str],
              tasks: Mapping[str, str]) -> str:
    left, top, row_h, width = 64.0, 6.0, max(8.0, min(22.0, 480.0 / max(devices, 1))), 1000.0
    svg = Svg(left + width + 10, top + row_h * devices + 26, "Gantt chart: devices by time")
    scale = width / span_s if span_s > 0 else 0.0
    for d in range(devices):
        if devices <= 32 or d % max(1, devices // 32) == 0:
            svg.text(left - 6, top + d * row_h + row_h * 0.7, f"dev {d}", size=min(11, row_h * 0.8), anchor="end")
    for sl in slices:
        start, end = fmt.as_float(sl.get("start_s")), fmt.as_float(sl.get("end_s"))
        devs = sorted(int(x) for x in sl.get("devices") or [])
        if start is None or end is None or not devs:
            continue
        name = str(sl.get("metaop"))
        fill = fills.get(name, "#999")
        tip = (f"{name} (task {tasks.get(name, name)}): {sl.get('layers', '?')} layers on devices "
               f"{devs[0]}–{devs[-1]} ({len(devs)}), {fmt.seconds(start)} → {fmt.seconds(end)}")
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
            if w >= 50 and h >= 12:
                svg.text(x + w / 2, top + a * row_h + h / 2 + 4, name, size=10, anchor="middle",
                         fill=text_colour(fill))
    time_axis(svg, left, width, top + row_h * devices + 2, span_s, fmt.seconds)
    return svg.render()


def num_devices(request: Mapping[str, Any], slices: Sequence[Mapping[str, Any]]) -> int:
    n = cluster_size(request)
    top = max((int(d) + 1 for sl in slices for d in sl.get("devices") or []), default=0)
    return max(n, top)


def build(request: Mapping[str, Any], result: Mapping[str, Any]) -> SpindleView:
    est = result.get("estimate") if isinstance(result.get("estimate"), Mapping) else {}
    assert isinstance(est, Mapping)
    slices = [s for s in result.get("slices") or [] if isinstance(s, Mapping)]
    it = fmt.as_float(est.get("iteration_time_s"))
    devices = num_devices(request, slices)
    view = SpindleView(it, fmt.as_float(result.get("lower_bound_s")), devices, slices=len(slices))
    tasks = metaop_tasks(request, slices)
    fills, view.legend = colours(tasks)
    span = max((fmt.as_float(s.get("end_s")) or 0.0 for s in slices), default=0.0)
    if slices and devices:
        view.gantt_svg = gantt_svg(slices, devices, span, fills, tasks)
    raw = result.get("baselines") if isinstance(result.get("baselines"), Mapping) else {}
    assert isinstance(raw, Mapping)
    for key, value in raw.items():
        t = fmt.as_float(value)
        if t is not None:
            name = str(key).removesuffix("_s").replace("_", " ")
            view.baselines.append((name, t, t / it if it else None))
    if it is not None and (view.baselines or view.lower_bound_s is not None):
        lb = view.lower_bound_s
        view.baseline_chart = bars("baseline-chart", "Iteration time: plan vs baselines",
                                   ["this plan", *(b[0] for b in view.baselines)],
                                   [it, *(b[1] for b in view.baselines)], "iteration time (s)", "seconds",
                                   highlight=0, reference=lb,
                                   reference_label=f"lower bound {fmt.seconds(lb)}" if lb is not None else "")
    return view
