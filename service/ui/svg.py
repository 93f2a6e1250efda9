"""A minimal SVG writer for the server-rendered charts (layer strip, pipeline timeline, SP groups, Gantt).

Each shape may carry a ``title``: browsers show it as a tooltip, which is how every block in a chart
explains its own numbers. Output is a string of markup that templates insert with ``|safe``; all text
goes through ``html.escape`` here.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

# Colour-blind-friendly categorical palette (Okabe-Ito, then Tableau 10 for more categories).
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
    "#4E79A7", "#F28E2B", "#59A14F", "#B07AA1", "#76B7B2", "#EDC948", "#FF9DA7", "#9C755F", "#BAB0AC",
)


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def text_colour(fill: str) -> str:
    """Black or white, whichever reads better on ``fill`` (#rrggbb)."""
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#fff"


def _num(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


class Svg:
    """Collects shapes, renders one ``<svg>`` element scaled to its container's width."""

    def __init__(self, width: float, height: float, label: str, css_class: str = "chart-svg",
                 natural: bool = False) -> None:
        """``natural``: drawn at its own size (one unit a pixel), shrunk to fit a narrower container but never
        stretched to a wider one (a 4-layer strip filled 1000 px with 250-px cells)."""
        self.width, self.height, self.label, self.css_class = width, height, label, css_class
        self.natural = natural
        self._parts: list[str] = []

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: str | None = None,
             stroke: str | None = None, data: dict[str, str] | None = None) -> None:
        attrs = f'x="{_num(x)}" y="{_num(y)}" width="{_num(max(w, 0.0))}" height="{_num(h)}" fill="{fill}"'
        if stroke:
            attrs += f' stroke="{stroke}" stroke-width="0.5"'
        for k, v in (data or {}).items():
            attrs += f' data-{k}="{escape(v)}"'
        if title:
            self._parts.append(f"<rect {attrs}><title>{escape(title)}</title></rect>")
        else:
            self._parts.append(f"<rect {attrs}/>")

    def text(self, x: float, y: float, content: str, size: float = 11, anchor: str = "start",
             fill: str = "#222", bold: bool = False) -> None:
        weight = ' font-weight="bold"' if bold else ""
        self._parts.append(
            f'<text x="{_num(x)}" y="{_num(y)}" font-size="{_num(size)}" text-anchor="{anchor}" fill="{fill}"'
            f'{weight}>{escape(content)}</text>'
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#888", dash: bool = False,
             width: float = 1.0) -> None:
        style = ' stroke-dasharray="4 3"' if dash else ""
        self._parts.append(
            f'<line x1="{_num(x1)}" y1="{_num(y1)}" x2="{_num(x2)}" y2="{_num(y2)}" stroke="{stroke}"'
            f' stroke-width="{_num(width)}"{style}/>'
        )

    def render(self) -> str:
        body = "".join(self._parts)
        size = (f'width="{_num(self.width)}" height="{_num(self.height)}" style="max-width: 100%; height: auto"'
                if self.natural else 'width="100%"')
        return (
            f'<svg class="{self.css_class}" viewBox="0 0 {_num(self.width)} {_num(self.height)}" '
            f'{size} preserveAspectRatio="xMinYMin meet" role="img" aria-label="{escape(self.label)}" '
            f'xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif">{body}</svg>'
        )


def time_axis(svg: Svg, x0: float, width: float, y: float, span_s: float, fmt: Callable[[float], str],
              ticks: int = 6) -> None:
    """Tick marks and labels for a horizontal time axis of ``span_s`` seconds starting at x0."""
    if span_s <= 0:
        return
    svg.line(x0, y, x0 + width, y, stroke="#444")
    for i in range(ticks + 1):
        x = x0 + width * i / ticks
        svg.line(x, y, x, y + 4, stroke="#444")
        svg.text(x, y + 15, fmt(span_s * i / ticks), size=10, anchor="middle")
