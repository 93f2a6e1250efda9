"""Best strategies of one stage for every layer count: the layer DP run once per transient-memory level.

A stage's peak memory is its resident memory plus the *largest* transient buffer of its layers (e.g. a
ZeRO-3 layer's gathered weights). The max is handled exactly by enumerating its level P: only candidates
with transient memory ≤ P, budget reduced by P; the best over levels is the stage's optimum.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from solvers.hybrid import layer_dp, pareto_dp, prune, two_type
from solvers.hybrid.stage_costs import StageInputs, caps_in_units, peak_thresholds, units_of

INF = np.inf


LayerDP = Literal["binned", "pareto"]


@dataclass
class _Run:
    table: layer_dp.PrefixTable | pareto_dp.ExactTable
    local: np.ndarray  # DP-local candidate index -> stage candidate index
    classes: np.ndarray
    units: list[np.ndarray]


@dataclass
class StageTable:
    """Optimum of the first n layers of ``layers`` (index n-1): objective, time, step time, memory."""

    layers: list[int]
    obj: np.ndarray
    time_s: np.ndarray
    step_s: np.ndarray
    runs: list[_Run]
    which: np.ndarray  # DP run that achieves the optimum per n; -2: the two-strategy table; -1: infeasible
    pairs: two_type.TwoTypeTable | None = None
    pair_local: np.ndarray | None = None

    def feasible(self, n: int) -> bool:
        return 0 < n <= len(self.obj) and bool(np.isfinite(self.obj[n - 1]))

    def choice(self, n: int) -> list[int]:
        """Stage-candidate indices of the optimal n-layer prefix."""
        w = int(self.which[n - 1])
        if w == -2:
            assert self.pairs is not None and self.pair_local is not None
            return [int(self.pair_local[c]) for c in self.pairs.choice(n)]
        run = self.runs[w]
        path = run.table.path(n, run.classes, run.units)
        return [int(run.local[c]) for c in path]


def _undominated(cols: list[np.ndarray]) -> np.ndarray:
    """Indices not dominated in every column at once (ties keep the first)."""
    x = np.stack(cols, axis=1)
    idx = np.flatnonzero(np.all(np.isfinite(x), axis=1))
    idx = idx[np.lexsort(x[idx].T[::-1])]  # by the first column, then the next...
    if idx.size > 64:
        # Vectorised pre-pass (MoE expert layouts make thousands of candidates): drop every point that an
        # earlier point of the (first, second column) staircase dominates. Such a point would be skipped below
        # anyway (dominance is transitive), so the result is unchanged; the loop then sees few points.
        y = x[idx]
        probes = np.flatnonzero(y[:, 1] < np.minimum.accumulate(np.concatenate([[np.inf], y[:-1, 1]])))
        pos = np.arange(idx.size)
        dominated = np.zeros(idx.size, dtype=bool)
        for s in range(0, probes.size, 64):
            p = probes[s:s + 64]
            dominated |= (np.all(y[p][:, None, :] <= y[None, :, :], axis=2) & (p[:, None] < pos[None, :])).any(0)
        idx = idx[~dominated]
    kept: list[int] = []
    for i in idx:
        # sorted by the first column, a dominating point can only come earlier
        if kept and np.any(np.all(x[kept] <= x[i], axis=1)):
            continue
        kept.append(int(i))
    return np.asarray(sorted(kept), dtype=np.int64)


def _two_type(st: StageInputs, kind: Hashable, n: int, time_weight: float, limit_bytes: float,
              classes: np.ndarray, class_trans: np.ndarray) -> tuple[two_type.TwoTypeTable, np.ndarray]:
    c = st.costs[kind]
    obj = time_weight * c.time_s + c.step_time_s
    mem = st.memory(kind)
    local = _undominated([obj, mem, c.peak_extra_bytes])
    trans = class_trans[np.ix_(classes[local], classes[local])]
    table = two_type.solve(obj[local], c.time_s[local], c.step_time_s[local], mem[local],
                           c.peak_extra_bytes[local], trans, limit_bytes - st.fixed_memory(), n, time_weight)
    return table, local


def solve(st: StageInputs, layers: Sequence[int], kinds: Sequence[Hashable], time_weight: float,
          unit: float, limit_bytes: float, peak_levels: int = 6, dp_work_limit: float = np.inf,
          method: LayerDP = "binned") -> StageTable:
    """Best strategies of every prefix of ``layers`` (global indices in execution order) on one stage.

    Identical layers also get the exact-memory two-strategy table; the DP then runs only while its work
    (layers x bins x candidates) stays under ``dp_work_limit``. ``method``: the layer DP on memory bins of
    ``unit`` bytes, or on exact memory (Pareto fronts, transient levels unrounded; ``unit`` then only sets the
    work estimate)."""
    n = len(layers)
    seq = [kinds[i] for i in layers]
    kind_set = list(dict.fromkeys(seq))
    extra_all = np.concatenate([st.costs[k].peak_extra_bytes for k in kind_set])
    avail = limit_bytes - st.fixed_memory()
    obj_best = np.full(n, INF)
    t_best = np.full(n, INF)
    u_best = np.full(n, INF)
    which = np.full(n, -1, dtype=np.int64)
    runs: list[_Run] = []
    all_classes, all_trans = st.transitions()
    mem = {k: st.memory(k) for k in kind_set}
    # (exact memory: the transient levels exact too, not rounded up to bins)
    for level in peak_thresholds(extra_all, peak_levels, unit if method == "binned" else 1.0):
        # Each layer's least memory (its kind's leanest allowed candidate) is taken off the budget exactly; the
        # bins count only what a candidate needs above it. Rounding up then costs nothing for lean layers, and
        # a deep stage no longer loses up to a bin per layer (at 128 layers and 128 bins: the whole budget).
        allowed = {k: st.costs[k].peak_extra_bytes <= level for k in kind_set}
        base = {k: float(np.min(mem[k][allowed[k]])) if np.any(allowed[k]) else INF for k in kind_set}
        spent = np.cumsum([base[k] for k in seq])
        prefix_caps = caps_in_units(avail - float(level) - spent, unit)
        cap = int(prefix_caps[0])
        if cap < 0 or (len(kind_set) == 1 and n * (cap + 1) > dp_work_limit):
            continue  # (identical layers: the two-strategy table below covers the stage)
        # the DP's memory axis: whole bins, or bytes (exact)
        caps = prefix_caps if method == "binned" else avail - float(level) - spent
        per_kind: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}
        keep = np.zeros(len(all_classes), dtype=bool)
        for k in kind_set:
            c = st.costs[k]
            obj = np.where(allowed[k], time_weight * c.time_s + c.step_time_s, INF)
            above = np.maximum(mem[k] - base[k], 0.0)
            units = units_of(above, unit) if method == "binned" else above
            obj = np.where(units <= caps[0], obj, INF)
            per_kind[k] = (obj, units)
            keep |= prune.pareto_mask(obj, units, all_classes)
        local = np.flatnonzero(keep)
        if local.size == 0:
            continue
        local = local[np.argsort(all_classes[local], kind="stable")]  # the DP wants classes contiguous
        uniq, classes = np.unique(all_classes[local], return_inverse=True)
        class_trans = all_trans[np.ix_(uniq, uniq)]
        terms: dict[Hashable, layer_dp.LayerTerms] = {}
        for k in kind_set:
            obj, units = per_kind[k]
            c = st.costs[k]
            terms[k] = layer_dp.LayerTerms(obj[local], units[local], c.time_s[local], c.step_time_s[local])
        lt = [terms[k] for k in seq]
        if n * (cap + 1) * (local.size + class_trans.size) > dp_work_limit and len(kind_set) == 1:
            continue
        table: layer_dp.PrefixTable | pareto_dp.ExactTable
        if method == "binned":
            table = layer_dp.run(lt, classes.reshape(-1), class_trans, cap, trans_weight=time_weight,
                                 prefix_caps=caps)
        else:
            table = pareto_dp.run(lt, classes.reshape(-1), class_trans, float(caps[0]), trans_weight=time_weight,
                                  prefix_caps=caps)
        better = table.obj < obj_best
        obj_best = np.where(better, table.obj, obj_best)
        t_best = np.where(better, table.time_s, t_best)
        u_best = np.where(better, table.step_s, u_best)
        which = np.where(better, len(runs), which)
        runs.append(_Run(table, local, classes.reshape(-1), [x.units for x in lt]))
    pairs = pair_local = None
    if len(kind_set) == 1:
        pairs, pair_local = _two_type(st, kind_set[0], n, time_weight, limit_bytes, all_classes, all_trans)
        better = pairs.obj < obj_best
        obj_best = np.where(better, pairs.obj, obj_best)
        t_best = np.where(better, pairs.time_s, t_best)
        u_best = np.where(better, pairs.step_s, u_best)
        which = np.where(better, -2, which)
    f = st.fixed
    return StageTable(list(layers), obj_best, t_best + f.time_s, u_best + f.step_time_s, runs, which, pairs,
                      pair_local)
