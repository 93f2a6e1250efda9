"""Lower bounds on a pipeline configuration's step time, each from the stages' relaxed values (``relaxation``).

Which bounds hold depends on the cost model's pipeline formula (``PipelineTraits``): the linear formula's own, the
same lifted through a formula bounded by it, at least m × the slowest stage, or Galvatron's chain. The search
orders configurations by them; the certificate takes the least of the true ones over the space.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from solvers.cost_model import pipeline
from solvers.cost_model.base import CostModel, LayerCosts
from solvers.hybrid import partition, stage_costs
from solvers.hybrid.options import PlannerOptions
from solvers.hybrid.relaxation import StageRelaxation
from solvers.hybrid.space import PipelineConfig, SearchSpace
from solvers.hybrid.tables import StageTables


def mean_work_weights(cfg: PipelineConfig) -> tuple[float, float]:
    """(w_t, w_u) of a stage's share of the mean work Σ_s (m t_s + u_s) / p."""
    return cfg.micro_batches / cfg.pp, 1.0 / cfg.pp


class ConfigBounds(StageTables):
    """The request's tables with the bounds its cost model's pipeline formula admits."""

    def __init__(self, cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable] | None = None,
                 options: PlannerOptions | None = None):
        super().__init__(cm, space, kinds, options)
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
        self.relax = StageRelaxation(self)
        self._floors: dict[PipelineConfig, float] = {}  # the search and the certificate ask for the same ones
        self._middle_floors: dict[PipelineConfig, float] = {}
        self._layer_floors: dict[PipelineConfig, float | None] = {}

    def lower_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> float:
        """A lower bound on the configuration's step time from each stage's relaxed time and step time (for
        one stage of a linear pipeline: its relaxed m t + u, the step itself)."""
        n = len(self.kinds)
        m = float(cc.config.micro_batches)
        single = self.one_critical_stage(cc.config)
        per_stage = []  # each stage's relaxed time and step time, its fixed terms included
        for s in range(cc.config.pp):
            if single:  # relaxed together: tighter than t and u each with the whole memory budget
                (joint,) = self.relax.weighted(cc, s, [(m, 1.0)], levels)
                per_stage.append((joint / m, np.zeros_like(joint)))
            else:
                t, u = self.relax.weighted(cc, s, [(1.0, 0.0), (0.0, 1.0)], levels)
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
            tables = self.relax.by_start(cc, [t for t, _ in per_stage])
            step_tables = [u[1:] for _, u in per_stage]
        else:
            matrices = self.relax.by_start(cc, [t for t, _ in per_stage])
        # small: every partition (a true bound); large: the min-max and even partitions of the relaxation
        res = partition.search(n, cc.config.pp, look, self.pipeline_time(cc),
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
                   for x in self.relax.weighted(cc, 0, [(1.0, 0.0), (0.0, 1.0), (m, 1.0)], levels))
        if not all(map(math.isfinite, (a, b, r))) or n < cc.config.virtual_stages:
            return math.inf
        c_end = max(a, (r - b) / m)
        cs = [a + (c_end - a) * i / pieces for i in range(pieces + 1)]
        us = [max(b, r - m * c) for c in cs]
        ctx0 = st.ctx
        return min(float(self.cm.pipeline_step_time([cs[i]], [us[i + 1]], ctx0)) for i in range(pieces))

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
        times = self.relax.stage_times(cc, levels)
        chain = [t * (m if s == p - 1 else 1.0) for s, t in enumerate(times)]
        slow = [m * t for t in times]
        if self.first_sync:  # (B_0 - C_0 leaves out the first stage's fixed time)
            if not math.isfinite(cc.stages[0].fixed.time_s):
                return math.inf  # the model prices no plan of this configuration (e.g. its embedding split)
            first = self.relax.weighted(cc, 0, [(1.0, 1.0), (m, 1.0)], levels)
            chain[0], slow[0] = self.relax.by_start(cc, [x - cc.stages[0].fixed.time_s for x in first])
            # every later stage q adds U_q - F_q - Σ_{j<q} C_j ≥ U_q - F_q - q max C: the step is at least
            # (m - q) C_q + U_q - F_q too (F_q's weight m - q - 1 ≥ 0: a relaxed least F still bounds)
            for q in range(1, min(p, int(m))):
                (w,) = self.relax.weighted(cc, q, [(m - q, 1.0)], levels)
                slow[q] = np.maximum(slow[q], self.relax.by_start(cc, [w - cc.stages[q].fixed.time_s])[0])
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
            (w,) = self.relax.weighted(cc, 0, [(lam + (1.0 - lam) * m, 1.0)], levels)
            (first,) = self.relax.by_start(cc, [w - cc.stages[0].fixed.time_s])
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
                                                                  self.relax.stage_times(cc, levels))
        v = pipeline.chunks(cfg.schedule, cfg.virtual_stages)
        rows = self.relax.by_start(cc, [self.relax.weighted(cc, s, [(m, 1.0)], levels)[0] for s in range(cfg.pp)])
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
            weights.append(mean_work_weights(cfg))
        rows = [self.relax.weighted(cc, s, weights, levels) for s in range(cfg.pp)]
        n = len(self.kinds)
        return self._lift(partition.min_sum_value(n, self.relax.by_start(cc, [r[0] for r in rows])),
                          lambda: partition.min_sum_value(n, self.relax.by_start(cc, [r[1] for r in rows])))

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
            rows = [self.relax.weighted(cc, s, [(m, alpha + shared), (1 / v, shared)], levels)
                    for s in range(cfg.pp)]
            # (a stage count the relaxation cannot fit is infinite in both: infinite here too, never nan)
            slow = [np.where(np.isfinite(a), a - np.where(np.isfinite(b), b, 0.0), math.inf) for a, b in rows]
            fill = [b for _, b in rows]
            best = max(best, partition.min_max_plus_sum_bound(len(self.kinds), self.relax.by_start(cc, slow),
                                                              self.relax.by_start(cc, fill), splits))
        return self._lift(best, lambda: self.mean_work_bound(cc, levels))

    def mean_work_bound(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> float:
        """A lower bound on the stages' mean work per step, Σ_s (m t_s + u_s) / p: the least over partitions of
        each stage's relaxed m t + u, over p."""
        weights = [mean_work_weights(cc.config)]
        rows = [self.relax.weighted(cc, s, weights, levels)[0] for s in range(cc.config.pp)]
        return partition.min_sum_value(len(self.kinds), self.relax.by_start(cc, rows))


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

    def _fastest_layers_s(self, costs_by_stage: Sequence[dict[Hashable, LayerCosts]], step_weight: float = 0.0
                          ) -> float:
        """Every layer at its kind's fastest candidate on any stage (candidates a cost model cannot price,
        inf or nan, left out): the least the layers' times can sum to. With ``step_weight`` w, the least of
        Σ (t + w u) over the layers, each candidate's per-micro-batch time t and step time u taken together."""
        distinct = list({id(c): c for c in costs_by_stage}.values())  # stages priced alike share their dict

        def least(c: LayerCosts) -> float:
            if not step_weight:
                return float(np.min(c.time_s, initial=math.inf, where=np.isfinite(c.time_s)))
            both = c.time_s + step_weight * c.step_time_s
            return float(np.min(both, initial=math.inf, where=np.isfinite(both)))

        fastest = {k: min(least(c[k]) for c in distinct) for k in costs_by_stage[0]}
        return sum(fastest[k] for k in self.kinds)

    def compute_floor(self, cfg: PipelineConfig) -> float:
        """A lower bound for a linear pipeline that needs no memory relaxation, checked before anything else
        about ``cfg`` is computed: every layer at its best candidate (fixed terms ≥ 0 dropped). The stage times
        sum to Σ t, the slowest is at least Σ t / p, and the step (m - 1/v) t_max + Σ t / v + max_s u_s is at
        least a Σ t + Σ u / p with a = (m - 1/v) / p + 1/v (the slowest stage's step time u_s at least the mean
        of the stages'), so at least Σ over the layers of the least a t + u / p over a layer's candidates, each
        candidate's time and step time together (a fast layer whose gradient sync shows in the step time
        gains less than its time says). It prunes configurations whose bubble alone loses to the incumbent
        (deep pipelines with few micro-batches) at the cost of the layer costs, which the configuration's
        embedding variants share."""
        if not self._floors_apply:
            return 0.0
        hit = self._floors.get(cfg)
        if hit is None:
            hit = self._floors[cfg] = self._compute_floor(cfg)
        return hit

    def middle_floor(self, cfg: PipelineConfig) -> float:
        """``compute_floor`` with the middle stages' fixed terms (pipeline hand-overs, per-micro-batch overheads),
        which the embedding does not change (``CostModel.stage_fixed``), added to the stages' times and step
        times; the edge stages' still dropped. Asked where a configuration's floor reached the front of the
        search: costlier than the floor (a question per stage), cheaper than its embedding variants' bounds."""
        if cfg.pp <= 2 or not self._floors_apply:
            return self.compute_floor(cfg)
        hit = self._middle_floors.get(cfg)
        if hit is None:
            gbs = self.space.global_batch_size
            middle = [self.cm.stage_fixed(stage_costs.stage_context(cfg, s, gbs)) for s in range(1, cfg.pp - 1)]
            hit = self._middle_floors[cfg] = self._compute_floor(cfg, sum(f.time_s for f in middle),
                                                                 sum(f.step_time_s for f in middle))
        return hit

    @property
    def _floors_apply(self) -> bool:
        """Whether the floors bound this cost model's pipeline formula (else they are 0)."""
        return bool((self.slowest_bound or self.lifted) and self.opt.use_bounds)

    def _slowest_weight(self, cfg: PipelineConfig) -> float:
        """a = (m - 1/v) / p + 1/v: the linear formula's step is at least a Σ_s t_s (+ the slowest step time)."""
        v = pipeline.chunks(cfg.schedule, cfg.virtual_stages)
        return (cfg.micro_batches - 1 / v) / cfg.pp + 1 / v

    def _layers_floor(self, cfg: PipelineConfig) -> float | None:
        """The layers' part of the floors: Σ over the layers of the least a t + u / p (linear formula) or of the
        least t (other formulas); None where a stage has no candidate. Cached: both floors read it."""
        if cfg not in self._layer_floors:
            stages = self.layer_costs_by_stage(cfg)
            step_weight = 1 / (self._slowest_weight(cfg) * cfg.pp) if self.linear_bounds else 0.0
            self._layer_floors[cfg] = None if stages is None else self._fastest_layers_s(stages, step_weight)
        return self._layer_floors[cfg]

    def _compute_floor(self, cfg: PipelineConfig, fixed_s: float = 0.0, fixed_step_s: float = 0.0) -> float:
        """The floor with ``fixed_s`` and ``fixed_step_s`` of the stages' fixed times and step times counted."""
        layers = self._layers_floor(cfg)
        if layers is None:
            return math.inf
        if self.linear_bounds:
            floor = self._slowest_weight(cfg) * (layers + fixed_s) + fixed_step_s / cfg.pp
        else:  # slowest ≥ mean (the formula's own step-time term left out)
            floor = self._formula_m(cfg) / cfg.pp * (layers + fixed_s)

        def mean_work_s() -> float:  # (asked only where the bound is lifted)
            stages = self.layer_costs_by_stage(cfg)
            assert stages is not None
            return float(cfg.micro_batches) * self._fastest_layers_s(stages) / cfg.pp

        return self._lift(floor, mean_work_s)

    def ordering_bound(self, cc: stage_costs.ConfigCosts, cap: float, levels: int = 1) -> float:
        """The bound the search orders configurations by and stops on; for a configuration with too many
        partitions to enumerate a heuristic (the relaxation's best of a few), which the certificate makes up for."""
        lb = self.lower_bound(cc, levels) if self.opt.use_bounds else 0.0
        if self.opt.use_bounds and not cc.uniform and lb < cap:
            # mixed kinds solve on the DP alone (costly): order them by the tighter bound too
            lb = max(lb, self.joint_bound(cc, levels))
        return lb
