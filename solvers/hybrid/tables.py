"""One request's cost-model answers and layer-DP tables, and the look-ups the partition search takes from them.

Cost-model answers are cached per (layer kind, stage context) and DP tables per (configuration, stage, phase of
the layer kinds), so the search, its bounds, the refinement and the certificate never compute anything twice.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import replace

import numpy as np

from solvers.cost_model.base import CostModel, LayerCosts, StageFixed
from solvers.hybrid import partition, stage_costs, stage_table
from solvers.hybrid.options import PlannerOptions
from solvers.hybrid.space import PipelineConfig, SearchSpace
from solvers.strategy import EmbeddingStrategy, LayerStrategy


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


class StageTables:
    """The request (cost model, space, layer kinds, options) and everything computed from it once."""

    def __init__(self, cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable] | None = None,
                 options: PlannerOptions | None = None):
        self.cm, self.space = cm, space
        self.kinds: Sequence[Hashable] = list(kinds) if kinds is not None else list(range(space.num_layers))
        self.opt = options or PlannerOptions()
        self.limit = float(cm.memory_limit_bytes)
        self.period = kind_period(self.kinds)
        self.unit = self.opt.memory_unit_bytes or stage_costs.memory_unit(self.limit, self.memory_bins())
        self._costs: dict[PipelineConfig, stage_costs.ConfigCosts | None] = {}
        self._tables: dict[tuple[object, ...], stage_table.StageTable] = {}
        self._memo: dict[tuple[object, ...], object] = {}
        self._variants_of: dict[PipelineConfig, list[PipelineConfig]] = {}
        self.dp_runs = 0

    def memory_bins(self) -> int:
        """The DP's memory resolution. Identical layers mostly skip the DP (the exact two-strategy table);
        mixed layer kinds run it per stage and phase over every layer, so deep mixed models get coarser bins
        (rounded up: plans still fit) and the work per table stays that of a 32-layer model."""
        n = max(len(self.kinds), 1)
        if self.period == 1 or n <= 32:
            return self.opt.memory_bins
        return max(self.opt.min_memory_bins, self.opt.memory_bins * 32 // n)

    # ------------------------------------------------------------------ cost-model answers
    def candidates(self, cfg: PipelineConfig) -> Sequence[LayerStrategy]:
        """The layer strategies the space allows on one stage of ``cfg``."""
        return self.space.layer_candidates(self.space.num_gpus // cfg.pp,
                                           self.space.global_batch_size // cfg.micro_batches)

    def config_costs(self, cfg: PipelineConfig) -> stage_costs.ConfigCosts | None:
        if cfg not in self._costs:
            cands = self.candidates(cfg)
            cc = (stage_costs.build(self.cm, cfg, cands, self.kinds, self.space.global_batch_size, self._memo)
                  if cands else None)
            self._costs[cfg] = cc if cc is not None and cc.candidates else None
        return self._costs[cfg]

    def layer_costs_by_stage(self, cfg: PipelineConfig) -> list[dict[Hashable, LayerCosts]] | None:
        """Per stage, each layer kind's costs over the candidates (None: no candidate), without the stages'
        fixed terms: what ``config_costs`` shares with the configuration's embedding variants."""
        cands = self.candidates(cfg)
        if not cands:
            return None
        stages = stage_costs.layer_costs_by_stage(self.cm, cfg, cands, self.kinds, self.space.global_batch_size,
                                                  self._memo)
        return [c for _, c in stages]

    # ------------------------------------------------------------------ layer-DP tables
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
            hit = self._tables[key] = self.solve_stage(st, layers, w, self.unit)
        return hit

    def solve_stage(self, st: stage_costs.StageInputs, layers: Sequence[int], weight: float, unit: float
                    ) -> stage_table.StageTable:
        """One run of the layer DP, uncached (counted in ``dp_runs``)."""
        self.dp_runs += 1
        return stage_table.solve(st, layers, self.kinds, weight, unit, self.limit, self.opt.peak_levels,
                                 self.opt.dp_work_limit, self.opt.layer_dp)

    def table_layers(self, cc: stage_costs.ConfigCosts, stage: int, start: int) -> list[int]:
        """Layers a table for a stage starting at ``start`` covers: from its phase's first occurrence on."""
        n = len(self.kinds)
        return list(range(start % self.period, n - (cc.config.pp - 1 - stage)))

    # ------------------------------------------------------------------ what the partition search takes
    def lookup(self, cc: stage_costs.ConfigCosts) -> partition.StageLookup:
        v = cc.config.virtual_stages

        def look(stage: int, start: int, count: int) -> tuple[float, float]:
            if count < v:
                return math.inf, math.inf
            tab = self.table(cc, stage, self.table_layers(cc, stage, start))
            if not tab.feasible(count):
                return math.inf, math.inf
            return float(tab.time_s[count - 1]), float(tab.step_s[count - 1])

        return look

    def weight_options(self, cc: stage_costs.ConfigCosts) -> partition.StageVariants:
        """Per stage, start and layer count: the (time, step time, weight index) of each time weight's table."""
        v = cc.config.virtual_stages

        def options(stage: int, start: int, count: int) -> list[tuple[float, float, int]]:
            if count < v:
                return []
            out = []
            for i, w in enumerate(cc.time_weights):
                tab = self.table(cc, stage, self.table_layers(cc, stage, start), w)
                if tab.feasible(count):
                    out.append((float(tab.time_s[count - 1]), float(tab.step_s[count - 1]), i))
            return out

        return options

    def pipeline_time(self, cc: stage_costs.ConfigCosts) -> partition.PipelineTime:
        # The cost model's own pipeline formula, nothing on top: a formula that charges less than micro-batches
        # x the slowest stage is the cost model's to fix (Galvatron's model bounds it by default), so that the
        # plan's search value and its estimate are one number.
        ctx0 = cc.stages[0].ctx

        def step(ts: Sequence[float], us: Sequence[float]) -> float:
            return float(self.cm.pipeline_step_time(ts, us, ctx0))

        return step

    def stage_matrix(self, cc: stage_costs.ConfigCosts, stage: int) -> np.ndarray:
        """Stage time by [start, layer count] (inf: infeasible), from one table per phase of the layer kinds."""
        n, v = len(self.kinds), cc.config.virtual_stages
        out = np.full((n, n + 1), math.inf)
        for start in range(n):
            layers = self.table_layers(cc, stage, start)
            if not layers:  # (no layer left for this stage once the later ones have one each)
                continue
            tab = self.table(cc, stage, layers)
            k = min(len(tab.time_s), n - start)
            out[start, 1:k + 1] = np.where(np.isfinite(tab.obj[:k]), tab.time_s[:k], math.inf)
        out[:, :v] = math.inf
        return out

    def memory_weights(self, cc: stage_costs.ConfigCosts) -> list[float]:
        """How many layers each stage can hold at its smallest per-layer memory (BMW's memory balance)."""
        out = []
        for st in cc.stages:
            per_layer = min(float(np.min(st.memory(k) + st.costs[k].peak_extra_bytes / max(1, len(self.kinds))))
                            for k in st.costs)
            room = max(self.limit - st.fixed_memory(), 1.0)
            out.append(room / max(per_layer, 1.0))
        return out

    # ------------------------------------------------------------------ embedding / LM-head strategies
    def embedding_variants(self, cfg: PipelineConfig) -> list[PipelineConfig]:
        """``cfg`` with each embedding/LM-head strategy that is Pareto-optimal in the first and last stage's
        fixed time, step time and memory (at most ``embedding_variants``, spread over the front)."""
        if cfg not in self._variants_of:
            self._variants_of[cfg] = pareto_embeddings(self.cm, self.space, cfg, self.opt.embedding_variants)
        return self._variants_of[cfg]

    def embedding_relaxation(self, variants: Sequence[PipelineConfig]) -> stage_costs.ConfigCosts | None:
        """The configuration with every stage's fixed terms at their least over the embedding variants
        (time, step time and each memory part separately): its bounds hold for every variant, since the
        layers' costs do not depend on the embedding and less fixed time or memory never raises a bound.
        A variant the cost model cannot price (infinite fixed time on some stage, e.g. an embedding split
        Galvatron's model has no profile for) holds no plan and is left out; with none left, None. The
        embedding lives on the first and last stage alone (``pareto_embeddings`` chose the variants on those
        two), so those are the stages asked about each variant; the others' terms are every variant's."""
        gbs = self.space.global_batch_size
        edges = sorted({0, variants[0].pp - 1})
        fixed = [[self.cm.stage_fixed(stage_costs.stage_context(v, s, gbs)) for s in edges] for v in variants]
        priced = [i for i, fs in enumerate(fixed) if all(math.isfinite(f.time_s) for f in fs)]
        first = self.config_costs(variants[priced[0]]) if priced else None
        if first is None or not all(math.isfinite(st.fixed.time_s) for st in first.stages):
            return None
        least = np.min([[(f.time_s, f.step_time_s, f.state_bytes, f.activation_bytes, f.other_bytes)
                          for f in fixed[i]] for i in priced], axis=0)  # [edge stage, term]
        stages = list(first.stages)
        for s, (t, u, state, act, other) in zip(edges, least, strict=True):
            stages[s] = replace(stages[s], fixed=StageFixed(time_s=float(t), step_time_s=float(u),
                                                            state_bytes=float(state), activation_bytes=float(act),
                                                            other_bytes=float(other)))
        return replace(first, stages=stages, dp_cache={})


def pareto_embeddings(cm: CostModel, space: SearchSpace, cfg: PipelineConfig, most: int) -> list[PipelineConfig]:
    """``cfg`` with each embedding/LM-head strategy on the Pareto front of the first and last stage's fixed time,
    step time and memory; at most ``most``, spread over the front."""
    g = space.num_gpus // cfg.pp
    rows: list[tuple[EmbeddingStrategy, np.ndarray]] = []
    for emb in space.embedding_options(g):
        c = replace(cfg, embedding=emb)
        vec = []
        for s in {0, cfg.pp - 1}:
            ctx = stage_costs.stage_context(c, s, space.global_batch_size)
            f = cm.stage_fixed(ctx)
            infl = float(cm.in_flight_micro_batches(ctx))
            vec += [f.time_s, f.step_time_s, stage_costs.fixed_memory_bytes(f, infl)]
        arr = np.asarray(vec, dtype=float)
        if np.all(np.isfinite(arr)):
            rows.append((emb, arr))
    if not rows:
        return []
    vecs = np.stack([a for _, a in rows])  # [option, term]; row i is dominated by a row j no worse and better somewhere
    no_worse = np.all(vecs[None, :, :] <= vecs[:, None, :], axis=2)
    better = np.any(vecs[None, :, :] < vecs[:, None, :], axis=2)
    front = [row for row, dominated in zip(rows, np.any(no_worse & better, axis=1), strict=True) if not dominated]
    uniq: dict[tuple[float, ...], EmbeddingStrategy] = {}
    for e, a in front:
        uniq.setdefault(tuple(a), e)  # options the cost model cannot tell apart: keep the first
    ordered = [uniq[k] for k in sorted(uniq, key=lambda a: (a[0] + a[-3], a[2] + a[-1]))]
    if len(ordered) > most:  # spread over the front, both ends kept (most = 1: the first, the fastest)
        ordered = [ordered[round(i * (len(ordered) - 1) / max(most - 1, 1))] for i in range(max(most, 1))]
    return [replace(cfg, embedding=e) for e in ordered]
