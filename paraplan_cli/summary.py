"""The terminal's reading of a plan result: what to run, what it costs and why (``--json`` gives it all).

Plain text, one concept per block: the plan, the headline numbers, where the step goes, the memory per
stage, the baselines with the plan's gain, and the search's certificate. Fields the result lacks are left
out, so older stored results still print.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _f(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def seconds(x: Any) -> str:
    v = _f(x)
    if v is None:
        return "-"
    return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.3g} s" if v < 100 else f"{v:.0f} s"


def _layer_text(layer: Mapping[str, Any]) -> str:
    parts = [f"tp{layer.get('tp', 1)}"]
    if layer.get("sp"):
        parts.append(f"sp={layer['sp']}")
    parts += [f"cp{layer.get('cp', 1)}", f"dp{layer.get('dp', 1)}", f"zero{layer.get('zero', 0)}"]
    if layer.get("recompute", "none") != "none":
        parts.append(f"recompute={layer['recompute']}")
    if (layer.get("ep") or 1) > 1:
        parts.append(f"ep{layer['ep']}")
    return " ".join(parts)


def layer_runs(layers: Sequence[Mapping[str, Any]]) -> list[str]:
    """Consecutive layers with one strategy as one line (stage sizes are on the plan's own line)."""
    out: list[str] = []
    first = 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or _layer_text(layers[i]) != _layer_text(layers[first]):
            span = f"layer {first}" if i - first == 1 else f"layers {first}-{i - 1}"
            out.append(f"  {span:<14} {_layer_text(layers[first])}")
            first = i
    return out


def _breakdown(parts: Mapping[str, Any], total: float) -> str:
    items = sorted(((k, v) for k, v in parts.items() if (_f(v) or 0) > 0), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {seconds(v)} ({100 * v / total:.1f}%)" for k, v in items)


def _micro_batches(strategy: Mapping[str, Any]) -> str:
    n = strategy.get("micro_batches")
    return f"{n} micro-batch" + ("" if n == 1 else "es")


def hybrid(request: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    est, strat, search = (result.get(k) or {} for k in ("estimate", "strategy", "search"))
    layers, stage_layers = strat.get("layers") or [], strat.get("stage_layers") or []
    sched = strat.get("schedule", "1f1b") + (f", {strat['virtual_stages']} chunks per GPU"
                                             if (strat.get("virtual_stages") or 1) > 1 else "")
    out = [f"plan: pp={strat.get('pp')}, {_micro_batches(strat)} ({sched}), "
           f"stages {list(stage_layers)}"]
    out += layer_runs(layers)
    if strat.get("embedding"):
        out.append(f"  embedding/LM head: {_layer_text(strat['embedding'])}")
    step = _f(est.get("step_time_s")) or 0.0
    limit = _f((request.get("constraints") or {}).get("memory_limit_gib"))
    out.append(f"step {seconds(step)} · {est.get('throughput_samples_per_s') or 0:.3g} samples/s · "
               f"{est.get('tokens_per_s') or 0:,.0f} tokens/s · MFU {100 * (est.get('mfu') or 0):.1f}% · "
               f"peak {est.get('peak_memory_gib') or 0:.1f} GiB per GPU"
               + (f" (limit {limit:.1f})" if limit else ""))
    if step and isinstance(est.get("breakdown_s"), Mapping):
        out.append("time per step: " + _breakdown(est["breakdown_s"], step))
    out += _memory(est.get("memory_breakdown_gib_per_stage") or [])
    out += _baselines(result.get("baselines") or {}, step, est.get("breakdown_s"))
    bound, gap = _f(search.get("lower_bound_step_time_s")), _f(search.get("optimality_gap"))
    if bound is not None and gap is not None:
        out.append(f"certificate: no plan of the search space runs a step under {seconds(bound)}; "
                   f"this plan is within {100 * gap:.2f}% of that")
    cpu = _f(search.get("cpu_s"))
    if cpu is not None:
        by_cert = search.get("configs_solved_by_certificate") or 0
        late = (f" ({by_cert} of them by the certificate: the search's ordering had passed them by)"
                if by_cert else "")
        out.append(f"search: {cpu:.2f} s CPU, {search.get('configs_solved')} of {search.get('configs_total')} "
                   f"pipeline configurations solved{late}, the rest bounded out")
    out += [f"note: {n}" for n in est.get("notes") or []]
    return out


def _memory(stages: Sequence[Mapping[str, Any]], show: int = 4) -> list[str]:
    """Memory per stage with its parts; deep pipelines show the fullest stage and the others' range."""
    totals = [sum(v for v in parts.values() if _f(v)) for parts in stages]

    def line(s: int) -> str:
        items = ", ".join(f"{k} {v:.1f}" for k, v in stages[s].items() if (_f(v) or 0) > 0)
        return f"memory, stage {s}: {totals[s]:.1f} GiB = {items}"

    if len(stages) <= show:
        return [line(s) for s in range(len(stages))]
    peak = max(range(len(stages)), key=lambda s: totals[s])
    rest = [t for s, t in enumerate(totals) if s != peak]
    return [line(peak) + " (the fullest stage)",
            f"memory, the other {len(rest)} stages: {min(rest):.1f}-{max(rest):.1f} GiB (--json for each)"]


def _baselines(raw: Mapping[str, Any], step: float, plan_breakdown: Any = None) -> list[str]:
    out = ["baselines (same cost model):"] if raw else []
    for name, entry in raw.items():
        entry = entry or {}
        base_step = _f((entry.get("estimate") or {}).get("step_time_s"))
        if not entry.get("fits") or base_step is None:
            out.append(f"  {name:<10} {entry.get('note') or 'does not fit'}")
            continue
        bound = _f(entry.get("gain_bound"))
        out.append(f"  {name:<10} step {seconds(base_step)}: this plan {100 * (base_step / step - 1):+.1f}%"
                   + (f" (any plan at most {100 * bound:+.1f}%)" if bound is not None else "")
                   + _uniform_text(entry.get("strategy") or {}))
        beyond = entry.get("outside_constraints")
        if isinstance(beyond, list) and beyond:
            out.append(f"{'':13}outside this request's constraints: {'; '.join(map(str, beyond))}")
        out += _against(entry["estimate"].get("breakdown_s"), plan_breakdown, step)
    return out


def _against(base: Any, plan: Any, step: float, show: int = 4) -> list[str]:
    """Where the plan's step differs from a baseline's, part by part: the gain's why (the largest parts, those
    of at least 0.5% of the step)."""
    if not isinstance(base, Mapping) or not isinstance(plan, Mapping) or not step:
        return []
    diff = {k: (_f(base.get(k)) or 0.0) - (_f(plan.get(k)) or 0.0) for k in dict.fromkeys([*base, *plan])}
    big = sorted((kv for kv in diff.items() if abs(kv[1]) >= 0.005 * step), key=lambda kv: -abs(kv[1]))[:show]
    saves = ", ".join(f"{k} {seconds(d)}" for k, d in big if d > 0)
    spends = ", ".join(f"{seconds(-d)} more on {k}" for k, d in big if d < 0)
    said = "; ".join(x for x in (saves and f"saves {saves}", spends and f"spends {spends}") if x)
    return [f"{'':13}against it, this plan {said}"] if said else []


def _uniform_text(strategy: Mapping[str, Any]) -> str:
    """A uniform plan in a few words: its layers' layout (the MoE layers' where they differ), pp, schedule."""
    layers = [_layer_text(x) for x in strategy.get("layers") or []]
    if not layers:
        return ""
    layout = max(set(layers), key=lambda t: ("ep" in t, layers.count(t)))
    v = strategy.get("virtual_stages") or 1
    sched = strategy.get("schedule", "1f1b") + (f" v{v}" if v > 1 else "")
    return f"; {layout}, pp{strategy.get('pp')}, {_micro_batches(strategy)}, {sched}"


def render_estimate(request: Mapping[str, Any], estimate: Mapping[str, Any]) -> str:
    """Text for an estimate of a given strategy (what-if): the hybrid blocks that apply, and whether it fits."""
    lines = hybrid(request, {"estimate": estimate, "strategy": estimate.get("strategy") or {}})
    if estimate.get("fits") is False:
        lines.insert(0, "DOES NOT FIT in the memory limit (see the notes)")
    return "\n".join([*lines, "(the whole estimate: --json)"])


def render(request: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    """Text for a solved request; kinds other than hybrid get their headline and lower bound."""
    if request.get("kind", "hybrid") == "hybrid":
        from solvers.exports import FORMATS

        lines = [*hybrid(request, result),
                 f"(to launch it: --export {', '.join(FORMATS[:-1])} or {FORMATS[-1]}; each says what it changes; "
                 "--export-of megatron for the best uniform plan)"]
    else:
        est = result.get("estimate") or {}
        step = _f(est.get("step_time_s")) or _f(est.get("iteration_time_s"))
        lines = [f"{request.get('kind')}: step {seconds(step)}"]
        bound = _f(result.get("lower_bound_s"))
        if bound is not None and step:
            lines.append(f"lower bound {seconds(bound)}: this plan is within {100 * (step / bound - 1):.2f}%")
        lines += _other_baselines(result.get("baselines") or {}, step or 0.0)
    return "\n".join([*lines, "(the whole result: --json)"])


def _other_baselines(raw: Mapping[str, Any], step: float) -> list[str]:
    """FlexSP's static SP degrees ({degree: seconds}) and Spindle's ``*_s`` schedules, with the plan's gain."""
    def line(name: str, t: float) -> str:
        gain = f" (this plan {100 * (t / step - 1):+.1f}%)" if step else ""
        return f"  {name}: {seconds(t)}{gain}"

    out = ["baselines (same cost model):"] if raw else []
    for key, value in raw.items():
        if isinstance(value, Mapping):
            out += [line(f"{key.replace('_', ' ')} {k}", float(v)) for k, v in value.items() if _f(v) is not None]
        elif key.endswith("_s") and _f(value) is not None:
            out.append(line(key[:-2].replace("_", " "), float(value)))
        else:
            out.append(f"  {key.replace('_', ' ')}: {value}")
    return out
