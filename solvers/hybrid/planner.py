"""The hybrid planner's outer search: pipeline degree × micro-batches × schedule, each solved by the layer DP.

Every pipeline configuration gets a lower bound first (each stage's memory-constrained choice relaxed, see
``bounds``; best partition of that relaxation); configurations are solved in bound order and the search stops
as soon as the next bound cannot beat the best plan found. Where a configuration has too many partitions to
enumerate, its ordering bound is the relaxation's best of a few partitions, a heuristic: ``certificate`` then
solves what the search passed by and true bounds cannot rule out. Cost-model answers are cached per (layer
kind, stage context) and DP tables per (configuration, stage, phase of the layer kinds), so nothing is computed
twice. The chosen plan, and every solved configuration whose bound lies below it, is then refined (a
dichotomic search over time weights); for mixed layer kinds the chosen plan is polished (finer bins), and under a
non-linear pipeline formula its layers are swapped one at a time (``swaps``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from solvers.cost_model import pipeline
from solvers.cost_model.base import CostModel, LayerCosts, StageFixed
from solvers.hybrid import bounds, partition, stage_costs, stage_table, swaps
from solvers.hybrid.space import PipelineConfig, SearchSpace
from solvers.strategy import EmbeddingStrategy, PlanStrategy

Progress = Callable[[float, str], None]


def kind_period(kinds: Sequence[Hashable]) -> int:
    """Smallest P with kinds[i] == kinds[i + P] everywhere (1: identical layers; MoE every other layer: 2).

    Layers [start, start + n) then look exactly like [start % P, start % P + n), so one DP table per stage
    and phase serves every start: O(P) DP runs per stage instead of O(layers) — what keeps a 128-layer
    model with interleaved MoE layers from planning for minutes."""
    n = len(kinds)
    for p in range(1, n):
        if all(kinds[i] == kinds[i + p] for i in range(n - p)):
            return p
    return max(n, 1)

@dataclass
class PlannerOptions:
    memory_bins: int = 512  # resolution of the DP's memory axis (bins across the whole budget)
    min_memory_bins: int = 128  # the coarsest resolution deep models with mixed layer kinds fall back to
    memory_unit_bytes: float | None = None  # fixed bin size instead (exact when memory is a multiple)
    exhaustive_partition_limit: int = 1000
    time_limit_s: float | None = None
    use_bounds: bool = True
    peak_levels: int = 4  # transient-memory levels enumerated exactly per stage (more are rounded up)
    # Pareto-optimal embedding/LM-head strategies tried per configuration: 4 missed the best plan on 6 of 72 sweep
    # requests (by up to 1.1 %, shallow stacks with large vocabularies); 8 found what 16 and 64 find, same CPU time
    embedding_variants: int = 8
    dp_work_limit: float = 2e5  # identical-layer stages: the DP only when this cheap (else the two-type table)
    # the chosen plan's dichotomic search over time weights: rounds of one new weight per hull gap per stage
    refine_rounds: int = 8
    rival_refine_rounds: int = 1  # the same, local rounds only, for configurations that may overtake it
    swap_moves: int = 64  # the chosen plan's single-layer changes under a non-linear pipeline formula (0: none)
    swap_pairs: bool = True  # ... and, where no single change helps, changes of two layers of a stage at once
    polish_factor: int = 4  # mixed layer kinds: the chosen configuration re-solved with this many times finer bins
    # the layer DP: numpy over memory bins, or Pareto fronts on exact memory. Measured (bench/hybrid.py --layer-dp):
    # bins are as fast or faster everywhere and 5.7x faster on a 64-layer mixed stack, whose fronts grow to ~16,000
    # points; exact memory gained at most 0.37 % (stacks of identical layers: none, the two-strategy table is exact)
    layer_dp: stage_table.LayerDP = "binned"
    # the certificate's refined bounds: groups of a stage's largest transient buffer told apart (1: the least reserved
    # for all), and stages of up to this many identical layers also by whole candidates
    bound_transient_levels: int = 8
    bound_whole_layers: int = 7
    # ... up to this many where the certificate's gap still exceeds ``deep_bound_gap`` (a third pass)
    bound_whole_layers_deep: int = 16
    deep_bound_gap: float = 0.01
    # ... and for a single stage (pp = 1), whose one relaxation is cheap: gpt3-1.3b on 16 A100-40GB at seq 8192 (one
    # stage of 24 layers under memory) 1.76 % at 8 groups, 0.76 % at 64, at no measurable certificate CPU
    bound_single_stage_levels: int = 64

@dataclass
class ConfigOutcome:
    config: PipelineConfig
    step_time_s: float
    parts: tuple[int, ...]
    lower_bound_s: float

@dataclass
class PlanResult:
    plan: PlanStrategy
    step_time_s: float  # the planner's own aggregation (must equal the cost model's evaluate)
    configs_total: int
    configs_solved: int
    configs_pruned_by_bound: int
    dp_runs: int
    time_s: float
    ranking: list[ConfigOutcome] = field(default_factory=list)
    time_limited: bool = False  # the time limit stopped the search before every configuration was settled


def transient_levels(st: stage_costs.StageInputs) -> tuple[np.ndarray, dict[Hashable, np.ndarray]]:
    """The stage's useful caps on a layer's transient memory and, per layer kind, the least resident memory
    of a candidate within each cap: (caps, {kind: memory per cap}). Only caps that lower some kind's memory
    are kept (a Pareto front of transient against resident memory)."""
    levels = np.unique(np.concatenate([c.peak_extra_bytes for c in st.costs.values()]))
    rows = {}
    for k, c in st.costs.items():
        order = np.argsort(c.peak_extra_bytes, kind="stable")
        running = np.minimum.accumulate(st.memory(k)[order])
        at = np.searchsorted(c.peak_extra_bytes[order], levels, side="right") - 1
        rows[k] = np.where(at >= 0, running[np.maximum(at, 0)], math.inf)
    table = np.stack(list(rows.values()))
    keep = np.ones(levels.size, dtype=bool)
    keep[1:] = np.any(table[:, 1:] < table[:, :-1], axis=0)
    return levels[keep], {k: r[keep] for k, r in rows.items()}


class Planner:
    """Search state for one request: caches live here."""

    def __init__(self, cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable] | None = None,
                 options: PlannerOptions | None = None):
        self.cm, self.space = cm, space
        self.kinds: Sequence[Hashable] = list(kinds) if kinds is not None else list(range(space.num_layers))
        self.opt = options or PlannerOptions()
        self.limit = float(cm.memory_limit_bytes)
        self.period = kind_period(self.kinds)
        traits = cm.pipeline_traits
        # one stage then costs m x time + step time: its weight-m table is exact and bounds may add the two
        self.linear = traits.linear
        # the floors and the min-max bound hold without the fill/drain and step terms
        self.slowest_bound = self.linear or traits.at_least_slowest_stage
        # the linear formula's bounds hold once lifted through the cost model's ``step_bound_from_linear``
        self.lifted = not self.linear and traits.bounded_by_linear
        self.linear_bounds = self.linear or self.lifted
        self.chain = traits.at_least_chain
        self.first_sync = traits.adds_first_stage_sync
        self.unit = self.opt.memory_unit_bytes or stage_costs.memory_unit(self.limit, self.memory_bins())
        self._costs: dict[PipelineConfig, stage_costs.ConfigCosts | None] = {}
        self._tables: dict[tuple[object, ...], stage_table.StageTable] = {}
        self._memo: dict[tuple[object, ...], object] = {}
        self._envelopes: bounds.Envelopes = {}
        self._fronts: bounds.Fronts = {}
        self._picks: dict[tuple[PipelineConfig, tuple[int, ...]], tuple[int, ...]] = {}
        self._floors: dict[PipelineConfig, float] = {}  # the search and the certificate ask for the same ones
        # per-stage tables of exactly a plan's stages (``polish``), used instead of the shared prefix tables
        self._final_tables: dict[tuple[PipelineConfig, tuple[int, ...]], list[stage_table.StageTable]] = {}
        # per stage, a candidate index per layer: a plan's stages changed by ``swap``, used instead of any table
        self._swapped: dict[tuple[PipelineConfig, tuple[int, ...]], list[list[int]]] = {}
        self._variants_of: dict[PipelineConfig, list[PipelineConfig]] = {}
        self.solved: set[PipelineConfig] = set()  # embedding variants solved (by the search or the certificate)
        self.started = time.perf_counter()
        self.dp_runs = 0
        self.time_limited = False
        self.last_counts: tuple[int, int, int] = (0, 0, 0)  # configurations: total, solved, pruned by bound

    def memory_bins(self) -> int:
        """The DP's memory resolution. Identical layers mostly skip the DP (the exact two-strategy table);
        mixed layer kinds run it per stage and phase over every layer, so deep mixed models get coarser bins
        (rounded up: plans still fit) and the work per table stays that of a 32-layer model."""
        n = max(len(self.kinds), 1)
        if self.period == 1 or n <= 32:
            return self.opt.memory_bins
        return max(self.opt.min_memory_bins, self.opt.memory_bins * 32 // n)

    # ------------------------------------------------------------------ caches
    def config_costs(self, cfg: PipelineConfig) -> stage_costs.ConfigCosts | None:
        if cfg not in self._costs:
            g = self.space.num_gpus // cfg.pp
            mbs = self.space.global_batch_size // cfg.micro_batches
            cands = self.space.layer_candidates(g, mbs)
            cc = (stage_costs.build(self.cm, cfg, cands, self.kinds, self.space.global_batch_size, self._memo)
                  if cands else None)
            self._costs[cfg] = cc if cc is not None and cc.candidates else None
        return self._costs[cfg]

    def table(self, cc: stage_costs.ConfigCosts, stage: int, layers: Sequence[int],
              weight: float | None = None) -> stage_table.StageTable:
        """DP table for ``layers`` on ``stage``; identical-kind sequences share one table (prefixes).

        The key is what the table depends on: the configuration without its embedding (which only enters
        through the stage's fixed terms, part of the key), the stage and the layer kinds."""
        st = cc.stages[stage]
        cfg = cc.config
        f = st.fixed
        w = cc.time_weight if weight is None else weight
        key = (cfg.pp, cfg.micro_batches, cfg.schedule, cfg.virtual_stages, stage, f.time_s, f.step_time_s,
               st.fixed_memory(), w, tuple(self.kinds[i] for i in layers))
        hit = self._tables.get(key)
        if hit is None:
            self.dp_runs += 1
            hit = stage_table.solve(st, layers, self.kinds, w, self.unit, self.limit,
                                    self.opt.peak_levels, self.opt.dp_work_limit, self.opt.layer_dp)
            self._tables[key] = hit
        return hit

    def _max_len(self, cc: stage_costs.ConfigCosts, stage: int, start: int) -> list[int]:
        """Layers a table for a stage starting at ``start`` covers: from its phase's first occurrence on."""
        n = len(self.kinds)
        return list(range(start % self.period, n - (cc.config.pp - 1 - stage)))

    def _lookup(self, cc: stage_costs.ConfigCosts) -> partition.StageLookup:
        v = cc.config.virtual_stages

        def look(stage: int, start: int, count: int) -> tuple[float, float]:
            if count < v:
                return math.inf, math.inf
            tab = self.table(cc, stage, self._max_len(cc, stage, start))
            if not tab.feasible(count):
                return math.inf, math.inf
            return float(tab.time_s[count - 1]), float(tab.step_s[count - 1])

        return look

    def _variants(self, cc: stage_costs.ConfigCosts) -> partition.StageVariants:
        v = cc.config.virtual_stages

        def options(stage: int, start: int, count: int) -> list[tuple[float, float, int]]:
            if count < v:
                return []
            out = []
            for i, w in enumerate(cc.time_weights):
                tab = self.table(cc, stage, self._max_len(cc, stage, start), w)
                if tab.feasible(count):
                    out.append((float(tab.time_s[count - 1]), float(tab.step_s[count - 1]), i))
            return out

        return options

    def _pipe(self, cc: stage_costs.ConfigCosts) -> partition.PipelineTime:
        # The cost model's own pipeline formula, nothing on top: a formula that charges less than micro-batches
        # x the slowest stage is the cost model's to fix (Galvatron's model bounds it by default), so that the
        # plan's search value and its estimate are one number.
        ctx0 = cc.stages[0].ctx

        def step(ts: Sequence[float], us: Sequence[float]) -> float:
            return float(self.cm.pipeline_step_time(ts, us, ctx0))

        return step

    # ------------------------------------------------------------------ bounds
    def _relaxed(self, cc: stage_costs.ConfigCosts, values: list[dict[Hashable, np.ndarray]], stage: int,
                 levels: int = 1) -> list[np.ndarray]:
        """Per value (one array per layer kind, by candidate): the stage's least total under its memory
        budget, relaxed (``bounds``: the LP for identical layers, the Lagrangian for mixed kinds); by layer
        count (identical layers) or [start phase, count]. ``levels``: groups of the stage's largest transient
        buffer told apart (1: the least buffer reserved, every candidate admitted; cheap, loose where lean
        candidates carry large buffers, e.g. ZeRO-3's gathered weights)."""
        st = cc.stages[stage]
        extra = [c.peak_extra_bytes for c in st.costs.values()]
        ((_, least),) = bounds.transient_levels(extra, 1)
        plain = self._relaxed_at(cc, st, values, math.inf, least, whole=False)
        if levels <= 1:
            return plain
        # (refined, and stages of few layers on average: also by whole candidates; with many layers a stage the
        # LP's fractions cost little and the fronts of sums grow)
        whole = cc.uniform and len(self.kinds) <= self.opt.bound_whole_layers * cc.config.pp
        out: list[np.ndarray] | None = None
        for cap, reserved in bounds.transient_levels(extra, levels):
            # a plan whose largest transient buffer lies in (reserved, cap] uses only candidates within cap and
            # at least ``reserved`` of the budget for it; the least over the levels bounds every plan
            got = self._relaxed_at(cc, st, values, cap, reserved, whole)
            out = got if out is None else [np.minimum(a, b) for a, b in zip(out, got, strict=True)]
            if all(np.all(o <= p) for o, p in zip(out, plain, strict=True)):
                break  # every level is at least the plain relaxation: the rest cannot lower the least
        assert out is not None
        return out

    def _relaxed_at(self, cc: stage_costs.ConfigCosts, st: stage_costs.StageInputs,
                    values: list[dict[Hashable, np.ndarray]], cap: float, reserved: float, whole: bool
                    ) -> list[np.ndarray]:
        """``_relaxed`` over the candidates whose transient buffer is within ``cap``, ``reserved`` bytes of the
        budget set aside for it; ``whole``: small layer counts also by whole candidates."""
        n = len(self.kinds)
        ids = list(dict.fromkeys(self.kinds))
        mems = [st.memory(k) for k in ids]
        budget = self.limit - st.fixed_memory() - reserved
        allowed = [np.where(st.costs[k].peak_extra_bytes <= cap, 0.0, np.inf) if math.isfinite(cap) else 0.0
                   for k in ids]
        if not cc.uniform:
            kind_of_layer = [ids.index(k) for k in self.kinds]
            return [bounds.mixed_relaxed_cost(kind_of_layer, self.period, mems,
                                              [v[k] + a for k, a in zip(ids, allowed, strict=True)], budget,
                                              self._envelopes) for v in values]
        counts = np.maximum(np.arange(n + 1, dtype=float), 1)
        got = [counts * bounds.relaxed_cost(mems[0], v[ids[0]] + allowed[0], budget / counts, self._envelopes)
               for v in values]
        if whole:
            k = min(n, self.opt.bound_whole_layers)
            for g, v in zip(got, values, strict=True):
                g[:k + 1] = np.maximum(g[:k + 1], bounds.integral_cost(mems[0], v[ids[0]] + allowed[0],
                                                                       np.full(k + 1, budget), k, self._fronts))
        return got

    def _weighted_stage(self, cc: stage_costs.ConfigCosts, stage: int, weights: Sequence[tuple[float, float]],
                        levels: int = 1) -> list[np.ndarray]:
        """Per (w_t, w_u): the stage's relaxed least of w_t t + w_u u over its layers, plus its fixed time and
        step time at the same weights (as ``_relaxed`` shapes it: by count, or [start phase, count])."""
        st = cc.stages[stage]

        def weighted(wt: float, wu: float, t: Any, u: Any) -> Any:  # a zero weight leaves its term out: no 0 x inf
            return (wt * t if wt else 0.0) + (wu * u if wu else 0.0)

        got = self._relaxed(cc, [{k: weighted(wt, wu, c.time_s, c.step_time_s) for k, c in st.costs.items()}
                                 for wt, wu in weights], stage, levels)
        return [g + weighted(wt, wu, st.fixed.time_s, st.fixed.step_time_s)
                for g, (wt, wu) in zip(got, weights, strict=True)]

    def _by_start(self, cc: stage_costs.ConfigCosts, rows: list[np.ndarray]) -> list[np.ndarray]:
        """Per-stage relaxed values as the partition search takes them: by count, or [start, count]."""
        n, v = len(self.kinds), cc.config.virtual_stages
        if cc.uniform:
            return [np.where(np.arange(1, n + 1) < v, math.inf, row[1:]) for row in rows]
        start, count = np.meshgrid(np.arange(n), np.arange(n + 1), indexing="ij")
        ok = (count >= v) & (start + count <= n)
        return [np.where(ok, row[start % self.period, count], math.inf) for row in rows]

    def lower_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> float:
        """A lower bound on the configuration's step time from each stage's relaxed time and step time (for
        one stage of a linear pipeline: its relaxed m t + u, the step itself)."""
        n = len(self.kinds)
        m = float(cc.config.micro_batches)
        single = self.one_critical_stage(cc.config)
        per_stage = []  # each stage's relaxed time and step time, its fixed terms included
        for s in range(cc.config.pp):
            if single:  # relaxed together: tighter than t and u each with the whole memory budget
                (joint,) = self._weighted_stage(cc, s, [(m, 1.0)], levels)
                per_stage.append((joint / m, np.zeros_like(joint)))
            else:
                t, u = self._weighted_stage(cc, s, [(1.0, 0.0), (0.0, 1.0)], levels)
                per_stage.append((t, u))

        def look(stage: int, start: int, count: int) -> tuple[float, float]:
            if count < cc.config.virtual_stages:
                return math.inf, math.inf
            t, u = per_stage[stage]
            if cc.uniform:
                return float(t[count]), float(u[count])
            phase = start % self.period
            return float(t[phase, count]), float(u[phase, count])

        tables = step_tables = matrices = None
        if cc.uniform:
            tables = self._by_start(cc, [t for t, _ in per_stage])
            step_tables = [u[1:] for _, u in per_stage]
        else:
            matrices = self._by_start(cc, [t for t, _ in per_stage])
        # small: every partition (a true bound); large: the min-max and even partitions of the relaxation
        res = partition.search(n, cc.config.pp, look, self._pipe(cc),
                               exhaustive_limit=self.opt.exhaustive_partition_limit, tables=tables,
                               step_tables=step_tables, climb=False, matrices=matrices)
        return res.step_time_s

    def single_stage_bound(self, cc: stage_costs.ConfigCosts, pieces: int = 32, levels: int = 1) -> float:
        """A lower bound for one stage under any pipeline formula that grows with the stage's time C and step
        time U. The relaxation bounds C ≥ a, U ≥ b and m C + U ≥ R (each relaxed under the memory budget), so
        every plan's (C, U) lies above the segment from (a, R - m a) to ((R - b) / m, b); on a piece of it
        between (C₁, U₁) and (C₂, U₂) the step is at least step(C₁, U₂). (With t and u relaxed apart, the
        bound was step(a, b): two candidates' minima that no plan has at once.)"""
        if cc.config.pp != 1:
            return 0.0
        st, n, m = cc.stages[0], len(self.kinds), float(cc.config.micro_batches)
        a, b, r = (float(x[n] if cc.uniform else x[0, n])
                   for x in self._weighted_stage(cc, 0, [(1.0, 0.0), (0.0, 1.0), (m, 1.0)], levels))
        if not all(map(math.isfinite, (a, b, r))) or n < cc.config.virtual_stages:
            return math.inf
        c_end = max(a, (r - b) / m)
        cs = [a + (c_end - a) * i / pieces for i in range(pieces + 1)]
        us = [max(b, r - m * c) for c in cs]
        ctx0 = st.ctx
        return min(float(self.cm.pipeline_step_time([cs[i]], [us[i + 1]], ctx0)) for i in range(pieces))

    def _relaxed_stage_times(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> list[np.ndarray]:
        """Each stage's relaxed per-micro-batch time plus its fixed time, as the partition DPs take them."""
        return self._by_start(cc, [self._weighted_stage(cc, s, [(1.0, 0.0)], levels)[0] for s in range(cc.config.pp)])

    def _formula_m(self, cfg: PipelineConfig) -> float:
        """The micro-batches a non-linear pipeline formula counts (its own, where it says; Galvatron's may
        differ from the configuration's), the m of the slowest-stage and chain bounds."""
        return float(self.cm.pipeline_micro_batches(stage_costs.stage_context(cfg, 0, self.space.global_batch_size)))

    def chain_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1, enough: float = math.inf) -> float:
        """For a formula that charges at least A = Σ_s t_s + (m - 1) t_last (every stage once, then the last
        stage's other micro-batches) and, where it also charges B = m max_s t_s, at least max(A, B): the least
        of that over all partitions of the relaxed stage times (``partition.min_of_max_and_sum``; ``enough``
        where it is above ``enough``, a bound the caller needs no more of). Unlike ``joint_bound`` it keeps
        the pipeline's fill. Where the formula adds, past the pipelined part, the first stage's step time less
        its fixed time (Galvatron's unhidden gradient sync B_0 - C_0, r), the step is at least max(A + r, m t_0 + r,
        m t_s for s > 0) (the sum never below 0): the first stage is relaxed on its time and step time
        together in A and in its part of B, and both terms at once (``_first_stage_dual``)."""
        if cc.config.pp == 1 or not self.chain:
            return 0.0
        m, p, n = self._formula_m(cc.config), cc.config.pp, len(self.kinds)
        times = self._relaxed_stage_times(cc, levels)
        chain = [t * (m if s == p - 1 else 1.0) for s, t in enumerate(times)]
        slow = [m * t for t in times]
        if self.first_sync:  # (B_0 - C_0 leaves out the first stage's fixed time)
            if not math.isfinite(cc.stages[0].fixed.time_s):
                return math.inf  # the model prices no plan of this configuration (e.g. its embedding split)
            first = self._weighted_stage(cc, 0, [(1.0, 1.0), (m, 1.0)], levels)
            chain[0], slow[0] = self._by_start(cc, [x - cc.stages[0].fixed.time_s for x in first])
            # every later stage q adds U_q - F_q - Σ_{j<q} C_j ≥ U_q - F_q - q max C: the step is at least
            # (m - q) C_q + U_q - F_q too (F_q's weight m - q - 1 ≥ 0: a relaxed least F still bounds)
            for q in range(1, min(p, int(m))):
                (w,) = self._weighted_stage(cc, q, [(m - q, 1.0)], levels)
                slow[q] = np.maximum(slow[q], self._by_start(cc, [w - cc.stages[q].fixed.time_s])[0])
        if not self.slowest_bound:
            return partition.min_sum_value(n, chain)
        value = partition.min_of_max_and_sum(n, slow, chain, enough)
        if self.first_sync and value < enough:
            value = max(value, self._first_stage_dual(cc, chain, m, levels))
        return value

    def _first_stage_dual(self, cc: stage_costs.ConfigCosts, chain: list[np.ndarray], m: float, levels: int,
                          evaluations: int = 10) -> float:
        """The chain bound relaxes the first stage apart in A + r and in m t_0 + r: one layer choice may serve
        the one, another the other (a fast but heavily synced strategy against a slower lean one). The step is
        at least λ (A + r) + (1 - λ) (m t_0 + r) for every λ in [0, 1], whose first-stage part, (λ + (1 - λ) m)
        t_0 + r, is relaxed once over one choice; the least over partitions is concave in λ, so a golden-section
        search finds its largest (every point it tries is a true bound)."""
        n = len(self.kinds)

        def at(lam: float) -> float:
            (w,) = self._weighted_stage(cc, 0, [(lam + (1.0 - lam) * m, 1.0)], levels)
            (first,) = self._by_start(cc, [w - cc.stages[0].fixed.time_s])
            return partition.min_sum_value(n, [first, *(lam * c for c in chain[1:])])

        ratio = (math.sqrt(5.0) - 1.0) / 2.0
        lo, hi = 0.0, 1.0
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        fa, fb = at(a), at(b)
        best = max(fa, fb)
        for _ in range(evaluations - 2):
            if fa < fb:
                lo, a, fa = a, b, fb
                b = lo + ratio * (hi - lo)
                fb = at(b)
            else:
                hi, b, fb = b, a, fa
                a = hi - ratio * (hi - lo)
                fa = at(a)
            best = max(best, fa, fb)
        return best

    def joint_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> float:
        """Another lower bound for a linear pipeline of several stages (for identical layers checked just
        before a configuration is solved, for mixed kinds part of its ordering bound). With t_a the slowest
        stage and u_b the largest step time, the step is (m - 1/v) t_a + u_b + Σ t / v. Since
        m t_a + u_b ≥ m t_s + u_s for every stage s, the min-max partition J of each stage's relaxed m t + u
        bounds the first part: the step is ≥ J, and ≥ (1 - 1/(v m)) J plus Σ t / v, at least every layer's
        fastest candidate and every stage's fixed time over v (the fill and drain of the pipeline).
        A formula known only to charge at least m × the slowest stage (Galvatron's, bounded) gets m × the
        min-max partition of the relaxed stage times."""
        if cc.config.pp == 1 or not (self.slowest_bound or self.lifted):
            return 0.0
        cfg = cc.config
        m = float(cfg.micro_batches)
        if not self.linear_bounds:  # only step >= m max_s t_s: the min-max partition of the relaxed stage times
            return self._formula_m(cfg) * partition.min_max_value(len(self.kinds),
                                                                  self._relaxed_stage_times(cc, levels))
        v = pipeline.chunks(cfg.schedule, cfg.virtual_stages)
        rows = self._by_start(cc, [self._weighted_stage(cc, s, [(m, 1.0)], levels)[0] for s in range(cfg.pp)])
        j = partition.min_max_value(len(self.kinds), rows)
        sum_t = self._fastest_layers_s([st.costs for st in cc.stages]) + sum(st.fixed.time_s for st in cc.stages)
        # (the rows are each stage's relaxed work m t + u: their least sum over p is the mean work's bound)
        return self._lift(max(j, (1 - 1 / (v * m)) * j + sum_t / v),
                          lambda: partition.min_sum_value(len(self.kinds), rows) / cfg.pp)

    def mean_stage_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> float:
        """A lower bound for the linear pipeline formula of several stages, (m - 1/v) t_max + Σ t / v + u_max:
        the slowest stage's time and the largest step time are at least their means over the p stages, so the
        step is at least Σ_s (w t_s + u_s / p) with w = (m - 1/v) / p + 1/v, a sum over stages whose least over
        all partitions is a min-sum of each stage's relaxed w t + u / p. ``joint_bound`` adds the fill as every
        layer's fastest time, whatever its step time; here each layer pays for one candidate in both terms,
        which is tight where the fastest candidates carry a large per-step gradient sync (MoE experts
        replicated over data parallelism) and the plan runs slower ones that shard it."""
        if cc.config.pp == 1 or not self.linear_bounds:
            return 0.0
        cfg = cc.config
        v = pipeline.chunks(cfg.schedule, cfg.virtual_stages)
        weights = [((cfg.micro_batches - 1 / v) / cfg.pp + 1 / v, 1.0 / cfg.pp)]
        if self.lifted:  # and the mean work in the same relaxation
            weights.append(self._mean_work_weights(cfg))
        rows = [self._weighted_stage(cc, s, weights, levels) for s in range(cfg.pp)]
        n = len(self.kinds)
        return self._lift(partition.min_sum_value(n, self._by_start(cc, [r[0] for r in rows])),
                          lambda: partition.min_sum_value(n, self._by_start(cc, [r[1] for r in rows])))

    def fill_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1, splits: int = 8,
                   enough: float = math.inf) -> float:
        """A lower bound for the linear pipeline formula of several stages that keeps the slowest stage and the
        fill on one partition, each stage's one candidate per layer priced in every term it enters.

        The step is (m - 1/v) t_a + u_b + Σ t / v with t_a the slowest stage, u_b the largest step time. For
        every stage s and α in [0, 1], u_b ≥ α u_s + (1 - α) ū (ū the stages' mean), and t_a ≥ t_s, so the step
        is at least a_s + Σ_{r≠s} b_r with a = m t + (α + (1 - α)/p) u and b = t / v + (1 - α)/p u, each relaxed
        per stage over its layers' candidates: max_s (a_s - b_s) + Σ_s b_s, whose least over partitions
        ``partition.min_max_plus_sum_bound`` bounds. α = 1 is tight where the slowest stage syncs the most (an
        edge stage's embedding); α = 1/2 where the fastest candidates sync so much that charging their sync to
        one stage alone lets the others take them for free (Mixtral's replicated experts on 2,048 A100-40GB:
        1.86 % with α = 1 alone, 0.00 % with both). α = 0 as well gained ≤ 0.01 % on the sweep for +24-35 % of the
        certificate's time on deep stacks. ``joint_bound`` takes the slowest stage and the fill apart (the
        min-max partition, every layer's fastest candidate), which misses what balancing costs where an edge
        stage's embedding or LM head leaves whole layers no even split. Stops once a bound reaches ``enough``."""
        if cc.config.pp == 1 or not self.linear_bounds:
            return 0.0
        cfg = cc.config
        v = pipeline.chunks(cfg.schedule, cfg.virtual_stages)
        m, p = float(cfg.micro_batches), float(cfg.pp)
        best = 0.0
        for alpha in (1.0, 0.5):
            if best >= enough:
                break
            shared = (1.0 - alpha) / p
            rows = [self._weighted_stage(cc, s, [(m, alpha + shared), (1 / v, shared)], levels)
                    for s in range(cfg.pp)]
            # (a stage count the relaxation cannot fit is infinite in both: infinite here too, never nan)
            slow = [np.where(np.isfinite(a), a - np.where(np.isfinite(b), b, 0.0), math.inf) for a, b in rows]
            fill = [b for _, b in rows]
            best = max(best, partition.min_max_plus_sum_bound(len(self.kinds), self._by_start(cc, slow),
                                                              self._by_start(cc, fill), splits))
        return self._lift(best, lambda: self.mean_work_bound(cc, levels))

    def mean_work_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> float:
        """A lower bound on the stages' mean work per step, Σ_s (m t_s + u_s) / p: the least over partitions of
        each stage's relaxed m t + u, over p."""
        weights = [self._mean_work_weights(cc.config)]
        rows = [self._weighted_stage(cc, s, weights, levels)[0] for s in range(cc.config.pp)]
        return partition.min_sum_value(len(self.kinds), self._by_start(cc, rows))

    @staticmethod
    def _mean_work_weights(cfg: PipelineConfig) -> tuple[float, float]:
        """(w_t, w_u) of a stage's share of the mean work Σ_s (m t_s + u_s) / p."""
        return cfg.micro_batches / cfg.pp, 1.0 / cfg.pp

    def _lift(self, linear_s: float, mean_work_s: Callable[[], float]) -> float:
        """A bound on the linear formula's step as one on the cost model's (``lifted``: with the mean work's
        bound, computed only then)."""
        if not self.lifted:
            return linear_s
        return float(self.cm.step_bound_from_linear(linear_s, mean_work_s()))

    def one_critical_stage(self, cfg: PipelineConfig) -> bool:
        """Whether the configuration's step is its one stage's m t + u exactly (one stage under the linear
        formula, or under a contended host's, where no rank idles): the weight-m table is then its optimum."""
        return cfg.pp == 1 and self.linear_bounds

    def _fastest_layers_s(self, costs_by_stage: Sequence[dict[Hashable, LayerCosts]]) -> float:
        """Every layer at its kind's fastest candidate on any stage (candidates a cost model cannot price,
        inf or nan, left out): the least the layers' times can sum to."""
        fastest = {k: min(float(np.min(c[k].time_s, initial=math.inf, where=np.isfinite(c[k].time_s)))
                          for c in costs_by_stage) for k in costs_by_stage[0]}
        return sum(fastest[k] for k in self.kinds)

    def compute_floor(self, cfg: PipelineConfig) -> float:
        """A lower bound for a linear pipeline that needs no memory relaxation, checked before anything else
        about ``cfg`` is computed: every layer at its fastest candidate (fixed terms ≥ 0 dropped), so the
        stage times sum to at least Σ t, the slowest is at least Σ t / p, and the step
        (m - 1/v) t_max + Σ t / v is at least ((m - 1/v) / p + 1/v) Σ t. It prunes configurations whose
        bubble alone loses to the incumbent (deep pipelines with few micro-batches) at the cost of the layer
        costs, which the configuration's embedding variants share."""
        if not ((self.slowest_bound or self.lifted) and self.opt.use_bounds):
            return 0.0
        hit = self._floors.get(cfg)
        if hit is None:
            hit = self._floors[cfg] = self._compute_floor(cfg)
        return hit

    def _compute_floor(self, cfg: PipelineConfig) -> float:
        cands = self.space.layer_candidates(self.space.num_gpus // cfg.pp,
                                            self.space.global_batch_size // cfg.micro_batches)
        if not cands:
            return math.inf
        stages = stage_costs.layer_costs_by_stage(self.cm, cfg, cands, self.kinds, self.space.global_batch_size,
                                                  self._memo)
        m = float(cfg.micro_batches)
        v = pipeline.chunks(cfg.schedule, cfg.virtual_stages)
        factor = (m - 1 / v) / cfg.pp + 1 / v if self.linear_bounds else self._formula_m(cfg) / cfg.pp  # slowest ≥ mean
        fastest = self._fastest_layers_s([c for _, c in stages])
        return self._lift(factor * fastest, lambda: m * fastest / cfg.pp)

    # ------------------------------------------------------------------ one configuration
    def solve_config(self, cc: stage_costs.ConfigCosts) -> tuple[float, tuple[int, ...]]:
        n, v = len(self.kinds), cc.config.virtual_stages
        tables: list[np.ndarray] | None = None
        step_tables: list[np.ndarray] | None = None
        matrices: list[np.ndarray] | None = None
        if cc.uniform:
            tables, step_tables = [], []
            for s in range(cc.config.pp):
                tab = self.table(cc, s, self._max_len(cc, s, 0))
                tables.append(np.where(np.arange(1, len(tab.time_s) + 1) < v, math.inf, tab.time_s))
                step_tables.append(tab.step_s)
        elif partition.compositions(n, cc.config.pp) > self.opt.exhaustive_partition_limit:
            matrices = [self._stage_matrix(cc, s) for s in range(cc.config.pp)]
        variants = None if self.one_critical_stage(cc.config) else self._variants(cc)
        res = partition.search(n, cc.config.pp, self._lookup(cc), self._pipe(cc),
                               memory_weights=self._memory_weights(cc),
                               exhaustive_limit=self.opt.exhaustive_partition_limit, tables=tables,
                               step_tables=step_tables, variants=variants, matrices=matrices)
        self._picks[(cc.config, res.parts)] = res.variant
        self.solved.add(cc.config)
        return res.step_time_s, res.parts

    def finish(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...], step_s: float, refined: bool = False
               ) -> tuple[PlanStrategy, float]:
        """The chosen configuration's plan, refined (unless ``refined`` already), polished and its layers
        swapped, and its step time."""
        if not refined:
            step_s = self.refine(cc, parts, step_s)
        step_s = self.swap(cc, parts, self.polish(cc, parts, step_s))
        return self.build_plan(cc, parts), step_s

    def over_time(self) -> bool:
        return self.opt.time_limit_s is not None and time.perf_counter() - self.started > self.opt.time_limit_s

    def refine_rivals(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...], step_s: float,
                      ranking: list[ConfigOutcome], costs: dict[PipelineConfig, stage_costs.ConfigCosts]
                      ) -> tuple[stage_costs.ConfigCosts, tuple[int, ...], float]:
        """The winner refined and swapped, then, under a non-linear pipeline formula, every other solved
        configuration whose lower bound lies below it: that can reorder them (on a 3-layer case the runner-up,
        refined, was 8.6 % faster than the refined winner). ``ranking`` is updated in place with the improved
        step times. Rivals get ``rival_refine_rounds`` local rounds only: every weight for every rival
        doubled the Galvatron bench's DP runs. A linear formula needs no rivals (measured: no gap without).
        """
        best = (cc, parts, self.swap(cc, parts, self.refine(cc, parts, step_s)))
        if self.linear:
            return best
        for i, o in enumerate(ranking):
            if o.config == cc.config:
                ranking[i] = replace(o, step_time_s=best[2])
                continue
            if o.lower_bound_s >= best[2] * (1 - 1e-12) or not math.isfinite(o.step_time_s):
                continue  # (infinite: no partition fits, the relaxation that ranked it notwithstanding)
            if self.over_time():
                self.time_limited = True
                continue
            rival = costs[o.config]
            v = self.swap(rival, o.parts, self.refine(rival, o.parts, o.step_time_s, self.opt.rival_refine_rounds))
            ranking[i] = replace(o, step_time_s=v)
            if v < best[2]:
                best = (rival, o.parts, v)
        if best[0] is not cc:  # a new winner: its full refinement
            v = self.swap(best[0], best[1], self.refine(*best))
            ranking[:] = [replace(o, step_time_s=v) if o.config == best[0].config else o for o in ranking]
            best = (best[0], best[1], v)
        return best

    def refine(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...], step_s: float,
               rounds: int | None = None) -> float:
        """The chosen plan's stages re-solved with more weights between time and step time; returns the
        step time, improved or not.

        A weight w finds the stage plan least in w x time + step time: a point of the lower convex hull of
        the stage's (time, step time) front. Between two hull points a and b, the weight that ranks them
        equal, (u_a - u_b) / (t_b - t_a), either finds a point below their chord or proves there is none, so
        repeating it finds a stage's hull (a dichotomic search; a fixed sweep of weights left a 2.4 % gap on a
        3-layer case). Each round splits the gaps next to each stage's picked point, then picks again. Points
        off the hull no weight finds (``swap`` goes there). A linear pipeline formula needs only the fixed
        sweep (measured: exact on 1,995 random cases). ``rounds``: for a rival, only that many rounds."""
        if self.one_critical_stage(cc.config):
            return step_s
        sweep = stage_costs.sweep_weights(float(cc.config.micro_batches))
        if self.linear:
            seeds, rounds = sweep, 0
        elif rounds is None:  # (1e-6: the step-time end of every hull)
            seeds, rounds = (1e-6, *sweep), self.opt.refine_rounds
        else:
            seeds = ()
        for w in seeds:
            self._add_weight(cc, w)
        v, pick = partition.best_variants(parts, self._variants(cc), self._pipe(cc))
        for _ in range(rounds):
            if not pick or not [w for w in self._hull_gap_weights(cc, parts, pick) if self._add_weight(cc, w)]:
                break
            v, pick = partition.best_variants(parts, self._variants(cc), self._pipe(cc))
        if v < step_s:
            self._picks[(cc.config, parts)] = pick
            return v
        return step_s

    @staticmethod
    def _add_weight(cc: stage_costs.ConfigCosts, w: float) -> bool:
        """Append ``w`` to the configuration's weights unless one is within rounding of it (earlier picks
        index a prefix: they stay valid)."""
        if not (math.isfinite(w) and w > 0) or any(math.isclose(w, x, rel_tol=1e-9) for x in cc.time_weights):
            return False
        cc.time_weights = (*cc.time_weights, w)
        return True

    def _hull_gap_weights(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...], pick: tuple[int, ...]
                          ) -> list[float]:
        """Per stage of ``parts``, the weights between the point of weight index ``pick[stage]`` and its two
        neighbours on the lower convex hull of the (time, step time) points the current weights found.

        Only the picked point's gaps: every gap of every stage doubled the Galvatron bench's search times
        for no plan it changed, while the misses this search closes (random small cases) sit next to it."""
        options = self._variants(cc)
        out: list[float] = []
        start = 0
        for s, n in enumerate(parts):
            found = options(s, start, n)
            at = next((t for t, _, i in found if i == pick[s]), math.nan)
            ts, us = bounds.convex_envelope(np.array([t for t, _, _ in found]), np.array([u for _, u, _ in found]))
            # (the gaps whose ends enclose the picked time: its two when it is a vertex, else the one around it)
            out.extend(float((us[j] - us[j + 1]) / (ts[j + 1] - ts[j])) for j in range(len(ts) - 1)
                       if ts[j] <= at <= ts[j + 1])
            start += n
        return out

    def polish(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...], step_s: float) -> float:
        """Mixed layer kinds plan on the DP alone, whose memory bins round up: the chosen plan's stages (its
        partition and per-stage weights fixed) are solved once more with ``polish_factor`` times finer bins,
        kept when faster. Identical layers also get the exact-memory two-strategy table: left alone."""
        f = self.opt.polish_factor
        if cc.uniform or f <= 1 or self.opt.layer_dp == "pareto":  # (exact memory: nothing to refine)
            return step_s
        pick = self._picks.get((cc.config, parts)) or (0,) * len(parts)
        tables, start = [], 0
        for s, n in enumerate(parts):
            self.dp_runs += 1
            tab = stage_table.solve(cc.stages[s], list(range(start, start + n)), self.kinds,
                                    cc.time_weights[pick[s]], self.unit / f, self.limit, self.opt.peak_levels,
                                    self.opt.dp_work_limit)
            if not tab.feasible(n):
                return step_s
            tables.append(tab)
            start += n
        v = self._pipe(cc)([float(t.time_s[-1]) for t in tables], [float(t.step_s[-1]) for t in tables])
        if v >= step_s:
            return step_s
        self._final_tables[(cc.config, parts)] = tables
        self._swapped.pop((cc.config, parts), None)  # (``swap`` starts again from the finer tables)
        return v

    def _stage_matrix(self, cc: stage_costs.ConfigCosts, stage: int) -> np.ndarray:
        """Stage time by [start, layer count] (inf: infeasible), from one table per phase of the layer kinds."""
        n, v = len(self.kinds), cc.config.virtual_stages
        out = np.full((n, n + 1), math.inf)
        for start in range(n):
            layers = self._max_len(cc, stage, start)
            if not layers:  # (no layer left for this stage once the later ones have one each)
                continue
            tab = self.table(cc, stage, layers)
            k = min(len(tab.time_s), n - start)
            out[start, 1:k + 1] = np.where(np.isfinite(tab.obj[:k]), tab.time_s[:k], math.inf)
        out[:, :v] = math.inf
        return out

    def _memory_weights(self, cc: stage_costs.ConfigCosts) -> list[float]:
        """How many layers each stage can hold at its smallest per-layer memory (BMW's memory balance)."""
        out = []
        for st in cc.stages:
            per_layer = min(float(np.min(st.memory(k) + st.costs[k].peak_extra_bytes / max(1, len(self.kinds))))
                            for k in st.costs)
            room = max(self.limit - st.fixed_memory(), 1.0)
            out.append(room / max(per_layer, 1.0))
        return out

    def choices(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...]) -> list[list[int]]:
        """Per stage of the plan, the candidate index of each layer."""
        swapped = self._swapped.get((cc.config, parts))
        if swapped:
            return swapped
        out, start = [], 0
        pick = self._picks.get((cc.config, parts)) or (0,) * len(parts)
        final = self._final_tables.get((cc.config, parts))
        for s, n in enumerate(parts):
            tab = final[s] if final else self.table(cc, s, self._max_len(cc, s, start), cc.time_weights[pick[s]])
            out.append(tab.choice(n))
            start += n
        return out

    def swap(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...], step_s: float) -> float:
        """The plan's layers changed one at a time while the cost model's pipeline formula says faster
        (``swaps``): for formulas the weighted DP does not capture exactly. A linear pipeline's is captured
        (measured: no gap on 1,995 random cases), so it is left alone, and so is one critical stage."""
        if self.linear or self.one_critical_stage(cc.config) or self.opt.swap_moves <= 0:
            return step_s
        ends = list(itertools.accumulate(parts))
        kinds = [self.kinds[end - n:end] for n, end in zip(parts, ends, strict=True)]
        got, v = swaps.improve(cc.stages, kinds, self.choices(cc, parts), self.limit, self._pipe(cc),
                               self.opt.swap_moves, self.opt.swap_pairs)
        if v >= step_s:
            return step_s
        self._swapped[(cc.config, parts)] = got
        return v

    def build_plan(self, cc: stage_costs.ConfigCosts, parts: tuple[int, ...]) -> PlanStrategy:
        layers = [cc.candidates[c] for stage in self.choices(cc, parts) for c in stage]
        cfg = cc.config
        return PlanStrategy(pp=cfg.pp, micro_batches=cfg.micro_batches, layers=tuple(layers), stage_layers=parts,
                            schedule=cfg.schedule, virtual_stages=cfg.virtual_stages,
                            embedding=cfg.embedding or EmbeddingStrategy())

    def embedding_variants(self, cfg: PipelineConfig) -> list[PipelineConfig]:
        """``cfg`` with each embedding/LM-head strategy that is Pareto-optimal in the first and last stage's
        fixed time, step time and memory (at most ``embedding_variants``, spread over the front)."""
        if cfg not in self._variants_of:
            self._variants_of[cfg] = self._embedding_variants(cfg)
        return self._variants_of[cfg]

    def _embedding_variants(self, cfg: PipelineConfig) -> list[PipelineConfig]:
        g = self.space.num_gpus // cfg.pp
        rows: list[tuple[EmbeddingStrategy, np.ndarray]] = []
        for emb in self.space.embedding_options(g):
            c = replace(cfg, embedding=emb)
            vec = []
            for s in {0, cfg.pp - 1}:
                ctx = stage_costs.stage_context(c, s, self.space.global_batch_size)
                f = self.cm.stage_fixed(ctx)
                infl = float(self.cm.in_flight_micro_batches(ctx))
                vec += [f.time_s, f.step_time_s, stage_costs.fixed_memory_bytes(f, infl)]
            arr = np.asarray(vec, dtype=float)
            if np.all(np.isfinite(arr)):
                rows.append((emb, arr))
        front = [(e, a) for e, a in rows
                 if not any(np.all(b <= a) and np.any(b < a) for _, b in rows)]
        uniq: dict[tuple[float, ...], EmbeddingStrategy] = {}
        for e, a in front:
            uniq.setdefault(tuple(a), e)  # options the cost model cannot tell apart: keep the first
        ordered = [uniq[k] for k in sorted(uniq, key=lambda a: (a[0] + a[-3], a[2] + a[-1]))]
        k = self.opt.embedding_variants
        if len(ordered) > k:  # spread over the front, both ends kept (k = 1: the first, the fastest)
            ordered = [ordered[round(i * (len(ordered) - 1) / max(k - 1, 1))] for i in range(max(k, 1))]
        return [replace(cfg, embedding=e) for e in ordered]

    def _ordering_bound(self, cc: stage_costs.ConfigCosts, cap: float, levels: int = 1) -> float:
        lb = self.lower_bound(cc, levels) if self.opt.use_bounds else 0.0
        if self.opt.use_bounds and not cc.uniform and lb < cap:
            # mixed kinds solve on the DP alone (costly): order them by the tighter bound too
            lb = max(lb, self.joint_bound(cc, levels))
        return lb

    def embedding_relaxation(self, variants: Sequence[PipelineConfig]) -> stage_costs.ConfigCosts | None:
        """The configuration with every stage's fixed terms at their least over the embedding variants
        (time, step time and each memory part separately): its bounds hold for every variant, since the
        layers' costs do not depend on the embedding and less fixed time or memory never raises a bound.
        A variant the cost model cannot price (infinite fixed time on some stage, e.g. an embedding split
        Galvatron's model has no profile for) holds no plan and is left out; with none left, None."""
        gbs = self.space.global_batch_size
        fixed = [[self.cm.stage_fixed(stage_costs.stage_context(v, s, gbs)) for s in range(v.pp)] for v in variants]
        priced = [i for i, fs in enumerate(fixed) if all(math.isfinite(f.time_s) for f in fs)]
        first = self.config_costs(variants[priced[0]]) if priced else None
        if first is None:
            return None
        stages = [replace(st, fixed=StageFixed(**{k: min(getattr(fixed[i][s], k) for i in priced) for k in
                                                   ("time_s", "step_time_s", "state_bytes", "activation_bytes",
                                                    "other_bytes")}))
                  for s, st in enumerate(first.stages)]
        return replace(first, stages=stages, dp_cache={})

    # ------------------------------------------------------------------ the search
    def search(self, progress: Progress | None = None, configs: Sequence[PipelineConfig] | None = None,
               incumbent_s: float = math.inf) -> PlanResult:
        """Best plan over ``configs`` (default: the whole space). ``incumbent_s``: a step time already
        achieved elsewhere (e.g. a baseline), to prune against from the start."""
        t0 = self.started = time.perf_counter()
        base = list(configs) if configs is not None else self.space.pipeline_configs()
        n_total = 0
        # (bound, pp, m, tie, config, its costs) or, for a configuration's embedding variants bounded
        # together, (bound, pp, m, tie, None, the variants): expanded when they reach the front
        heap: list[tuple[float, int, int, int, PipelineConfig | None, Any]] = []
        tie = itertools.count()

        def push(var: PipelineConfig, cap: float) -> None:
            cc = self.config_costs(var)
            if cc is not None:
                lb = self._ordering_bound(cc, cap)
                if math.isfinite(lb) and lb < cap:
                    heapq.heappush(heap, (lb, var.pp, var.micro_batches, next(tie), var, cc))

        for i, cfg in enumerate(base):
            if self.compute_floor(cfg) >= incumbent_s:
                n_total += 1
                continue
            variants = self.embedding_variants(cfg)
            n_total += len(variants)
            group = self.embedding_relaxation(variants) if self.opt.use_bounds and len(variants) > 1 else None
            if group is not None:
                lb = self._ordering_bound(group, incumbent_s)
                if math.isfinite(lb) and lb < incumbent_s:
                    heapq.heappush(heap, (lb, cfg.pp, cfg.micro_batches, next(tie), None, variants))
            else:
                for var in variants:
                    push(var, incumbent_s)
            if progress and i % 16 == 0:
                progress(0.3 * (i + 1) / len(base), f"bounded {i + 1}/{len(base)} pipeline configurations")
        best_v = incumbent_s
        best: tuple[stage_costs.ConfigCosts, tuple[int, ...]] | None = None
        ranking: list[ConfigOutcome] = []
        solved_costs: dict[PipelineConfig, stage_costs.ConfigCosts] = {}
        solved = 0
        self.time_limited = False
        while heap:
            lb, _, _, _, popped, payload = heapq.heappop(heap)
            if lb >= best_v * (1 - 1e-12):
                break
            if popped is None:  # embedding variants bounded together: now each with its own bound
                for variant in payload:
                    push(variant, best_v)
                continue
            cfg, cc = popped, payload
            if self.over_time() and (best is not None or math.isfinite(incumbent_s)):
                self.time_limited = True
                break
            # (mixed kinds have it in lb already)
            if self.opt.use_bounds and cc.uniform and self.joint_bound(cc) >= best_v * (1 - 1e-12):
                continue
            v, parts = self.solve_config(cc)
            solved += 1
            ranking.append(ConfigOutcome(cfg, v, parts, lb))
            solved_costs[cfg] = cc
            if v < best_v:
                best_v, best = v, (cc, parts)
            if progress and (solved % 4 == 1):
                progress(0.3 + 0.7 * min(1.0, solved / max(1, len(heap) + solved)),
                         f"pp={cfg.pp} m={cfg.micro_batches} {cfg.schedule}: best {best_v:.4g} s/step")
        pruned = n_total - solved  # by a bound (or by the time limit)
        # kept for the caller when nothing beats the incumbent: the search did run, and says how much
        self.last_counts = (n_total, solved, pruned)
        if best is None:
            raise LookupError("no pipeline configuration fits in memory (or beats the incumbent)")
        cc, parts, best_v = self.refine_rivals(*best, best_v, ranking, solved_costs)
        ranking.sort(key=lambda o: o.step_time_s)
        plan, best_v = self.finish(cc, parts, best_v, refined=True)
        return PlanResult(plan, best_v, n_total, solved, pruned, self.dp_runs, time.perf_counter() - t0, ranking,
                          self.time_limited)

    # ------------------------------------------------------------------ infeasibility
    def min_memory_bytes(self) -> float:
        """The least per-GPU memory any plan in the space needs (for the infeasibility message): over every
        configuration and embedding variant, the best partition, with every layer at its smallest candidate
        under a cap on the stage's transient (a stage's peak holds its largest layer transient, so the
        smallest resident memory and the smallest transient usually belong to different candidates and
        their sum is no plan's memory)."""
        best = math.inf
        for base in self.space.pipeline_configs():
            for cfg in self.embedding_variants(base) or [base]:
                cc = self.config_costs(cfg)
                if cc is not None:
                    best = min(best, self._min_memory(cc))
        return best

    def _min_memory(self, cc: stage_costs.ConfigCosts) -> float:
        fixed, per_layer, cum = [], [], []
        for st in cc.stages:
            levels, per_kind = transient_levels(st)
            fixed.append(st.fixed_memory() + levels)
            per_layer.append(per_kind[self.kinds[0]])
            cum.append(np.concatenate([np.zeros((levels.size, 1)),
                                       np.cumsum(np.stack([per_kind[k] for k in self.kinds], axis=1), axis=1)],
                                      axis=1))
        if cc.uniform:
            return partition.min_max_linear(len(self.kinds), fixed, per_layer)
        return partition.min_max_prefix(fixed, cum)
