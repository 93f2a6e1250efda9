"""Baselines solved in the same call as the plan, under the same cost model.

- ``megatron``: the best uniform Megatron-LM style plan — one strategy for every layer, grid over
  tp (× Megatron SP) × pp (even split) × dp × micro-batches × ZeRO-0/1 (distributed optimizer) ×
  recompute, 1F1B or interleaved, vocabulary-parallel embedding on the layers' TP group.
- ``zero3_dp``: ZeRO-3 data parallelism over all GPUs (FSDP), best micro-batching and recompute.
- ``pure_dp``: plain data parallelism (DDP), no recompute, best micro-batching — when it fits.

Each uniform plan is costed by the contract's aggregation, vectorised over the candidate strategies of a
pipeline configuration; only the winner is passed through ``evaluate`` for its full estimate.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from solvers.cost_model import pipeline
from solvers.cost_model.base import CostModel, Estimate
from solvers.hybrid.moe import with_expert_layouts
from solvers.hybrid.space import ALL_RECOMPUTE, PipelineConfig, SearchSpace
from solvers.hybrid.stage_costs import fixed_memory_bytes, layout_transitions, stage_context
from solvers.specs import Constraints
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Recompute, SpKind


@dataclass
class Baseline:
    name: str
    plan: PlanStrategy
    step_time_s: float


def megatron_embedding(x: LayerStrategy) -> EmbeddingStrategy:
    return EmbeddingStrategy(tp=x.tp, dp=x.dp * x.cp, zero=x.zero)


def without_experts(x: LayerStrategy) -> LayerStrategy:
    """``x`` on a dense layer: expert parallelism, expert TP and LSH apply to MoE layers only."""
    return replace(x, ep=1, etp=None, lsh=False)


SplitRule = Callable[[int, PipelineConfig], "tuple[int, ...] | None"]
EmbeddingRule = Callable[[LayerStrategy], EmbeddingStrategy]


def megatron_split(n_layers: int, cfg: PipelineConfig) -> tuple[int, ...] | None:
    return pipeline.even_split(n_layers, cfg.pp, pipeline.chunks(cfg.schedule, cfg.virtual_stages))


def best_uniform(cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable], configs: Iterable[PipelineConfig],
                 strategies: Iterable[LayerStrategy], name: str,
                 expert_layers: Sequence[bool] | None = None) -> Baseline | None:
    """Fastest fitting plan that uses one of ``strategies`` for every layer, over ``configs``.

    ``expert_layers``: which layers are MoE; the others take each strategy without its expert fields (the
    cost model prices a dense layer alike either way)."""
    best: list[Baseline] = []  # the fastest so far: the generator prunes against it as it goes
    for b in uniform_plans(cm, space, kinds, configs, strategies, name, expert_layers,
                           ceiling=lambda: best[0].step_time_s if best else math.inf):
        best[:] = [b]  # the generator yields only plans faster than the ceiling
    return best[0] if best else None


def uniform_plans(cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable], configs: Iterable[PipelineConfig],
                  strategies: Iterable[LayerStrategy], name: str, expert_layers: Sequence[bool] | None = None,
                  split: SplitRule = megatron_split, embedding: EmbeddingRule = megatron_embedding,
                  ceiling: Callable[[], float] = lambda: math.inf) -> Iterator[Baseline]:
    """Every fitting plan that uses one of ``strategies`` for every layer, over ``configs``, its stages split by
    ``split`` and its embedding laid out by ``embedding``; where the cost model's pipeline is linear, only those
    faster than ``ceiling()`` (asked per configuration: the caller's best so far)."""
    strategies = list(strategies)
    first_of: dict[Hashable, int] = {}
    for i, k in enumerate(kinds):
        first_of.setdefault(k, i)
    n_layers, batch = space.num_layers, space.global_batch_size
    linear = cm.pipeline_traits.linear
    of_world: dict[int, list[LayerStrategy]] = {}
    for x in strategies:
        of_world.setdefault(x.world, []).append(x)
    by_stage: dict[tuple[int, int], tuple[LayerStrategy, ...]] = {}  # a stage's GPUs and micro-batch -> candidates
    for cfg in configs:
        g, mbs = space.num_gpus // cfg.pp, batch // cfg.micro_batches
        cands = by_stage.get((g, mbs))
        if cands is None:  # a tuple, the same for every configuration of the stage: asked by identity
            cands = by_stage[(g, mbs)] = tuple(x for x in of_world.get(g, ()) if mbs % x.dp == 0)
        if not cands:
            continue
        parts = split(n_layers, cfg)
        if parts is None:
            continue
        # a uniform stage only re-lays out between a layout and itself: one matrix per configuration
        diag = np.diag(layout_transitions(cm, cands, stage_context(cfg, 0, batch)))
        t, u, mem, infl = _uniform_layer_terms(cm, cfg, cands, kinds, first_of, parts, diag, batch)
        # fixed terms only add time and memory: a candidate that misses without them misses with them
        alive = (np.max(mem, axis=0) <= cm.memory_limit_bytes) & np.all(np.isfinite(t), axis=0)
        if linear and alive.any():
            cols = np.flatnonzero(alive)
            layers_step = pipeline.step_time_columns(t[:, cols], u[:, cols], cfg.micro_batches, cfg.virtual_stages,
                                                     cfg.schedule)
            alive[cols] = layers_step < ceiling()
        if not alive.any():
            continue
        # plus each stage's fixed terms under the candidate's embedding
        embs = [embedding(x) for x in cands]
        columns: dict[EmbeddingStrategy, list[int]] = {}  # candidates sharing an embedding share its fixed terms
        for j in map(int, np.flatnonzero(alive)):
            columns.setdefault(embs[j], []).append(j)
        ft, fu, fm = (np.full_like(t, np.inf) for _ in range(3))
        for emb, same in columns.items():
            with_emb = replace(cfg, embedding=emb)
            fixed = [cm.stage_fixed(stage_context(with_emb, s, batch)) for s in range(cfg.pp)]
            ft[:, same] = np.array([fx.time_s for fx in fixed])[:, None]
            fu[:, same] = np.array([fx.step_time_s for fx in fixed])[:, None]
            fm[:, same] = np.array([fixed_memory_bytes(fx, infl[s]) for s, fx in enumerate(fixed)])[:, None]
        t, u, mem = t + ft, u + fu, mem + fm
        fits = np.all(np.isfinite(t), axis=0) & (np.max(mem, axis=0) <= cm.memory_limit_bytes)
        for j in map(int, np.flatnonzero(fits)):
            ctx0 = stage_context(replace(cfg, embedding=embs[j]), 0, batch)
            step = float(cm.pipeline_step_time(list(t[:, j]), list(u[:, j]), ctx0))
            if math.isfinite(step) and step < ceiling():
                x = cands[j]
                layers = tuple(x if expert_layers is None or expert_layers[i] else without_experts(x)
                               for i in range(n_layers))
                plan = PlanStrategy(pp=cfg.pp, micro_batches=cfg.micro_batches, layers=layers,
                                    stage_layers=parts, schedule=cfg.schedule,
                                    virtual_stages=cfg.virtual_stages, embedding=embs[j])
                yield Baseline(name, plan, step)


def _uniform_layer_terms(cm: CostModel, cfg: PipelineConfig, cands: tuple[LayerStrategy, ...],
                         kinds: Sequence[Hashable], first_of: dict[Hashable, int], parts: Sequence[int],
                         diag: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per stage and candidate, the layers' time per micro-batch, step time and memory (no fixed terms: they do
    not depend on the embedding strategy), and each stage's micro-batches in flight. Stages the cost model prices
    alike (``layer_costs_key``) are computed together: stage x kind counts times kind x candidate costs."""
    ctxs = [stage_context(cfg, s, batch) for s in range(cfg.pp)]
    infl = np.array([float(cm.in_flight_micro_batches(c)) for c in ctxs])
    order = list(first_of)
    counts = np.zeros((cfg.pp, len(order)))
    start = 0
    for s, n in enumerate(parts):
        for k, count in Counter(kinds[start:start + n]).items():
            counts[s, order.index(k)] = count
        start += n
    t = (np.asarray(parts, dtype=float)[:, None] - 1.0) * diag[None, :]
    u = np.zeros_like(t)
    mem = np.zeros_like(t)
    groups: dict[Hashable, list[int]] = {}
    for s, c in enumerate(ctxs):
        groups.setdefault(cm.layer_costs_key(c), []).append(s)
    for rows in groups.values():
        costs = [cm.layer_costs(first_of[k], cands, ctxs[rows[0]]) for k in order]
        held = counts[rows]  # [stage, kind]
        t[rows] += held @ np.stack([c.time_s for c in costs])
        u[rows] += held @ np.stack([c.step_time_s for c in costs])
        mem[rows] += held @ np.stack([c.state_bytes for c in costs]) + infl[rows, None] * (
            held @ np.stack([c.activation_bytes for c in costs]))
        # the transient peak of the largest kind a stage holds
        peak = np.stack([c.peak_extra_bytes for c in costs])[None, :, :]  # [1, kind, candidate]
        mem[rows] += np.max(np.where(held[:, :, None] > 0, peak, 0.0), axis=1)
    return t, u, mem, infl


def _dp_strategies(n: int, zero: int, recomputes: Iterable[Recompute]) -> list[LayerStrategy]:
    return [LayerStrategy(tp=1, dp=n, zero=zero if n > 1 else 0, recompute=r) for r in recomputes]


def _single_stage(space: SearchSpace) -> list[PipelineConfig]:
    return [PipelineConfig(1, m) for m in space.micro_batch_options(1)]


def megatron_grid(space: SearchSpace) -> tuple[list[PipelineConfig], list[LayerStrategy]]:
    """The Megatron-LM style grid: 1F1B or interleaved configurations, and per pipeline degree every TP
    (with Megatron SP) × ZeRO-0/1 × recompute, data parallel over the rest of the stage; for MoE models
    also every expert-parallel degree and expert TP (Megatron-LM's --expert-model-parallel-size and
    --expert-tensor-parallel-size), the same for every MoE layer."""
    configs = [c for c in space.pipeline_configs() if c.schedule in ("1f1b", "interleaved")]
    strategies = []
    for pp in space.pp_options():
        g = space.num_gpus // pp
        for tp in space.tp_options(g):
            # Megatron SP where the sequence splits tp ways, else plain TP; neither where TP does not split the
            # KV heads or the FFN (the planner's own rules: such a baseline was priced, and could beat the plan)
            kinds: tuple[SpKind, ...] = ("megatron", None) if tp > 1 else (None,)
            legal = [x for x in kinds if space.splits_layer(tp, 1, x)]
            if not legal:
                continue
            sp = legal[0]
            for zero in (0, 1):
                for rc in ALL_RECOMPUTE:
                    strategies.append(LayerStrategy(tp=tp, dp=g // tp, sp=sp, zero=zero if g // tp > 1 else 0,
                                                    recompute=rc))
    strategies = list(dict.fromkeys(strategies))
    if space.num_experts > 1:
        strategies = with_expert_layouts(strategies, space.num_experts, space.gpus_per_node, allow_approximate=False)
    return configs, strategies


def megatron(cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable],
             expert_layers: Sequence[bool] | None = None) -> Baseline | None:
    configs, strategies = megatron_grid(space)
    return best_uniform(cm, space, kinds, configs, strategies, "megatron", expert_layers)


def zero3_dp(cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable]) -> Baseline | None:
    strategies = _dp_strategies(space.num_gpus, 3, ALL_RECOMPUTE)
    return best_uniform(cm, space, kinds, _single_stage(space), strategies, "zero3_dp")


def pure_dp(cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable]) -> Baseline | None:
    strategies = _dp_strategies(space.num_gpus, 0, ("none",))
    return best_uniform(cm, space, kinds, _single_stage(space), strategies, "pure_dp")


def beyond_constraints(plan: PlanStrategy, c: Constraints) -> list[str]:
    """The request's constraints ``plan`` does not keep, each with what the plan does instead. A baseline is a
    fixed recipe (ZeRO-3 DP keeps ZeRO-3 under ``zero = 0``, Megatron's keeps its SP under ``sp = "none"``): it
    may beat the plan only by leaving the space the request asked for, and the result says so."""
    layers, out = plan.layers, []
    zeros = sorted({x.zero for x in layers if x.dp * x.cp > 1} | ({plan.embedding.zero} if plan.embedding.dp > 1
                                                                   else set()))
    if c.zero is not None and zeros != [c.zero] and zeros:
        out.append(f"constraints.zero = {c.zero}: it uses ZeRO {', '.join(map(str, zeros))}")
    if c.sp is not None:
        asked = None if c.sp == "none" else c.sp
        other = sorted({x.sp or "none" for x in layers if x.tp > 1 and x.sp != asked})
        if other:
            out.append(f"constraints.sp = {c.sp}: it uses {', '.join(other)}")
    fixed: list[tuple[str, object, object]] = [("schedule", plan.schedule, c.schedule),
                                               ("micro_batches", plan.micro_batches, c.micro_batches)]
    for field, value, wanted in fixed:
        if wanted is not None and value != wanted:
            out.append(f"constraints.{field} = {wanted}: it uses {value}")
    for field, used, cap in (("max_tp", max(x.tp for x in layers), c.max_tp), ("max_pp", plan.pp, c.max_pp),
                             ("max_cp", max(x.cp for x in layers), c.max_cp)):
        if cap is not None and used > cap:
            out.append(f"constraints.{field} = {cap}: it uses {used}")
    return out


def report(b: Baseline | None, est: Estimate | None, plan_throughput: float, why_missing: str,
           bound_s: float = 0.0, constraints: Constraints | None = None) -> dict[str, object]:
    """A baseline's entry in the result: its strategy, estimate, the plan's gain over it and, given the step
    time no plan can beat (``bound_s`` > 0), the most any plan in the space could gain over it; and the
    ``constraints`` of the request it does not keep."""
    if b is None or est is None:
        return {"fits": False, "note": why_missing}
    thr = est.throughput_samples_per_s
    beyond = beyond_constraints(b.plan, constraints) if constraints is not None else []
    return {
        **({"outside_constraints": beyond} if beyond else {}),
        "fits": est.fits,
        "strategy": b.plan.to_dict(),
        "estimate": est.to_json(),
        "throughput_samples_per_s": thr,
        "gain": plan_throughput / thr - 1.0 if thr > 0 else None,
        "gain_bound": est.step_time_s / bound_s - 1.0 if bound_s > 0 and thr > 0 else None,
    }
