"""A configuration's plan: its partition solved over the stage tables, then refined, and read out as a plan.

The tables are solved at a few time weights (w x time + step time per stage); the search picks one per stage.
The chosen plan's stages then get more weights (a dichotomic search over the lower convex hull of each stage's
(time, step time) points), for mixed layer kinds finer memory bins (``polish``), and single-layer changes priced
by the cost model's own pipeline formula (``swaps``; under a non-linear formula, two-layer changes too).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence

import numpy as np

from solvers.cost_model.base import CostModel
from solvers.hybrid import bounds, partition, stage_costs, stage_table, swaps
from solvers.hybrid.config_bounds import ConfigBounds
from solvers.hybrid.options import PlannerOptions
from solvers.hybrid.space import PipelineConfig, SearchSpace
from solvers.strategy import EmbeddingStrategy, PlanStrategy

Parts = tuple[int, ...]  # layers per stage


def add_weight(cc: stage_costs.ConfigCosts, w: float) -> bool:
    """Append ``w`` to the configuration's weights unless one is within rounding of it (earlier picks
    index a prefix: they stay valid)."""
    if not (math.isfinite(w) and w > 0) or any(math.isclose(w, x, rel_tol=1e-9) for x in cc.time_weights):
        return False
    cc.time_weights = (*cc.time_weights, w)
    return True


class PlanRefinement(ConfigBounds):
    """The request's bounds with the plans of the configurations it solved."""

    def __init__(self, cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable] | None = None,
                 options: PlannerOptions | None = None):
        super().__init__(cm, space, kinds, options)
        # per stage of a plan, the index of the time weight whose table it takes
        self._picks: dict[tuple[PipelineConfig, Parts], Parts] = {}
        # per-stage tables of exactly a plan's stages (``polish``), used instead of the shared prefix tables
        self._final_tables: dict[tuple[PipelineConfig, Parts], list[stage_table.StageTable]] = {}
        # per stage, a candidate index per layer: a plan's stages changed by ``swap``, used instead of any table
        self._swapped: dict[tuple[PipelineConfig, Parts], list[list[int]]] = {}
        self.solved: set[PipelineConfig] = set()  # embedding variants solved (by the search or the certificate)

    def solve_config(self, cc: stage_costs.ConfigCosts) -> tuple[float, Parts]:
        """The configuration's best partition over its stage tables (step time, layers per stage); the weight
        each stage's table was picked at is kept for the refinement."""
        n, v = len(self.kinds), cc.config.virtual_stages
        tables: list[np.ndarray] | None = None
        step_tables: list[np.ndarray] | None = None
        matrices: list[np.ndarray] | None = None
        if cc.uniform:
            tables, step_tables = [], []
            for s in range(cc.config.pp):
                tab = self.table(cc, s, self.table_layers(cc, s, 0))
                tables.append(np.where(np.arange(1, len(tab.time_s) + 1) < v, math.inf, tab.time_s))
                step_tables.append(tab.step_s)
        elif partition.compositions(n, cc.config.pp) > self.opt.exhaustive_partition_limit:
            matrices = [self.stage_matrix(cc, s) for s in range(cc.config.pp)]
        variants = None if self.one_critical_stage(cc.config) else self.weight_options(cc)
        res = partition.search(n, cc.config.pp, self.lookup(cc), self.pipeline_time(cc),
                               memory_weights=self.memory_weights(cc),
                               exhaustive_limit=self.opt.exhaustive_partition_limit, tables=tables,
                               step_tables=step_tables, variants=variants, matrices=matrices)
        self._picks[(cc.config, res.parts)] = res.variant
        self.solved.add(cc.config)
        return res.step_time_s, res.parts

    def finish(self, cc: stage_costs.ConfigCosts, parts: Parts, step_s: float, refined: bool = False
               ) -> tuple[PlanStrategy, float]:
        """The chosen configuration's plan, refined (unless ``refined`` already), polished and its layers
        swapped, and its step time."""
        if not refined:
            step_s = self.refine(cc, parts, step_s)
        step_s = self.swap(cc, parts, self.polish(cc, parts, step_s))
        return self.build_plan(cc, parts), step_s

    def refine(self, cc: stage_costs.ConfigCosts, parts: Parts, step_s: float, rounds: int | None = None) -> float:
        """The chosen plan's stages re-solved with more weights between time and step time; returns the
        step time, improved or not.

        A weight w finds the stage plan least in w x time + step time: a point of the lower convex hull of
        the stage's (time, step time) front. Between two hull points a and b, the weight that ranks them
        equal, (u_a - u_b) / (t_b - t_a), either finds a point below their chord or proves there is none, so
        repeating it finds a stage's hull (a dichotomic search; a fixed sweep of weights left a 2.4 % gap on a
        3-layer case). Each round splits the gaps next to each stage's picked point, then picks again. Points
        off the hull, or on a hull edge between two vertices, no weight finds (``swap`` goes there). A linear
        pipeline formula takes only the fixed sweep (measured: exact on 1,995 random synthetic cases; the
        mixed-cluster miss traced lay on a hull edge, which more weights do not reach). ``rounds``: for a rival,
        only that many rounds."""
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
            add_weight(cc, w)
        v, pick = partition.best_variants(parts, self.weight_options(cc), self.pipeline_time(cc))
        for _ in range(rounds):
            if not pick or not [w for w in self._hull_gap_weights(cc, parts, pick) if add_weight(cc, w)]:
                break
            v, pick = partition.best_variants(parts, self.weight_options(cc), self.pipeline_time(cc))
        if v < step_s:
            self._picks[(cc.config, parts)] = pick
            return v
        return step_s

    def _hull_gap_weights(self, cc: stage_costs.ConfigCosts, parts: Parts, pick: Parts) -> list[float]:
        """Per stage of ``parts``, the weights between the point of weight index ``pick[stage]`` and its two
        neighbours on the lower convex hull of the (time, step time) points the current weights found.

        Only the picked point's gaps: every gap of every stage doubled the Galvatron bench's search times
        for no plan it changed, while the misses this search closes (random small cases) sit next to it."""
        options = self.weight_options(cc)
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

    def polish(self, cc: stage_costs.ConfigCosts, parts: Parts, step_s: float) -> float:
        """Mixed layer kinds plan on the DP alone, whose memory bins round up: the chosen plan's stages (its
        partition and per-stage weights fixed) are solved once more with ``polish_factor`` times finer bins,
        kept when faster. Identical layers also get the exact-memory two-strategy table: left alone."""
        f = self.opt.polish_factor
        if cc.uniform or f <= 1 or self.opt.layer_dp == "pareto":  # (exact memory: nothing to refine)
            return step_s
        pick = self._picks.get((cc.config, parts)) or (0,) * len(parts)
        tables, start = [], 0
        for s, n in enumerate(parts):
            tab = self.solve_stage(cc.stages[s], list(range(start, start + n)), cc.time_weights[pick[s]],
                                   self.unit / f)
            if not tab.feasible(n):
                return step_s
            tables.append(tab)
            start += n
        v = self.pipeline_time(cc)([float(t.time_s[-1]) for t in tables], [float(t.step_s[-1]) for t in tables])
        if v >= step_s:
            return step_s
        self._final_tables[(cc.config, parts)] = tables
        self._swapped.pop((cc.config, parts), None)  # (``swap`` starts again from the finer tables)
        return v

    def choices(self, cc: stage_costs.ConfigCosts, parts: Parts) -> list[list[int]]:
        """Per stage of the plan, the candidate index of each layer."""
        swapped = self._swapped.get((cc.config, parts))
        if swapped:
            return swapped
        out, start = [], 0
        pick = self._picks.get((cc.config, parts)) or (0,) * len(parts)
        final = self._final_tables.get((cc.config, parts))
        for s, n in enumerate(parts):
            tab = final[s] if final else self.table(cc, s, self.table_layers(cc, s, start), cc.time_weights[pick[s]])
            out.append(tab.choice(n))
            start += n
        return out

    def swap(self, cc: stage_costs.ConfigCosts, parts: Parts, step_s: float) -> float:
        """The plan's layers changed one at a time while the cost model's pipeline formula says faster
        (``swaps``): the weighted DP finds only vertices of each stage's (time, step time) hull, while the
        formula's max over stages can make a point off them best, even under the linear formula: a stage of
        identical layers mixing two strategies lies on the edge between the two pure stages, which no weight
        ranks first (``bench/exactness.py --hetero --seeds 120 1200``: 11 of 950 cases up to 1.74 % slower than
        enumeration without swaps under the linear formula, 1 at 0.14 % with). Under the linear formula single
        changes only: pairs found nothing more there or on the 158 plans of ``bench/hybrid.py --sweep`` and cost
        up to 3 s CPU on the largest of them. One critical stage is left alone (its weight-m table is exact)."""
        if self.one_critical_stage(cc.config) or self.opt.swap_moves <= 0:
            return step_s
        ends = list(itertools.accumulate(parts))
        kinds = [self.kinds[end - n:end] for n, end in zip(parts, ends, strict=True)]
        got, v = swaps.improve(cc.stages, kinds, self.choices(cc, parts), self.limit, self.pipeline_time(cc),
                               self.opt.swap_moves, self.opt.swap_pairs and not self.linear)
        # ``v`` prices the choices exactly, as the cost model's evaluate does; ``step_s`` is the tables' figure for
        # the choices the swaps started from, which a weighted table can put a hair off (a random case under
        # Galvatron's formula: 0.0797 s claimed for a plan of 0.0801 s). The exact one stands.
        self._swapped[(cc.config, parts)] = got
        return v

    def build_plan(self, cc: stage_costs.ConfigCosts, parts: Parts) -> PlanStrategy:
        layers = [cc.candidates[c] for stage in self.choices(cc, parts) for c in stage]
        cfg = cc.config
        return PlanStrategy(pp=cfg.pp, micro_batches=cfg.micro_batches, layers=tuple(layers), stage_layers=parts,
                            schedule=cfg.schedule, virtual_stages=cfg.virtual_stages,
                            embedding=cfg.embedding or EmbeddingStrategy())
