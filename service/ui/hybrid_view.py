"""What the hybrid plan page shows, computed from the plan's request and its result document.

A section whose data the document lacks (an older plan: the optional fields) is left out of the page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.ui import format as fmt
from service.ui.charts import Chart, bars, scatter, stacked_bars
from service.ui.pipeline_schedule import Timeline, simulate
from service.ui.svg import Svg, colour, text_colour, time_axis
from solvers.documents import BASELINE_NAMES, BaselineName, HybridResult
from solvers.documents.hybrid import (
    BaselineDoc,
    EmbeddingDoc,
    FrontPoint,
    HybridEstimate,
    LayerDoc,
    StagePlacement,
    StrategyDoc,
)
from solvers.errors import SpecError
from solvers.request import HybridRequest, parse
from solvers.specs import memory_limit_bytes

# Order and colours of the parts, so that every chart and table of the page agrees.
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers", "transient", "reserve", "other")
TIME_PARTS = ("compute", "recompute", "tp_comm", "sp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm_exposed",
              "zero_comm", "optimizer", "launch_overhead", "pp_bubble", "other")
# The strip's rows: a layer's decisions, each as its cell reads.
STRIP_ROWS: tuple[tuple[str, Callable[[LayerDoc], str]], ...] = (
    ("TP", lambda layer: str(layer.tp)), ("SP", lambda layer: layer.sp or "off"), ("CP", lambda layer: str(layer.cp)),
    ("DP", lambda layer: str(layer.dp)), ("ZeRO", lambda layer: str(layer.zero)),
    ("Recompute", lambda layer: layer.recompute), ("EP", lambda layer: str(layer.ep)))
# Backward ≈ 2× forward for a transformer layer (two GEMMs per forward GEMM); the timeline splits each
# stage's per-micro-batch time in that ratio because plans report fwd+bwd together.
BACKWARD_SHARE = 2.0 / 3.0
MAX_TIMELINE_OPS = 3000


@dataclass
class Stage:
    index: int
    first_layer: int
    last_layer: int
    time_s: float | None
    memory_gib: float | None
    memory_parts: dict[str, float]


@dataclass
class Baseline:
    name: str
    description: str
    step_time_s: float | None
    throughput: float | None
    mfu: float | None
    peak_memory_gib: float | None
    gain: float | None  # the plan's throughput / this baseline's
    note: str = ""
    gain_bound: float | None = None  # the most any plan of the space could gain: its step / the certified bound
    breakdown_s: dict[str, float] = field(default_factory=dict)


@dataclass
class HybridView:
    summary: HybridEstimate
    memory_limit_gib: float | None
    # None where the document does not state it (an older plan): its defaults would describe a choice
    # nobody made
    embedding: EmbeddingDoc | None = None
    strip_svg: str | None = None
    strip_legend: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    memory_chart: Chart | None = None
    time_chart: Chart | None = None
    # Time per part for the plan and each baseline with a breakdown: where the plan wins or loses.
    breakdown_columns: list[str] = field(default_factory=list)
    breakdown_rows: list[tuple[str, list[float]]] = field(default_factory=list)
    timeline_svg: str | None = None
    timeline: Timeline | None = None
    timeline_note: str = ""
    timeline_legend: list[tuple[str, str]] = field(default_factory=list)
    baselines: list[Baseline] = field(default_factory=list)
    # (step time no plan of the space beats, this plan's distance from it): the search's certificate
    certificate: tuple[float, float] | None = None
    baseline_chart: Chart | None = None
    # a cluster of groups: where each stage runs (its limit is its GPUs': no one limit line on the memory chart)
    placement: list[StagePlacement] = field(default_factory=list)
    hetero_baselines: list[tuple[str, BaselineDoc]] = field(default_factory=list)
    # a sizing request: the front, and the chart of days against cost per GPU type
    front: list[FrontPoint] = field(default_factory=list)
    cheapest_in_deadline: int | None = None
    front_chart: Chart | None = None


def _ordered(keys: Sequence[str], preferred: Sequence[str]) -> list[str]:
    return [k for k in preferred if k in keys] + sorted(k for k in keys if k not in preferred)


def memory_limit_gib(request: dict[str, Any]) -> float | None:
    """The per-GPU limit the planner worked under: the constraint if given, never above the GPU's memory. None
    where the stored request no longer parses (say, a GPU preset removed since): the page then shows the plan
    without the limit line rather than failing."""
    try:
        parsed: HybridRequest = parse(HybridRequest, request)
    except SpecError:
        return None
    return memory_limit_bytes(parsed.cluster, parsed.constraints) / 2**30


# What fits in a narrow strip cell; the legend and tooltips carry the full words.
CELL_TEXT = {"megatron": "M", "ulysses": "U", "off": "–", "none": "–", "selective": "sel", "full": "full"}


def layer_strip(layers: Sequence[LayerDoc], stage_layers: Sequence[int]
                ) -> tuple[str, list[tuple[str, list[tuple[str, str]]]]]:
    """One column per layer, one row per strategy dimension, coloured by value, stages outlined."""
    n = len(layers)
    rows = [(label, value) for label, value in STRIP_ROWS if label != "EP" or any(layer.ep > 1 for layer in layers)]
    left, top, row_h = 74.0, 18.0, 18.0
    cell = max(3.0, min(28.0, 1000.0 / max(n, 1)))
    width = left + cell * n + 8
    svg = Svg(width, top + row_h * len(rows) + 22, "per-layer strategy strip", natural=True)
    legends: list[tuple[str, list[tuple[str, str]]]] = []
    for r, (label, value) in enumerate(rows):
        values = [value(layer) for layer in layers]
        distinct = sorted(set(values), key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v))
        palette = {v: colour(i) for i, v in enumerate(distinct)}
        y = top + r * row_h
        svg.text(left - 6, y + row_h * 0.7, label, anchor="end", bold=True)
        for i, v in enumerate(values):
            svg.rect(left + i * cell, y, cell, row_h - 2, palette[v], title=f"layer {i}: {label} = {v}")
            if cell >= 18:
                svg.text(left + (i + 0.5) * cell, y + row_h * 0.68, CELL_TEXT.get(v, v[:4]), size=9, anchor="middle",
                         fill=text_colour(palette[v]))
        legends.append((label, [(f"{label} {v}", palette[v]) for v in distinct]))
    bottom = top + row_h * len(rows)
    start = 0
    for s, count in enumerate(stage_layers):
        x0, x1 = left + start * cell, left + (start + count) * cell
        svg.line(x0, 2, x0, bottom, stroke="#111", width=1.5)
        label = f"stage {s} · layers {start}–{start + count - 1}"
        if x1 - x0 < 5.0 * len(label):  # (10-px text is about 5 px a character: a narrow stage keeps what fits)
            label = f"stage {s}" if x1 - x0 >= 40 else str(s)
        svg.text((x0 + x1) / 2, 12, label, size=10, anchor="middle")
        start += count
    svg.line(left + start * cell, 2, left + start * cell, bottom, stroke="#111", width=1.5)
    for i in range(0, n, max(1, n // 16)):
        svg.text(left + (i + 0.5) * cell, bottom + 14, str(i), size=9, anchor="middle")
    return svg.render(), legends


# Forward light, backward dark; with interleaving, alternate chunks alternate between two shades of each.
PHASE_SHADES = {"F": ("#56B4E9", "#a6d8f5"), "B": ("#0072B2", "#00446b")}


def timeline_legend(tl: Timeline) -> list[tuple[str, str]]:
    if tl.virtual_stages == 1:
        return [("forward", PHASE_SHADES["F"][0]), ("backward", PHASE_SHADES["B"][0])]
    return [(f"{name} chunk {'even' if k == 0 else 'odd'}", PHASE_SHADES[ph][k])
            for ph, name in (("F", "forward"), ("B", "backward")) for k in (0, 1)]


def timeline_svg(tl: Timeline, stages: int, micro_batches_drawn: int) -> str:
    left, top, row_h, width = 64.0, 6.0, 22.0, 1000.0
    svg = Svg(left + width + 30, top + row_h * stages + 26, f"{tl.schedule} pipeline timeline")
    scale = width / tl.makespan_s if tl.makespan_s > 0 else 0.0
    for s in range(stages):
        svg.text(left - 6, top + s * row_h + row_h * 0.65, f"stage {s}", anchor="end")
    for op in tl.ops:
        fill = PHASE_SHADES[op.phase][op.chunk % 2]
        name = "forward" if op.phase == "F" else "backward"
        chunk = f" (chunk {op.chunk}, virtual stage {op.chunk * stages + op.stage})" if tl.virtual_stages > 1 else ""
        x, w = left + op.start_s * scale, (op.end_s - op.start_s) * scale
        y = top + op.stage * row_h
        svg.rect(x, y, w, row_h - 3, fill, stroke="#fff",
                 title=f"stage {op.stage}{chunk}, micro-batch {op.micro_batch} {name}: "
                       f"{fmt.seconds(op.start_s)} → {fmt.seconds(op.end_s)}",
                 data={"phase": op.phase})
        if w >= 14 and micro_batches_drawn <= 99:
            svg.text(x + w / 2, y + row_h * 0.62, str(op.micro_batch), size=9, anchor="middle",
                     fill=text_colour(fill))
    time_axis(svg, left, width, top + row_h * stages + 2, tl.makespan_s, fmt.seconds)
    return svg.render()


def _pipeline_timeline(strategy: StrategyDoc, stage_times: Sequence[float]) -> tuple[Timeline, str, str]:
    p = len(stage_times)
    m = strategy.micro_batches
    schedule = strategy.schedule
    v = strategy.virtual_stages if schedule == "interleaved" else 1
    drawn = m
    note = ""
    if 2 * p * m * v > MAX_TIMELINE_OPS:
        # Keep a multiple of the stage count so that an interleaved schedule stays interleaved.
        drawn = max(p, MAX_TIMELINE_OPS // (2 * p * v) // p * p) if v > 1 else max(1, MAX_TIMELINE_OPS // (2 * p))
        drawn = min(drawn, m)
        note = f"First {drawn} of {m} micro-batches drawn (the steady state repeats). "
    fwd = [t * (1 - BACKWARD_SHARE) for t in stage_times]
    bwd = [t * BACKWARD_SHARE for t in stage_times]
    tl = simulate(fwd, bwd, drawn, schedule, v)
    if schedule == "interleaved" and tl.schedule != "interleaved":
        note += f"Interleaving needs micro-batches in multiples of {p} stages: drawn as plain 1F1B. "
    elif tl.virtual_stages > 1:
        note += f"{v} model chunks per stage: each pass takes 1/{v} of the stage time. "
    return tl, timeline_svg(tl, p, drawn), note


def _strategy_text(strategy: StrategyDoc) -> str:
    """A uniform recipe in one line: its layers all share the first one's strategy."""
    layer = strategy.layers[0] if strategy.layers else LayerDoc()
    parts = (("tp", layer.tp), ("pp", strategy.pp), ("dp", layer.dp), ("cp", layer.cp), ("sp", layer.sp),
             ("zero", layer.zero), ("recompute", layer.recompute), ("micro_batches", strategy.micro_batches))
    return ", ".join(f"{k}={v}" for k, v in parts if v is not None)


BASELINE_LABELS: dict[BaselineName, str] = {"megatron": "Best Megatron-style uniform 3D",
                                             "zero3_dp": "ZeRO-3 data parallel", "pure_dp": "Pure data parallel"}


def baselines(result: HybridResult) -> list[Baseline]:
    plan_throughput = result.estimate.throughput_samples_per_s
    out: list[Baseline] = []
    for key in BASELINE_NAMES:
        if key not in result.baselines:
            continue
        entry, name = result.baselines[key], BASELINE_LABELS[key]
        if entry is None or not entry.fits or entry.estimate is None:
            note = entry.note if entry is not None else None
            out.append(Baseline(name, "", None, None, None, None, None, note or "infeasible"))
            continue
        est = entry.estimate
        thr = est.throughput_samples_per_s
        gain = plan_throughput / thr if plan_throughput and thr else None
        beyond = entry.outside_constraints
        out.append(Baseline(name, _strategy_text(entry.strategy) if entry.strategy is not None else "",
                            est.step_time_s, thr, est.mfu, est.peak_memory_gib, gain, breakdown_s=est.breakdown_s,
                            gain_bound=None if entry.gain_bound is None else 1.0 + entry.gain_bound,
                            note="outside this request's constraints: " + "; ".join(beyond) if beyond else ""))
    return out


def _stages(strategy: StrategyDoc, estimate: HybridEstimate) -> list[Stage]:
    times, mems = estimate.stage_time_s, estimate.memory_gib_per_stage
    parts = estimate.memory_breakdown_gib_per_stage
    out, first = [], 0
    for s, count in enumerate(strategy.stage_layers):
        out.append(Stage(s, first, first + count - 1, times[s] if s < len(times) else None,
                         mems[s] if s < len(mems) else None, parts[s] if s < len(parts) else {}))
        first += count
    return out


def _mixed_cluster(view: HybridView, result: HybridResult) -> None:
    if result.hetero is None:
        return
    view.placement = result.hetero.placement
    view.hetero_baselines = [(name, b) for name, b in result.hetero.baselines.items() if b is not None]


def _sizing(view: HybridView, result: HybridResult) -> None:
    if not result.front or result.sizing is None:
        return
    view.front, view.cheapest_in_deadline = result.front, result.sizing.cheapest_in_deadline
    series: dict[str, list[tuple[float, float]]] = {}
    for p in result.front:
        series.setdefault(str(p.cluster["gpu"]), []).append((p.days, p.cost))
    view.front_chart = scatter("front-chart", "Sizing front: days to train against cost (estimates)", series,
                               "days", "cost", log_x=True)


def build(request: dict[str, Any], result: HybridResult) -> HybridView:
    estimate, strategy = result.estimate, result.strategy
    layers = strategy.layers
    mixed = result.hetero is not None  # each stage has its own GPUs' limit: the table states them
    view = HybridView(summary=estimate, memory_limit_gib=None if mixed else memory_limit_gib(request),
                      embedding=strategy.embedding if strategy.embedding.model_fields_set else None)
    view.stages = _stages(strategy, estimate)

    stage_layers = [st.last_layer - st.first_layer + 1 for st in view.stages]
    if layers and sum(stage_layers) == len(layers):
        view.strip_svg, view.strip_legend = layer_strip(layers, stage_layers)
    elif layers:
        view.strip_svg, view.strip_legend = layer_strip(layers, [len(layers)])

    if view.stages and any(st.memory_parts for st in view.stages):
        keys = _ordered(sorted({k for st in view.stages for k in st.memory_parts}), MEMORY_PARTS)
        series = {k: [st.memory_parts.get(k, 0.0) for st in view.stages] for k in keys}
        limit_label = f"limit {fmt.gib(view.memory_limit_gib)}"
        view.memory_chart = stacked_bars("memory-chart", "Memory per GPU by pipeline stage",
                                         [f"stage {st.index}" for st in view.stages], series, "GiB",
                                         limit=view.memory_limit_gib, limit_label=limit_label)

    plan_thr = estimate.throughput_samples_per_s
    view.baselines = baselines(result)
    bound, gap = result.search.lower_bound_step_time_s, result.search.optimality_gap
    if bound is not None and gap is not None:
        view.certificate = (bound, gap)
    if estimate.breakdown_s:
        rows: dict[str, dict[str, float]] = {"this plan": estimate.breakdown_s}
        for b in view.baselines:
            if b.breakdown_s:
                rows[b.name] = b.breakdown_s
        nonzero = {k for r in rows.values() for k, v in r.items() if v}
        keys = _ordered(sorted(nonzero), TIME_PARTS)
        series = {k: [r.get(k, 0.0) for r in rows.values()] for k in keys}
        view.breakdown_columns = list(rows)
        view.breakdown_rows = list(series.items())
        view.time_chart = stacked_bars("time-chart", "Step time breakdown", list(rows), series, "seconds per step",
                                       horizontal=True)
        view.time_chart.height_px = 90 + 40 * len(rows)

    stage_times = [st.time_s for st in view.stages]
    if view.stages and all(t is not None and t > 0 for t in stage_times):
        view.timeline, view.timeline_svg, view.timeline_note = _pipeline_timeline(
            strategy, [float(t) for t in stage_times if t is not None])
        view.timeline_legend = timeline_legend(view.timeline)

    _mixed_cluster(view, result)
    _sizing(view, result)
    feasible = [b for b in view.baselines if b.throughput]
    if plan_thr and feasible:
        view.baseline_chart = bars("baseline-chart", "Throughput: plan vs baselines",
                                   ["this plan", *(b.name for b in feasible)],
                                   [plan_thr, *(b.throughput or 0.0 for b in feasible)],
                                   "samples/s", "samples/s", highlight=0, rest_label="baselines")
    return view
