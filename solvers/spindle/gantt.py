"""A Gantt picture of a Spindle plan: devices down, time across, one box per slice coloured by task and
labelled by metaop; pure Python SVG so the dashboard and docs can embed it as is."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape

# Tableau-like palette: distinguishable, readable under white text.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#1f77b4", "#d62728")
_ROW = 18
_LEFT = 64
_TOP = 28
_CHAR_PX = 6.2  # width of a character at font-size 11, to decide whether a label fits


def _ticks(span: float, count: int = 8) -> list[float]:
    """Round tick positions (1, 2, 2.5, 5 x 10^k) covering [0, span]."""
    if span <= 0:
        return [0.0]
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(u * mag for u in (1, 2, 2.5, 5, 10) if u * mag >= raw)
    return [k * step for k in range(int(span / step + 1e-9) + 1)]


def gantt_svg(result: Mapping[str, Any], width: int = 960, title: str | None = None) -> str:
    """SVG of ``result["slices"]`` (a Spindle result); rows are devices, boxes span contiguous device blocks."""
    slices: Sequence[Mapping[str, Any]] = result.get("slices", [])
    devices = 1 + max((max(s["devices"]) for s in slices if s.get("devices")), default=0)
    end = max((float(s["end_s"]) for s in slices), default=0.0)
    span = float(result.get("estimate", {}).get("iteration_time_s", end)) or end or 1.0
    tasks = list(dict.fromkeys(str(s.get("task", s["metaop"])) for s in slices))
    colour = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(tasks)}
    plot_w = width - _LEFT - 16
    legend_rows = (len(tasks) + 3) // 4
    height = _TOP + devices * _ROW + 40 + legend_rows * 18

    def x(t: float) -> float:
        return _LEFT + plot_w * t / span

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             '<rect width="100%" height="100%" fill="white"/>']
    head = title or (f"iteration {span:.4g} s, lower bound {float(result.get('lower_bound_s', 0)):.4g} s, "
                     f"{len(slices)} slices on {devices} devices")
    parts.append(f'<text x="{_LEFT}" y="16" font-size="12" font-weight="bold">{escape(head)}</text>')
    for d in range(devices):
        y = _TOP + d * _ROW
        if d % 2:
            parts.append(f'<rect x="{_LEFT}" y="{y}" width="{plot_w}" height="{_ROW}" fill="#f4f4f4"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{y + _ROW - 5}" text-anchor="end">gpu {d}</text>')
    axis_y = _TOP + devices * _ROW
    for t in _ticks(span):
        parts.append(f'<line x1="{x(t):.1f}" y1="{_TOP}" x2="{x(t):.1f}" y2="{axis_y + 4}" stroke="#ccc"/>')
        parts.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" text-anchor="middle">{t:.4g}s</text>')
    for s in slices:
        devs = s["devices"]
        x0, x1 = x(float(s["start_s"])), x(float(s["end_s"]))
        y0 = _TOP + min(devs) * _ROW + 1
        h = len(devs) * _ROW - 2
        task = str(s.get("task", s["metaop"]))
        tip = (f"{s['metaop']} ({task}): {s['layers']} layers on gpu {min(devs)}-{max(devs)}, "
               f"{float(s['start_s']):.4g}-{float(s['end_s']):.4g} s")
        parts.append(f'<g><title>{escape(tip)}</title><rect x="{x0:.2f}" y="{y0}" width="{max(x1 - x0, 0.5):.2f}" '
                     f'height="{h}" fill="{colour[task]}" stroke="white" stroke-width="0.8"/>')
        label = str(s.get("module") or s["metaop"])
        if (x1 - x0) > _CHAR_PX * len(label) + 4:
            parts.append(f'<text x="{(x0 + x1) / 2:.2f}" y="{y0 + h / 2 + 4:.1f}" fill="white" '
                         f'text-anchor="middle">{escape(label)}</text>')
        parts.append("</g>")
    for i, task in enumerate(tasks):
        lx = _LEFT + (i % 4) * (plot_w / 4)
        ly = axis_y + 30 + (i // 4) * 18
        parts.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="12" height="12" fill="{colour[task]}"/>')
        parts.append(f'<text x="{lx + 16:.1f}" y="{ly}">{escape(task)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
