"""A hybrid plan in a few lines of text: what to run, what it costs and why.

One concept per block: the plan, the headline numbers, where the step goes, the memory per stage, the
baselines with the plan's gain, and the search's certificate. Search fields a result stored before they
existed are ``None``; their lines are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from solvers.documents.hybrid import (
    BaselineDoc,
    BaselineName,
    EmbeddingDoc,
    FrontPoint,
    HeteroBaselineName,
    HeteroDoc,
    HybridEstimate,
    HybridEstimateResult,
    HybridResult,
    HybridSearch,
    LayerDoc,
    SizingDoc,
    StrategyDoc,
)
from solvers.specs import ClusterSpec
from solvers.text import seconds


def layer_text(layer: LayerDoc) -> str:
    parts = [f"tp{layer.tp}"]
    if layer.sp:
        parts.append(f"sp={layer.sp}")
    parts += [f"cp{layer.cp}", f"dp{layer.dp}", f"zero{layer.zero}"]
    if layer.recompute != "none":
        parts.append(f"recompute={layer.recompute}")
    if layer.ep > 1:
        parts.append(f"ep{layer.ep}")
    return " ".join(parts)


def _embedding_text(embedding: EmbeddingDoc) -> str:
    # the embedding is written as a layer that neither splits the sequence nor recomputes
    return layer_text(LayerDoc(tp=embedding.tp, dp=embedding.dp, zero=embedding.zero, sp=embedding.sp))


def layer_runs(layers: Sequence[LayerDoc]) -> list[str]:
    """Consecutive layers with one strategy as one line (stage sizes are on the plan's own line)."""
    out: list[str] = []
    first = 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or layer_text(layers[i]) != layer_text(layers[first]):
            span = f"layer {first}" if i - first == 1 else f"layers {first}-{i - 1}"
            out.append(f"  {span:<14} {layer_text(layers[first])}")
            first = i
    return out


def _micro_batches(strategy: StrategyDoc) -> str:
    n = strategy.micro_batches
    return f"{n} micro-batch" + ("" if n == 1 else "es")


def _breakdown(parts: Mapping[str, float], total: float) -> str:
    items = sorted(((k, v) for k, v in parts.items() if v > 0), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {seconds(v)} ({100 * v / total:.1f}%)" for k, v in items)


def _memory_limit_text(request: Mapping[str, Any]) -> str:
    """The request's memory limit as the plan kept it: one above the GPU's memory is not what was planned within
    (the request is the CLI's own and was solved, so it parses)."""
    limit = (request.get("constraints") or {}).get("memory_limit_gib")
    if not isinstance(limit, int | float) or isinstance(limit, bool) or not limit:
        return ""
    gpu = ClusterSpec.model_validate(request["cluster"]).gpu
    if limit > gpu.memory_gib:
        return f" (limit {gpu.memory_gib:.1f}: the {gpu.name}'s memory, under the {limit:g} asked)"
    return f" (limit {limit:.1f})"


def _plan_lines(request: Mapping[str, Any], strategy: StrategyDoc, estimate: HybridEstimate,
                baselines: Mapping[BaselineName, BaselineDoc | None], search: HybridSearch | None) -> list[str]:
    sched = strategy.schedule + (f", {strategy.virtual_stages} chunks per GPU" if strategy.virtual_stages > 1 else "")
    out = [f"plan: pp={strategy.pp}, {_micro_batches(strategy)} ({sched}), stages {strategy.stage_layers}"]
    out += layer_runs(strategy.layers)
    out.append(f"  embedding/LM head: {_embedding_text(strategy.embedding)}")
    step = estimate.step_time_s
    out.append(f"step {seconds(step)} · {estimate.throughput_samples_per_s:.3g} samples/s · "
               f"{estimate.tokens_per_s:,.0f} tokens/s · MFU {100 * estimate.mfu:.1f}% · "
               f"peak {estimate.peak_memory_gib:.1f} GiB per GPU" + _memory_limit_text(request))
    if step:
        out.append("time per step: " + _breakdown(estimate.breakdown_s, step))
    out += _memory(estimate.memory_breakdown_gib_per_stage)
    out += _baselines(baselines, step, estimate.breakdown_s)
    if search is not None:
        out += _search(search)
    out += [f"note: {n}" for n in estimate.notes]
    return out


def _search(search: HybridSearch) -> list[str]:
    """The certificate and the search's effort, where the result records them."""
    out: list[str] = []
    if search.target not in (None, "paraplan"):  # a framework target: the whole uniform grid it runs was priced
        out.append(f"target {search.target}: the fastest fitting uniform plan {search.target} runs exactly as "
                   "planned (every such plan of the search space priced); per-layer plans are not searched")
        if search.cpu_s is not None:
            out.append(f"search: {search.cpu_s:.2f} s CPU, {search.target_plans_checked} fitting plan(s) checked "
                       f"against {search.target}'s run")
        return out
    bound, gap = search.lower_bound_step_time_s, search.optimality_gap
    if bound is not None and gap is not None:
        out.append(f"certificate: no plan of the search space runs a step under {seconds(bound)}; "
                   f"this plan is within {100 * gap:.2f}% of that")
    if search.cpu_s is not None and search.configs_total is not None and search.configs_solved is not None:
        out.append(f"search: {search.cpu_s:.2f} s CPU; " + _effort(search))
    return out


def _effort(search: HybridSearch) -> str:
    """What the search did with the pipeline configurations: each was searched in full or ruled out by a bound
    (none of those could beat the plan); "0 of 41 solved" read as if nothing had been."""
    total, solved = search.configs_total or 0, search.configs_solved or 0
    bounded = search.configs_pruned_by_bound
    unsettled = total - solved - bounded if bounded is not None and search.time_limited else 0
    by_bound = total - solved - unsettled
    plural = "s" if total != 1 else ""
    source = search.plan_from or ""
    if solved == 0 and source.startswith("baseline:"):
        text = (f"the {source.removeprefix('baseline:')} baseline is the plan: bounds showed that none of "
                f"the {total} pipeline configuration{plural} could beat it, so none needed a full search")
    else:
        by_cert = search.configs_solved_by_certificate or 0
        late = (f" ({by_cert} of them by the certificate: the search's ordering had passed them by)"
                if by_cert else "")
        text = (f"{solved} of {total} pipeline configuration{plural} searched in full{late}, "
                f"{by_bound} ruled out by a bound (none of them could beat the plan)")
    if unsettled > 0:
        text += f", {unsettled} not reached before the time limit"
    return text


def _memory(stages: Sequence[Mapping[str, float]], show: int = 4) -> list[str]:
    """Memory per stage with its parts; deep pipelines show the fullest stage and the others' range."""
    totals = [sum(parts.values()) for parts in stages]

    def line(s: int) -> str:
        items = ", ".join(f"{k} {v:.1f}" for k, v in stages[s].items() if v > 0)
        return f"memory, stage {s}: {totals[s]:.1f} GiB = {items}"

    if len(stages) <= show:
        return [line(s) for s in range(len(stages))]
    peak = max(range(len(stages)), key=lambda s: totals[s])
    rest = [t for s, t in enumerate(totals) if s != peak]
    return [line(peak) + " (the fullest stage)",
            f"memory, the other {len(rest)} stages: {min(rest):.1f}-{max(rest):.1f} GiB (--json for each)"]


def _baselines(baselines: Mapping[BaselineName, BaselineDoc | None], step: float,
               plan_breakdown: Mapping[str, float]) -> list[str]:
    out = ["baselines (same cost model):"] if baselines else []
    for name, entry in baselines.items():
        if entry is None or not entry.fits or entry.estimate is None:
            out.append(f"  {name:<10} {(entry.note if entry is not None else None) or 'does not fit'}")
            continue
        base_step, bound = entry.estimate.step_time_s, entry.gain_bound
        out.append(f"  {name:<10} step {seconds(base_step)}: this plan {100 * (base_step / step - 1):+.1f}%"
                   + (f" (any plan at most {100 * bound:+.1f}%)" if bound is not None else "")
                   + (_uniform_text(entry.strategy) if entry.strategy is not None else ""))
        if entry.outside_constraints:
            out.append(f"{'':13}outside this request's constraints: {'; '.join(entry.outside_constraints)}")
        out += _against(entry.estimate.breakdown_s, plan_breakdown, step)
    return out


def _against(base: Mapping[str, float], plan: Mapping[str, float], step: float, show: int = 4) -> list[str]:
    """Where the plan's step differs from a baseline's, part by part: the gain's why (the largest parts, those
    of at least 0.5% of the step)."""
    if not step:
        return []
    diff = {k: base.get(k, 0.0) - plan.get(k, 0.0) for k in dict.fromkeys([*base, *plan])}
    big = sorted((kv for kv in diff.items() if abs(kv[1]) >= 0.005 * step), key=lambda kv: -abs(kv[1]))[:show]
    saves = ", ".join(f"{k} {seconds(d)}" for k, d in big if d > 0)
    spends = ", ".join(f"{seconds(-d)} more on {k}" for k, d in big if d < 0)
    said = "; ".join(x for x in (saves and f"saves {saves}", spends and f"spends {spends}") if x)
    return [f"{'':13}against it, this plan {said}"] if said else []


def _uniform_text(strategy: StrategyDoc) -> str:
    """A uniform plan in a few words: its layers' layout (the MoE layers' where they differ), pp, schedule."""
    layers = [layer_text(x) for x in strategy.layers]
    if not layers:
        return ""
    layout = max(set(layers), key=lambda t: ("ep" in t, layers.count(t)))
    v = strategy.virtual_stages
    sched = strategy.schedule + (f" v{v}" if v > 1 else "")
    return f"; {layout}, pp{strategy.pp}, {_micro_batches(strategy)}, {sched}"


def _hetero(hetero: HeteroDoc) -> list[str]:
    """Where each stage runs, and the plan against the fastest group alone and the type-blind plan."""
    out = ["stages on a mixed cluster: " + "; ".join(
        f"{p.stage}: {p.layers} layers on {'+'.join(p.gpus)} ({p.memory_limit_gib:.0f} GiB)" for p in hetero.placement)]
    named: tuple[tuple[HeteroBaselineName, str], ...] = (("fastest_group", "the fastest group alone"),
                                                         ("type_oblivious", "the type-blind plan"))
    for name, text in named:
        base = hetero.baselines.get(name)
        if base is not None and base.gain is not None:
            verdict = "faster" if base.gain >= 0 else "SLOWER: run on that group alone"
            out.append(f"  against {text}: this plan {base.gain:+.1%} ({verdict})")
    return out


def _front(front: Sequence[FrontPoint], sizing: SizingDoc) -> list[str]:
    """The sizing front, fastest first, and the cheapest cluster that meets the deadline."""
    pruned = f", {sizing.clusters_pruned} of them beaten without planning (their floor)" if sizing.clusters_pruned \
        else ""
    if sizing.clusters_beaten_in_search:
        pruned += f", {sizing.clusters_beaten_in_search} beaten in their search (no plan beats a point found)"
    out = [f"sizing front ({len(front)} of {sizing.clusters_tried} clusters tried{pruned}; estimates):"]
    for i, p in enumerate(front):
        mark = " <- cheapest in the deadline" if i == sizing.cheapest_in_deadline else ""
        late = " (misses the deadline)" if p.meets_deadline is False else ""
        out.append(f"  {p.gpus:>6} {p.cluster['gpu']:<10} {p.days:9.1f} days  cost {p.cost:,.0f}{late}{mark}")
    return out


def summarise(request: Mapping[str, Any], result: HybridResult) -> list[str]:
    """The plan, its cost, where the step goes, its baselines and how far from the best it can be."""
    lines = _plan_lines(request, result.strategy, result.estimate, result.baselines, result.search)
    if result.hetero is not None:
        lines += _hetero(result.hetero)
    if result.front is not None and result.sizing is not None:
        lines += _front(result.front, result.sizing)
    return lines


def summarise_estimate(request: Mapping[str, Any], estimate: HybridEstimateResult) -> list[str]:
    """A given strategy's estimate (what-if): the plan's blocks that apply, and whether it fits."""
    lines = _plan_lines(request, estimate.strategy, estimate, {}, None)
    return ["DOES NOT FIT in the memory limit (see the notes)", *lines] if not estimate.fits else lines
