"""Each stage's least time, step time or a weighting of both under its memory budget, relaxed (``bounds``: the
LP for identical layers, the Lagrangian for mixed kinds), shaped as the partition searches of the bounds take it.

Every lower bound of ``config_bounds`` is a partition search over these values: a relaxed value is never above
what any plan of the stage achieves, so the least over partitions is never above the configuration's step."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from solvers.hybrid import bounds, stage_costs
from solvers.hybrid.tables import StageTables


class StageRelaxation:
    """The relaxed stage values of one request's configurations (the options are read as they are when asked:
    the certificate's deep pass widens ``bound_whole_layers`` for a while)."""

    def __init__(self, tables: StageTables):
        self.tables = tables
        self._envelopes: bounds.Envelopes = {}
        self._fronts: bounds.Fronts = {}

    def relaxed(self, cc: stage_costs.ConfigCosts, values: list[dict[Hashable, np.ndarray]], stage: int,
                levels: int = 1, time_weights: Sequence[float] | None = None) -> list[np.ndarray]:
        """Per value (one array per layer kind, by candidate): the stage's least total under its memory
        budget, relaxed (``bounds``: the LP for identical layers, the Lagrangian for mixed kinds); by layer
        count (identical layers) or [start phase, count]. ``levels``: groups of the stage's largest transient
        buffer told apart (1: the least buffer reserved, every candidate admitted; cheap, loose where lean
        candidates carry large buffers, e.g. ZeRO-3's gathered weights). ``time_weights``: each value's weight of
        the per-micro-batch time, in which re-layouts between a stage's layers count (the bound by whole
        candidates then charges a stage that mixes layouts its least re-layout)."""
        st = cc.stages[stage]
        extra = [c.peak_extra_bytes for c in st.costs.values()]
        ((_, least),) = bounds.transient_levels(extra, 1)
        plain = self._relaxed_at(cc, st, values, math.inf, least, whole=False)
        if levels <= 1:
            return plain
        # (refined, and stages of few layers on average: also by whole candidates; with many layers a stage the
        # LP's fractions cost little and the fronts of sums grow)
        whole = cc.uniform and len(self.tables.kinds) <= self.tables.opt.bound_whole_layers * cc.config.pp
        out: list[np.ndarray] | None = None
        for cap, reserved in bounds.transient_levels(extra, levels):
            # a plan whose largest transient buffer lies in (reserved, cap] uses only candidates within cap and
            # at least ``reserved`` of the budget for it; the least over the levels bounds every plan
            got = self._relaxed_at(cc, st, values, cap, reserved, whole, time_weights)
            out = got if out is None else [np.minimum(a, b) for a, b in zip(out, got, strict=True)]
            if all(np.all(o <= p) for o, p in zip(out, plain, strict=True)):
                break  # every level is at least the plain relaxation: the rest cannot lower the least
        assert out is not None
        return out

    def _relaxed_at(self, cc: stage_costs.ConfigCosts, st: stage_costs.StageInputs,
                    values: list[dict[Hashable, np.ndarray]], cap: float, reserved: float, whole: bool,
                    time_weights: Sequence[float] | None = None) -> list[np.ndarray]:
        """``relaxed`` over the candidates whose transient buffer is within ``cap``, ``reserved`` bytes of the
        budget set aside for it; ``whole``: small layer counts also by whole candidates."""
        n = len(self.tables.kinds)
        ids = list(dict.fromkeys(self.tables.kinds))
        mems = [st.memory(k) for k in ids]
        budget = self.tables.limit - st.fixed_memory() - reserved
        allowed = [np.where(st.costs[k].peak_extra_bytes <= cap, 0.0, np.inf) if math.isfinite(cap) else 0.0
                   for k in ids]
        if not cc.uniform:
            kind_of_layer = [ids.index(k) for k in self.tables.kinds]
            return [bounds.mixed_relaxed_cost(kind_of_layer, self.tables.period, mems,
                                              [v[k] + a for k, a in zip(ids, allowed, strict=True)], budget,
                                              self._envelopes) for v in values]
        counts = np.maximum(np.arange(n + 1, dtype=float), 1)
        got = [counts * bounds.relaxed_cost(mems[0], v[ids[0]] + allowed[0], budget / counts, self._envelopes)
               for v in values]
        if whole:
            k = min(n, self.tables.opt.bound_whole_layers)
            weights = time_weights if time_weights is not None else [0.0] * len(values)
            for g, v, wt in zip(got, values, weights, strict=True):
                g[:k + 1] = np.maximum(g[:k + 1], self._whole(st, mems[0], v[ids[0]] + allowed[0], budget, k, wt))
        return got

    def _whole(self, st: stage_costs.StageInputs, mem: np.ndarray, val: np.ndarray, budget: float, k: int,
               time_weight: float) -> np.ndarray:
        """By layer count up to ``k``, the least total of whole candidates within ``budget``. The evaluator charges
        a re-layout between consecutive layers of a stage whose layouts differ, so a stage that mixes layout
        classes pays at least the least class-to-class transition, at ``time_weight``, where the options ask
        (``bound_layout_switch``; without it, the 100,000-GPU llama3-405b plan's stage mixing tp4 cp4 with a
        tp8 cp2 layer bounded 2.1 % below any plan)."""
        caps = np.full(k + 1, budget)
        if time_weight > 0 and self.tables.opt.bound_layout_switch:
            cls, trans = st.transitions()
            if trans.shape[0] > 1 and len(cls) == len(val):
                switch = float(np.min(trans[~np.eye(trans.shape[0], dtype=bool)]))
                return bounds.integral_cost_with_switch(mem, val, cls, time_weight * switch, caps, k, self._fronts)
        return bounds.integral_cost(mem, val, caps, k, self._fronts)

    def weighted(self, cc: stage_costs.ConfigCosts, stage: int, weights: Sequence[tuple[float, float]],
                 levels: int = 1) -> list[np.ndarray]:
        """Per (w_t, w_u): the stage's relaxed least of w_t t + w_u u over its layers, plus its fixed time and
        step time at the same weights (as ``relaxed`` shapes it: by count, or [start phase, count])."""
        st = cc.stages[stage]

        def combine(wt: float, wu: float, t: Any, u: Any) -> Any:  # a zero weight leaves its term out: no 0 x inf
            return (wt * t if wt else 0.0) + (wu * u if wu else 0.0)

        got = self.relaxed(cc, [{k: combine(wt, wu, c.time_s, c.step_time_s) for k, c in st.costs.items()}
                                for wt, wu in weights], stage, levels, [wt for wt, _ in weights])
        return [g + combine(wt, wu, st.fixed.time_s, st.fixed.step_time_s)
                for g, (wt, wu) in zip(got, weights, strict=True)]

    def by_start(self, cc: stage_costs.ConfigCosts, rows: list[np.ndarray]) -> list[np.ndarray]:
        """Per-stage relaxed values as the partition search takes them: by count, or [start, count]."""
        n, v = len(self.tables.kinds), cc.config.virtual_stages
        if cc.uniform:
            return [np.where(np.arange(1, n + 1) < v, math.inf, row[1:]) for row in rows]
        start, count = np.meshgrid(np.arange(n), np.arange(n + 1), indexing="ij")
        ok = (count >= v) & (start + count <= n)
        return [np.where(ok, row[start % self.tables.period, count], math.inf) for row in rows]

    def stage_times(self, cc: stage_costs.ConfigCosts, levels: int = 1) -> list[np.ndarray]:
        """Each stage's relaxed per-micro-batch time plus its fixed time, as the partition DPs take them."""
        return self.by_start(cc, [self.weighted(cc, s, [(1.0, 0.0)], levels)[0] for s in range(cc.config.pp)])
