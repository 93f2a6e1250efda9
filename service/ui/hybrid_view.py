"""What the hybrid plan page shows, computed from the plan's request and result documents.

Everything here tolerates missing optional fields (older solvers, partial results): a section without
its data is left out of the page rather than breaking it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.ui import format as fmt
from service.ui.charts import Chart, bars, stacked_bars
from service.ui.pipeline_schedule import Timeline, simulate
from service.ui.request_info import as_map
from service.ui.svg import Svg, colour, text_colour, time_axis

# Order and colours of the parts, so that every chart and table of the page agrees.
MEMORY_PARTS = ("parameters", "gradients", "optimizer", "activations", "buffers", "transient", "reserve", "other")
TIME_PARTS = ("compute", "recompute", "tp_comm", "sp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm_exposed",
              "zero_comm", "optimizer", "launch_overhead", "pp_bubble", "other")
STRIP_ROWS = (("tp", "TP"), ("sp", "SP"), ("cp", "CP"), ("dp", "DP"), ("zero", "ZeRO"), ("recompute", "Recompute"),
              ("ep", "EP"))
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
    breakdown_s: Mapping[str, Any] | None = None


@dataclass
class HybridView:
    summary: dict[str, Any]
    strip_svg: str | None = None
    strip_legend: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    memory_chart: Chart | None = None
    memory_limit_gib: float | None = None
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


def _ordered(keys: Sequence[str], preferred: Sequence[str]) -> list[str]:
    return [k for k in preferred if k in keys] + sorted(k for k in keys if k not in preferred)


def memory_limit_gib(request: Mapping[str, Any]) -> float | None:
    """The per-GPU limit the planner worked under: the constraint if given, never above the GPU's memory."""
    constraints = request.get("constraints") or {}
    limit = fmt.as_float(constraints.get("memory_limit_gib")) if isinstance(constraints, Mapping) else None
    try:
        from solvers.specs import ClusterSpec

        have = float(ClusterSpec.model_validate(request.get("cluster")).gpu.memory_gib)
    except Exception:  # an unparsable cluster only costs the limit line
        return limit
    return have if limit is None else min(limit, have)


# What fits in a narrow strip cell; the legend and tooltips carry the full words.
CELL_TEXT = {"megatron": "M", "ulysses": "U", "off": "–", "none": "–", "selective": "sel", "full": "full"}


def _value_label(key: str, value: Any) -> str:
    if key == "sp":
        return "off" if value in (None, "none") else str(value)
    if key == "recompute":
        return str(value or "none")
    return str(value)


def layer_strip(layers: Sequence[Mapping[str, Any]], stage_layers: Sequence[int]
                ) -> tuple[str, list[tuple[str, list[tuple[str, str]]]]]:
    """One column per layer, one row per strategy dimension, coloured by value, stages outlined."""
    n = len(layers)
    rows = [(k, label) for k, label in STRIP_ROWS
            if k != "ep" or any(int(layer.get("ep", 1) or 1) > 1 for layer in layers)]
    left, top, row_h = 74.0, 18.0, 18.0
    cell = max(3.0, min(28.0, 1000.0 / max(n, 1)))
    width = left + cell * n + 8
    svg = Svg(width, top + row_h * len(rows) + 22, "per-layer strategy strip")
    legends: list[tuple[str, list[tuple[str, str]]]] = []
    for r, (key, label) in enumerate(rows):
        default = 1 if key in ("tp", "dp", "cp", "ep") else (0 if key == "zero" else None)
        values = [_value_label(key, layer.get(key, default)) for layer in layers]
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
        svg.text((x0 + x1) / 2, 12, f"stage {s} · layers {start}–{start + count - 1}", size=10, anchor="middle")
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


def _pipeline_timeline(strategy: Mapping[str, Any], stage_times: Sequence[float]) -> tuple[Timeline, str, str]:
    p = len(stage_times)
    m = int(strategy.get("micro_batches") or 1)
    schedule = str(strategy.get("schedule") or "1f1b")
    v = int(strategy.get("virtual_stages") or 1) if schedule == "interleaved" else 1
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


def _estimate_of(entry: Any) -> Mapping[str, Any] | None:
    if not isinstance(entry, Mapping):
        return None
    est = entry.get("estimate", entry)
    return est if isinstance(est, Mapping) else None


def _strategy_text(entry: Mapping[str, Any]) -> str:
    strat = entry.get("strategy")
    if not isinstance(strat, Mapping):
        return str(entry.get("description", ""))
    if isinstance(strat.get("layers"), list) and strat["layers"]:
        layer = strat["layers"][0]
        strat = {**layer, "pp": strat.get("pp"), "micro_batches": strat.get("micro_batches")}
    keys = ("tp", "pp", "dp", "cp", "sp", "zero", "recompute", "micro_batch_size", "micro_batches")
    return ", ".join(f"{k}={strat[k]}" for k in keys if strat.get(k) is not None)


BASELINE_NAMES = {"megatron": "Best Megatron-style uniform 3D", "zero3": "ZeRO-3 data parallel",
                  "zero3_dp": "ZeRO-3 data parallel", "dp": "Pure data parallel", "pure_dp": "Pure data parallel"}


def baselines(result: Mapping[str, Any], plan_throughput: float | None) -> list[Baseline]:
    raw = result.get("baselines")
    if not isinstance(raw, Mapping):
        return []
    out: list[Baseline] = []
    for key, entry in raw.items():
        est = _estimate_of(entry)
        name = BASELINE_NAMES.get(str(key), str(key).replace("_", " "))
        fits = not (isinstance(entry, Mapping) and entry.get("fits") is False)
        if est is None or fmt.as_float(est.get("step_time_s")) is None or not fits:
            info = as_map(entry)
            reason = info.get("note") or info.get("reason") or info.get("error")
            out.append(Baseline(name, "", None, None, None, None, None, str(reason or "infeasible")))
            continue
        thr = fmt.as_float(est.get("throughput_samples_per_s"))
        gain = plan_throughput / thr if plan_throughput and thr else None
        breakdown = est.get("breakdown_s") if isinstance(est.get("breakdown_s"), Mapping) else None
        bound = fmt.as_float(as_map(entry).get("gain_bound"))
        beyond = as_map(entry).get("outside_constraints")
        out.append(Baseline(name, _strategy_text(entry) if isinstance(entry, Mapping) else "",
                            fmt.as_float(est.get("step_time_s")), thr, fmt.as_float(est.get("mfu")),
                            fmt.as_float(est.get("peak_memory_gib")), gain, breakdown_s=breakdown,
                            gain_bound=None if bound is None else 1.0 + bound,
                            note="outside this request's constraints: " + "; ".join(map(str, beyond))
                            if isinstance(beyond, list) and beyond else ""))
    return out


def _stages(strategy: Mapping[str, Any], estimate: Mapping[str, Any]) -> list[Stage]:
    stage_layers = [int(x) for x in strategy.get("stage_layers") or []]
    times = estimate.get("stage_time_s") or []
    mems = estimate.get("memory_gib_per_stage") or []
    parts = estimate.get("memory_breakdown_gib_per_stage") or []
    out, first = [], 0
    for s, count in enumerate(stage_layers):
        out.append(Stage(s, first, first + count - 1,
                         fmt.as_float(times[s]) if s < len(times) else None,
                         fmt.as_float(mems[s]) if s < len(mems) else None,
                         dict(parts[s]) if s < len(parts) and isinstance(parts[s], Mapping) else {}))
        first += count
    return out


def build(request: Mapping[str, Any], result: Mapping[str, Any]) -> HybridView:
    estimate, strategy = as_map(result.get("estimate")), as_map(result.get("strategy"))
    layers = [x for x in strategy.get("layers") or [] if isinstance(x, Mapping)]
    view = HybridView(summary=dict(estimate))
    view.memory_limit_gib = memory_limit_gib(request)
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

    plan_thr = fmt.as_float(estimate.get("throughput_samples_per_s"))
    view.baselines = baselines(result, plan_thr)
    search = as_map(result.get("search"))
    bound, gap = fmt.as_float(search.get("lower_bound_step_time_s")), fmt.as_float(search.get("optimality_gap"))
    if bound is not None and gap is not None:
        view.certificate = (bound, gap)
    breakdown = estimate.get("breakdown_s")
    if isinstance(breakdown, Mapping) and breakdown:
        rows: dict[str, Mapping[str, Any]] = {"this plan": breakdown}
        for b in view.baselines:
            if b.breakdown_s:
                rows[b.name] = b.breakdown_s
        nonzero = {k for r in rows.values() for k, v in r.items() if fmt.as_float(v)}
        keys = _ordered(sorted(nonzero), TIME_PARTS)
        series = {k: [fmt.as_float(r.get(k)) or 0.0 for r in rows.values()] for k in keys}
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

    feasible = [b for b in view.baselines if b.throughput]
    if plan_thr and feasible:
        view.baseline_chart = bars("baseline-chart", "Throughput: plan vs baselines",
                                   ["this plan", *(b.name for b in feasible)],
                                   [plan_thr, *(b.throughput or 0.0 for b in feasible)],
                                   "samples/s", "samples/s", highlight=0)
    return view
