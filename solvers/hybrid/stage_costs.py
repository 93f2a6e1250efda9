"""Cost-model answers for one pipeline configuration, cached so the outer search never asks twice.

Layers of the same *kind* (dense / MoE, as the model spec says) cost the same, so the cost model is asked
once per (kind, stage context), not once per layer. Everything here is keyed by the stage context, which is
what a layer's cost depends on.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from solvers.cost_model.aggregate import stage_memory_bytes
from solvers.cost_model.base import CostModel, LayerCosts, StageContext, StageFixed
from solvers.hybrid.space import PipelineConfig
from solvers.strategy import LayerStrategy


def fixed_memory_bytes(fixed: StageFixed, in_flight: float) -> float:
    """A stage's memory outside its layers: edge-layer states, reserves and ``in_flight`` micro-batches of
    the edge layers' activations (the evaluator's formula, without a layer transient)."""
    return stage_memory_bytes(fixed.state_bytes, fixed.activation_bytes, in_flight, 0.0, fixed.other_bytes)


@dataclass
class StageInputs:
    """One stage's view: its context, fixed terms and the per-kind candidate costs.

    Transitions are asked lazily (only stages that reach the DP need them), once per pair of layouts."""

    ctx: StageContext
    fixed: StageFixed
    in_flight: float
    costs: dict[Hashable, LayerCosts]
    candidates: list[LayerStrategy]
    cm: CostModel
    memo: dict[tuple[object, ...], object]
    _trans: tuple[np.ndarray, np.ndarray] | None = None

    def memory(self, kind: Hashable) -> np.ndarray:
        """Per-candidate resident memory (state + in-flight activations), bytes; transient extra excluded."""
        c = self.costs[kind]
        return c.state_bytes + self.in_flight * c.activation_bytes

    def fixed_memory(self) -> float:
        return fixed_memory_bytes(self.fixed, self.in_flight)

    def transitions(self) -> tuple[np.ndarray, np.ndarray]:
        """(layout class of each candidate, class-to-class transition seconds per micro-batch)."""
        if self._trans is None:
            c = self.ctx
            key = (c.pp, c.micro_batches, c.schedule, c.virtual_stages, c.stage, "trans", len(self.candidates))
            hit = self.memo.get(key)
            if hit is None:
                hit = self.memo[key] = layout_classes(self.cm, self.candidates, c)
            self._trans = hit  # type: ignore[assignment]
        assert self._trans is not None
        return self._trans


@dataclass
class ConfigCosts:
    """Candidates and per-stage costs of one PipelineConfig."""

    config: PipelineConfig
    candidates: list[LayerStrategy]
    stages: list[StageInputs]
    kinds: Sequence[Hashable]
    time_weight: float  # the DP objective is time_weight * per-micro-batch time + per-step time
    # other weights tried per stage: 1 (a stage off the critical path: its step time counts as much as its
    # time) and a huge one (step time only breaks ties)
    time_weights: tuple[float, ...] = ()
    dp_cache: dict[tuple[int, int, int], tuple[np.ndarray, ...]] = field(default_factory=dict)

    @property
    def uniform(self) -> bool:
        return len(set(self.kinds)) <= 1


def stage_context(cfg: PipelineConfig, stage: int, global_batch: int) -> StageContext:
    return StageContext(
        pp=cfg.pp, stage=stage, micro_batches=cfg.micro_batches,
        micro_batch_samples=global_batch / cfg.micro_batches, schedule=cfg.schedule,
        virtual_stages=cfg.virtual_stages, embedding=cfg.embedding,
    )


def _finite_mask(c: LayerCosts) -> np.ndarray:
    return (np.isfinite(c.time_s) & np.isfinite(c.step_time_s) & np.isfinite(c.state_bytes)
            & np.isfinite(c.activation_bytes) & np.isfinite(c.peak_extra_bytes))


def _subset(c: LayerCosts, keep: np.ndarray) -> LayerCosts:
    return LayerCosts(c.time_s[keep], c.step_time_s[keep], c.state_bytes[keep], c.activation_bytes[keep],
                      c.peak_extra_bytes[keep])


def layer_costs_by_stage(cm: CostModel, cfg: PipelineConfig, candidates: Sequence[LayerStrategy],
                         kinds: Sequence[Hashable], global_batch: int, memo: dict[tuple[object, ...], object]
                         ) -> list[tuple[StageContext, dict[Hashable, LayerCosts]]]:
    """Each stage's context and its candidates' costs per layer kind, memoised in ``memo`` (the layers'
    costs do not depend on the embedding strategy, so a configuration's embedding variants share them)."""
    first_of: dict[Hashable, int] = {}
    for i, k in enumerate(kinds):
        first_of.setdefault(k, i)
    out: list[tuple[StageContext, dict[Hashable, LayerCosts]]] = []
    for s in range(cfg.pp):
        ctx = stage_context(cfg, s, global_batch)
        # the candidates follow from (pp, micro-batches); stages the cost model prices alike share one dict
        key = ("layers", cfg.pp, cfg.micro_batches, cm.layer_costs_key(ctx))
        costs = memo.get(key)
        if not isinstance(costs, dict):
            costs = memo[key] = {k: cm.layer_costs(i, candidates, ctx) for k, i in first_of.items()}
        out.append((ctx, costs))
    return out


def build(cm: CostModel, cfg: PipelineConfig, candidates: Sequence[LayerStrategy], kinds: Sequence[Hashable],
          global_batch: int, memo: dict[tuple[object, ...], object] | None = None) -> ConfigCosts:
    """Ask the cost model about ``candidates`` on every stage of ``cfg`` (once per layer kind).

    ``memo`` shares layer costs and transitions between configurations that differ only in the embedding
    strategy (which changes the first/last stage's fixed terms, not the layers)."""
    memo = {} if memo is None else memo
    stages: list[StageInputs] = []
    keep = np.ones(len(candidates), dtype=bool)
    raw = layer_costs_by_stage(cm, cfg, candidates, kinds, global_batch, memo)
    for _, costs in raw:
        for c in costs.values():
            keep &= _finite_mask(c)  # a cost model marks what it cannot model with inf/nan
    cands = [c for c, k in zip(candidates, keep, strict=True) if k]
    for ctx, costs in raw:
        sub = {k: _subset(c, keep) for k, c in costs.items()}
        stages.append(StageInputs(ctx, cm.stage_fixed(ctx), float(cm.in_flight_micro_batches(ctx)), sub,
                                  cands, cm, memo))
    m = float(cfg.micro_batches)
    return ConfigCosts(cfg, cands, stages, kinds, time_weight=m, time_weights=tuple(dict.fromkeys((m, 1.0, 1e6 * m))))


def sweep_weights(m: float) -> tuple[float, ...]:
    """Weights between m and 1 (m / 4, m / 16, ...): a stage off the critical path counts its time about
    once and its step time only if that is the largest of all stages, so its best trade lies between the
    two ends; the final plan's stages are re-solved with these (``Planner.refine``)."""
    out = [m / 4]
    while out[-1] / 4 > 1.0:
        out.append(out[-1] / 4)
    return tuple(w for w in out if w > 1.0)


def _layout(x: LayerStrategy) -> tuple[object, ...]:
    return (x.tp, x.dp, x.cp, x.sp, x.ep)


def layout_classes(cm: CostModel, cands: Sequence[LayerStrategy], ctx: StageContext) -> tuple[np.ndarray, np.ndarray]:
    """Candidates grouped by layout (tp, dp, cp, sp, ep), and ``transition_s`` between layouts.

    Re-layout moves activations between differently split layers; ZeRO and recompute do not change where
    activations live, so candidates sharing a layout share their transitions (tests check this per cost
    model). Without any transition cost all candidates form one class."""
    if not cands:
        return np.zeros(0, dtype=np.int64), np.zeros((1, 1))
    keys = [_layout(c) for c in cands]
    uniq = list(dict.fromkeys(keys))
    reps = [cands[keys.index(k)] for k in uniq]
    small = np.asarray(cm.transition_s(reps, reps, ctx), dtype=float)
    if not np.any(small):
        return np.zeros(len(cands), dtype=np.int64), np.zeros((1, 1))
    where = {k: i for i, k in enumerate(uniq)}
    return merge_equivalent(np.array([where[k] for k in keys], dtype=np.int64), small)


def merge_equivalent(cls: np.ndarray, trans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Classes with equal rows and equal columns of ``trans`` are interchangeable (then their mutual and
    self transitions are equal too), so they become one class: e.g. MoE layouts that differ only in the
    expert-parallel degree re-lay out activations alike. The layer DP's state and its class-to-class step
    shrink with the square of the class count; every transition time is kept exactly."""
    sig = [(trans[i].tobytes(), trans[:, i].tobytes()) for i in range(trans.shape[0])]
    first = {k: None for k in sig}
    group = {k: g for g, k in enumerate(first)}
    if len(group) == len(sig):
        return cls, trans
    new_of_old = np.array([group[k] for k in sig], dtype=np.int64)
    reps = np.array([sig.index(k) for k in first], dtype=np.int64)
    return new_of_old[cls], trans[np.ix_(reps, reps)]


def layout_transitions(cm: CostModel, cands: Sequence[LayerStrategy], ctx: StageContext) -> np.ndarray:
    """``transition_s`` for all candidate pairs (expanded from the per-layout matrix)."""
    cls, small = layout_classes(cm, cands, ctx)
    return small[np.ix_(cls, cls)]


def peak_thresholds(extra: np.ndarray, limit: int = 4, unit: float = 1.0) -> np.ndarray:
    """Levels of transient memory to enumerate, rounded up to whole memory bins (finer is below the DP's
    resolution anyway): exact when ≤ ``limit`` distinct, else rounded *up* to ``limit`` levels."""
    vals = np.unique(np.ceil(extra[np.isfinite(extra)] / unit - 1e-9)) * unit
    if vals.size <= limit:
        return vals
    picks = np.quantile(vals, np.linspace(0, 1, limit + 1)[1:], method="higher")
    return np.unique(picks)


def memory_unit(limit_bytes: float, bins: int) -> float:
    return max(limit_bytes / bins, 1.0)


def units_of(mem: np.ndarray, unit: float) -> np.ndarray:
    # Round up (minus a hair for float noise) so an accepted plan always fits.
    return np.ceil(mem / unit - 1e-9).astype(np.int64)


def caps_in_units(avail: np.ndarray, unit: float) -> np.ndarray:
    """The whole units of memory within each of ``avail`` bytes (rounded down, plus a hair for float noise, so a
    budget of exactly k units holds k); -1 (no room) where ``avail`` is not finite."""
    finite = np.isfinite(avail)
    return np.where(finite, np.floor(np.where(finite, avail, 0.0) / unit + 1e-9), -1.0).astype(np.int64)
