"""What the FlexSP plan page shows: per micro-batch SP groups over the ranks, sequence lengths, baselines."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.ui import format as fmt
from service.ui.charts import Chart, bars, stacked_bars
from service.ui.request_info import cluster_size
from service.ui.svg import Svg, colour, text_colour
from solvers.documents import FlexSPResult
from solvers.documents.flexsp import FlexSPBreakdown, MicroBatchDoc

MAX_TOOLTIP_LENGTHS = 40


@dataclass
class MicroBatchRow:
    index: int
    time_s: float
    groups: int
    sizes: list[int]  # SP degree of each group
    tokens: int
    sequences: int
    breakdown_s: dict[str, float]


@dataclass
class FlexspView:
    step_time_s: float
    lower_bound_s: float
    num_ranks: int
    num_sequences: int
    groups_svg: str | None = None
    sp_legend: list[tuple[str, str]] = field(default_factory=list)
    micro_batches: list[MicroBatchRow] = field(default_factory=list)
    histogram: Chart | None = None
    baseline_chart: Chart | None = None
    baselines: list[tuple[str, float, float | None]] = field(default_factory=list)  # name, step s, plan gain
    breakdown: list[tuple[str, float]] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)  # breakdown keys, for the per-micro-batch table


def _lengths(request: Mapping[str, Any]) -> list[int]:
    # the solver planned this request, so it passed FlexSPRequest's checks: a list of positive token counts
    lengths: list[int] = request["batch"]["sequence_lengths"]
    return lengths


def num_ranks(request: Mapping[str, Any], micro_batches: Sequence[MicroBatchDoc]) -> int:
    n = cluster_size(request)
    top = max((g.ranks[1] + 1 for mb in micro_batches for g in mb.groups), default=0)
    return max(n, top)


def _parts(breakdown: FlexSPBreakdown | None) -> dict[str, float]:
    if breakdown is None:
        return {}
    return {"compute": breakdown.compute, "alltoall": breakdown.alltoall, "fixed": breakdown.fixed}


def groups_svg(micro_batches: Sequence[MicroBatchDoc], lengths: Sequence[int], ranks: int,
               sp_colour: Mapping[int, str]) -> str:
    """One row per micro-batch; each SP group is a block over its contiguous ranks, labelled with its load."""
    left, top, row_h, width = 92.0, 18.0, 26.0, 1000.0
    svg = Svg(left + width + 10, top + row_h * len(micro_batches) + 8, "SP groups per micro-batch over the ranks")
    per_rank = width / max(ranks, 1)
    for r in range(0, ranks + 1, max(1, ranks // 16)):
        svg.text(left + r * per_rank, 12, str(r), size=9, anchor="middle")
    for i, mb in enumerate(micro_batches):
        y = top + i * row_h
        svg.text(left - 6, y + row_h * 0.62, f"µbatch {i} · {fmt.seconds(mb.time_s)}", size=10, anchor="end")
        for g in mb.groups:
            a, b = g.ranks
            seqs = g.sequences
            lens = [lengths[s] for s in seqs]
            sp = g.sp
            fill = sp_colour.get(sp, "#999")
            shown = ", ".join(str(x) for x in sorted(lens, reverse=True)[:MAX_TOOLTIP_LENGTHS])
            more = f" … (+{len(lens) - MAX_TOOLTIP_LENGTHS})" if len(lens) > MAX_TOOLTIP_LENGTHS else ""
            tip = (f"micro-batch {i}, SP{sp} on ranks {a}–{b}: {len(seqs)} sequences, {sum(lens):,} tokens"
                   + (f", {fmt.seconds(g.time_s)}" if g.time_s is not None else "")
                   + (f"; lengths {shown}{more}" if lens else ""))
            x, w = left + a * per_rank, (b - a + 1) * per_rank
            svg.rect(x, y, w, row_h - 4, fill, stroke="#fff", title=tip, data={"sp": str(sp)})
            if w >= 40:
                svg.text(x + w / 2, y + row_h * 0.6, f"SP{sp} · {len(seqs)} seq", size=9, anchor="middle",
                         fill=text_colour(fill))
    return svg.render()


def length_histogram(lengths: Sequence[int], sp_of_sequence: Mapping[int, int], degrees: Sequence[int],
                     sp_colour: Mapping[int, str]) -> Chart:
    """Sequence counts in power-of-two length bins, stacked by the SP degree the plan gave them."""
    top_bin = max(math.ceil(math.log2(max(max(lengths), 2))), 1)
    low_bin = max(math.floor(math.log2(max(min(lengths), 1))), 0)
    bins = list(range(low_bin, top_bin + 1))
    labels = [f"≤{fmt.number(2 ** b)}" for b in bins]
    series: dict[str, list[float]] = {f"SP{d}": [0.0] * len(bins) for d in degrees}
    series["unassigned"] = [0.0] * len(bins)
    for idx, length in enumerate(lengths):
        b = max(math.ceil(math.log2(max(length, 1))), low_bin) - low_bin
        sp = sp_of_sequence.get(idx)
        series[f"SP{sp}" if sp is not None else "unassigned"][b] += 1
    if not any(series["unassigned"]):
        del series["unassigned"]
    colours = {f"SP{d}": sp_colour[d] for d in degrees}
    chart = stacked_bars("length-histogram", "Sequence lengths (tokens), by assigned SP degree", labels, series,
                         "sequences", colours=colours)
    return chart


def build(request: Mapping[str, Any], result: FlexSPResult) -> FlexspView:
    mbs = result.micro_batches
    lengths = _lengths(request)
    ranks = num_ranks(request, mbs)
    step = result.estimate.step_time_s
    view = FlexspView(step, result.lower_bound_s, ranks, len(lengths))
    degrees = sorted({g.sp for mb in mbs for g in mb.groups})
    sp_colour = {d: colour(i) for i, d in enumerate(degrees)}
    view.sp_legend = [(f"SP{d}", sp_colour[d]) for d in degrees]
    view.breakdown = list(_parts(result.estimate.breakdown_s).items())
    view.parts = [k for k, _ in view.breakdown]
    sp_of: dict[int, int] = {}
    for i, mb in enumerate(mbs):
        tokens = sum(lengths[s] for g in mb.groups for s in g.sequences)
        view.micro_batches.append(MicroBatchRow(i, mb.time_s, len(mb.groups), [g.sp for g in mb.groups], tokens,
                                                sum(len(g.sequences) for g in mb.groups), _parts(mb.breakdown_s)))
        for g in mb.groups:
            for s in g.sequences:
                sp_of[s] = g.sp
    if mbs and ranks:
        view.groups_svg = groups_svg(mbs, lengths, ranks, sp_colour)
    if lengths:
        view.histogram = length_histogram(lengths, sp_of, degrees, sp_colour)

    best = result.baselines.best_static_sp
    for degree, t in sorted(result.baselines.static_sp.items(), key=lambda kv: int(kv[0])):
        star = " (best static)" if best is not None and degree == str(best) else ""
        view.baselines.append((f"static SP{degree}{star}", t, t / step if step else None))
    lb = view.lower_bound_s
    view.baseline_chart = bars("baseline-chart", "Step time: plan vs static SP degrees",
                               ["this plan", *(b[0] for b in view.baselines)], [step, *(b[1] for b in view.baselines)],
                               "step time (s)", "seconds", highlight=0, rest_label="static SP degrees", reference=lb,
                               reference_label=f"lower bound {fmt.seconds(lb)}")
    return view
