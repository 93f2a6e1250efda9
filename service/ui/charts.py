"""Chart.js configurations built on the server; the page only hands them to ``new Chart``.

Keeping the chart definitions here (not in page scripts) means one place decides colours, units and
legend labels, and tests can check them without a browser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.ui.svg import colour

# the one colour of a bar series without a highlight (and the highlighted bar), the others' grey, a reference line's
BAR = "#0072B2"
OTHER = "#9aa5b1"
REFERENCE = "#c00"


@dataclass(frozen=True)
class LegendItem:
    """One entry of a chart's HTML legend: the colour it is drawn in, as a bar (a box) or a line."""

    label: str
    colour: str
    shape: str = "bar"  # "bar" | "line"


@dataclass
class Chart:
    """A chart for the template: a canvas id, its Chart.js config, and the legend it shows (each entry in the
    colour its bars or line are drawn in)."""

    id: str
    config: dict[str, Any]
    title: str
    height_px: int = 260
    notes: list[str] = field(default_factory=list)
    legend: list[LegendItem] = field(default_factory=list)


def _with_references(config: dict[str, Any], lines: Sequence[tuple[float, str]], legend: list[LegendItem]) -> None:
    """Reference lines (a memory limit, a lower bound) drawn by the page's ``referenceLines`` plugin across the whole
    plot area: a line dataset ran only from the first category's centre to the last's, one category drew none. The
    value axis reaches each line, so none falls outside the plot."""
    if not lines:
        return
    options = config["options"]
    options.setdefault("plugins", {})["referenceLines"] = {
        "lines": [{"value": v, "label": label, "color": REFERENCE} for v, label in lines]}
    axis = options["scales"].setdefault("x" if options.get("indexAxis") == "y" else "y", {})
    axis["suggestedMax"] = max(v for v, _ in lines) * 1.05
    legend += [LegendItem(label, REFERENCE, "line") for _, label in lines]


def _axis(title: str, stacked: bool = False, log: bool = False) -> dict[str, Any]:
    axis: dict[str, Any] = {"title": {"display": True, "text": title}, "stacked": stacked}
    if log:
        axis["type"] = "logarithmic"
    else:
        axis["beginAtZero"] = True
    return axis


def stacked_bars(chart_id: str, title: str, categories: Sequence[str], series: Mapping[str, Sequence[float]],
                 unit: str, *, horizontal: bool = False, limit: float | None = None,
                 limit_label: str = "limit", colours: Mapping[str, str] | None = None) -> Chart:
    """Bars per category stacked by series (e.g. memory parts per stage), with an optional limit line."""
    datasets: list[dict[str, Any]] = []
    legend: list[LegendItem] = []
    for i, (name, values) in enumerate(series.items()):
        fill = (colours or {}).get(name, colour(i))
        datasets.append({"type": "bar", "label": name, "data": [round(float(v), 6) for v in values],
                         "backgroundColor": fill, "stack": "s"})
        legend.append(LegendItem(name, fill))
    value_axis = _axis(unit, stacked=True)
    cat_axis = {"stacked": True}
    scales = {"x": value_axis, "y": cat_axis} if horizontal else {"x": cat_axis, "y": value_axis}
    config = {
        "type": "bar",
        "data": {"labels": list(categories), "datasets": datasets},
        "options": {"indexAxis": "y" if horizontal else "x", "scales": scales, "animation": False,
                    "maintainAspectRatio": False, "plugins": {"tooltip": {"mode": "index"}}},
    }
    _with_references(config, [(limit, limit_label)] if limit is not None else [], legend)
    return Chart(chart_id, config, title, legend=legend)


def bars(chart_id: str, title: str, categories: Sequence[str], values: Sequence[float], label: str, unit: str,
         *, highlight: int | None = None, rest_label: str = "", reference: float | None = None,
         reference_label: str = "", log: bool = False) -> Chart:
    """One bar per category (e.g. step time of the plan and of each baseline), optional reference line. With
    ``highlight`` that bar is blue and the others grey, and the legend says which is which (``rest_label``)."""
    fills = [BAR if highlight is None or i == highlight else OTHER for i in range(len(values))]
    datasets: list[dict[str, Any]] = [{"type": "bar", "label": label, "data": [round(float(v), 6) for v in values],
                                       "backgroundColor": fills}]
    if highlight is None:
        legend = [LegendItem(label, BAR)]
    else:
        legend = [LegendItem(categories[highlight], BAR)]
        if len(values) > 1:
            legend.append(LegendItem(rest_label or label, OTHER))
    config = {
        "type": "bar",
        "data": {"labels": list(categories), "datasets": datasets},
        "options": {"scales": {"y": _axis(unit, log=log)}, "animation": False, "maintainAspectRatio": False},
    }
    _with_references(config, [(reference, reference_label)] if reference is not None else [], legend)
    return Chart(chart_id, config, title, legend=legend)


def lines(chart_id: str, title: str, x: Sequence[float], series: Mapping[str, Sequence[float]], x_title: str,
          unit: str) -> Chart:
    datasets = [{"label": name, "data": [round(float(v), 6) for v in ys], "borderColor": colour(i),
                 "backgroundColor": colour(i), "pointRadius": 0 if len(ys) > 50 else 2, "fill": False}
                for i, (name, ys) in enumerate(series.items())]
    legend = [LegendItem(name, colour(i), "line") for i, name in enumerate(series)]
    config = {
        "type": "line",
        "data": {"labels": list(x), "datasets": datasets},
        "options": {"scales": {"x": {"title": {"display": True, "text": x_title}}, "y": _axis(unit)},
                    "animation": False, "maintainAspectRatio": False},
    }
    return Chart(chart_id, config, title, legend=legend)


def scatter(chart_id: str, title: str, series: Mapping[str, Sequence[tuple[float, float]]], x_title: str,
            y_title: str, *, log_x: bool = False) -> Chart:
    """Points joined per series (e.g. a sizing front per GPU type: days against cost)."""
    datasets = [{"label": name, "data": [{"x": round(float(x), 6), "y": round(float(y), 6)} for x, y in points],
                 "borderColor": colour(i), "backgroundColor": colour(i), "showLine": True, "pointRadius": 3}
                for i, (name, points) in enumerate(series.items())]
    legend = [LegendItem(name, colour(i), "line") for i, name in enumerate(series)]
    x_axis: dict[str, Any] = {"title": {"display": True, "text": x_title}}
    if log_x:
        x_axis["type"] = "logarithmic"
    config = {
        "type": "scatter",
        "data": {"datasets": datasets},
        "options": {"scales": {"x": x_axis, "y": {"title": {"display": True, "text": y_title}}},
                    "animation": False, "maintainAspectRatio": False},
    }
    return Chart(chart_id, config, title, legend=legend)
