"""The least per-GPU memory any plan of the space needs: what an infeasible request is told to allow."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

from solvers.hybrid import partition, stage_costs
from solvers.hybrid.tables import StageTables


def min_memory_bytes(tables: StageTables) -> float:
    """The least per-GPU memory any plan in the space needs (for the infeasibility message): over every
    configuration and embedding variant, the best partition, with every layer at its smallest candidate
    under a cap on the stage's transient (a stage's peak holds its largest layer transient, so the
    smallest resident memory and the smallest transient usually belong to different candidates and
    their sum is no plan's memory)."""
    best = math.inf
    for base in tables.space.pipeline_configs():
        for cfg in tables.embedding_variants(base) or [base]:
            cc = tables.config_costs(cfg)
            if cc is not None:
                best = min(best, _min_memory(cc, tables.kinds))
    return best


def _min_memory(cc: stage_costs.ConfigCosts, kinds: Sequence[Hashable]) -> float:
    fixed, per_layer, cum = [], [], []
    for st in cc.stages:
        levels, per_kind = transient_levels(st)
        fixed.append(st.fixed_memory() + levels)
        per_layer.append(per_kind[kinds[0]])
        cum.append(np.concatenate([np.zeros((levels.size, 1)),
                                   np.cumsum(np.stack([per_kind[k] for k in kinds], axis=1), axis=1)],
                                  axis=1))
    if cc.uniform:
        return partition.min_max_linear(len(kinds), fixed, per_layer)
    return partition.min_max_prefix(fixed, cum)


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
