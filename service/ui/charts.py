"""Chart.js configurations built on the server; the page only hands them to ``new Chart``.

Keeping the chart definitions here (not in page scripts) means one place decides colours, units and
legend labels, and tests can check them without a browser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.ui.svg import colour


@dataclass
class Chart:
    """A chart for the template: a canvas id, its Chart.js config, and the legend labels it will show."""

    id: str
    config: dict[str, Any]
    title: str
    height_px: int = 260
    notes: list[str] = field(default_factory=list)

    @property
    def legend(self) -> list[str]:
        return [str(d["label"]) for d in self.config["data"]["datasets"]]


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
    for i, (name, values) in enumerate(series.items()):
        datasets.append({"type": "bar", "label": name, "data": [round(float(v), 6) for v in values],
                         "backgroundColor": (colours or {}).get(name, colour(i)), "stack": "s"})
    if limit is not None:
        datasets.append({"type": "line", "label": limit_label, "data": [limit] * len(categories),
                         "borderColor": "#c00", "borderDash": [6, 4], "pointRadius": 0, "fill": False,
                         "borderWidth": 2})
    value_axis = _axis(unit, stacked=True)
    cat_axis = {"stacked": True}
    scales = {"x": value_axis, "y": cat_axis} if horizontal else {"x": cat_axis, "y": value_axis}
    config = {
        "type": "bar",
        "data": {"labels": list(categories), "datasets": datasets},
        "options": {"indexAxis": "y" if horizontal else "x", "scales": scales, "animation": False,
                    "maintainAspectRatio": False, "plugins": {"tooltip": {"mode": "index"}}},
    }
    return Chart(chart_id, config, title)


def bars(chart_id: str, title: str, categories: Sequence[str], values: Sequence[float], label: str, unit: str,
         *, highlight: int | None = None, reference: float | None = None, reference_label: str = "",
         log: bool = False) -> Chart:
    """One bar per category (e.g. step time of the plan and of each baseline), optional reference line."""
    fills = ["#0072B2" if i == highlight else "#9aa5b1" for i in range(len(values))]
    datasets: list[dict[str, Any]] = [{"type": "bar", "label": label, "data": [round(float(v), 6) for v in values],
                                       "backgroundColor": fills}]
    if reference is not None:
        datasets.append({"type": "line", "label": reference_label, "data": [reference] * len(categories),
                         "borderColor": "#c00", "borderDash": [6, 4], "pointRadius": 0, "fill": False})
    config = {
        "type": "bar",
        "data": {"labels": list(categories), "datasets": datasets},
        "options": {"scales": {"y": _axis(unit, log=log)}, "animation": False, "maintainAspectRatio": False},
    }
    return Chart(chart_id, config, title)


def lines(chart_id: str, title: str, x: Sequence[float], series: Mapping[str, Sequence[float]], x_title: str,
          unit: str) -> Chart:
    datasets = [{"label": name, "data": [round(float(v), 6) for v in ys], "borderColor": colour(i),
                 "backgroundColor": colour(i), "pointRadius": 0 if len(ys) > 50 else 2, "fill": False}
                for i, (name, ys) in enumerate(series.items())]
    config = {
        "type": "line",
        "data": {"labels": list(x), "datasets": datasets},
        "options": {"scales": {"x": {"title": {"display": True, "text": x_title}}, "y": _axis(unit)},
                    "animation": False, "maintainAspectRatio": False},
    }
    return Chart(chart_id, config, title)
