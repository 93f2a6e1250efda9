"""The layer dynamic program on exact memory: a Pareto front of (memory, objective) per transition class.

The alternative the binned DP (``layer_dp``) is measured against (``bench/hybrid.py --layer-dp``). Instead of
a discretised memory axis, the state after ``k`` layers is, per class of the last layer, every prefix no other
prefix beats in both memory and objective. Nothing is rounded, so the optimum is exact for any memory
values; the cost is the size of the fronts, which grows with depth and with the number of distinct
candidate memories (the binned DP's work is fixed by its bins instead).

Same inputs as ``layer_dp.run`` except that memory (``LayerTerms.units``, ``cap``, ``prefix_caps``) may be in
any unit, bytes included, and need not be integral.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.hybrid.layer_dp import LayerTerms
from solvers.hybrid.prune import front

INF = np.inf


@dataclass
class _Front:
    """Every class' Pareto points after one layer, concatenated (class-major)."""

    cls: np.ndarray  # class of the layer just placed
    mem: np.ndarray
    obj: np.ndarray
    time_s: np.ndarray
    step_s: np.ndarray
    cand: np.ndarray  # candidate placed at this layer
    prev: np.ndarray  # index into the previous layer's front (-1 at the first layer)


@dataclass
class ExactTable:
    """Optimum per prefix length k (index k-1), as ``layer_dp.PrefixTable`` gives it."""

    obj: np.ndarray
    time_s: np.ndarray
    step_s: np.ndarray
    mem: np.ndarray
    end: np.ndarray  # index of the optimum in that layer's front (-1: infeasible)
    fronts: list[_Front]

    def path(self, k: int, classes: np.ndarray | None = None, units: object = None) -> list[int]:
        """Candidate indices of the optimal k-layer prefix (k >= 1); the extra arguments match
        ``PrefixTable.path`` and are not needed here."""
        j = int(self.end[k - 1])
        out: list[int] = []
        for i in range(k - 1, -1, -1):
            f = self.fronts[i]
            out.append(int(f.cand[j]))
            j = int(f.prev[j])
        out.reverse()
        return out

    @property
    def front_sizes(self) -> list[int]:
        return [int(f.obj.size) for f in self.fronts]


def run(layers: list[LayerTerms], classes: np.ndarray, class_trans: np.ndarray, cap: float,
        trans_weight: float = 1.0, prefix_caps: np.ndarray | None = None) -> ExactTable:
    """Forward DP over ``layers`` with total memory ≤ ``cap``; the exact optimum of every prefix length.

    ``classes``: the class of each candidate (contiguous, as ``layer_dp.run`` wants them); ``class_trans``:
    class-to-class re-layout time per micro-batch, weighted by ``trans_weight`` in the objective;
    ``prefix_caps[i]`` (≤ ``cap``, not increasing): the memory the first i + 1 layers may use."""
    n_cls = class_trans.shape[0]
    tt = class_trans * trans_weight
    members = [np.flatnonzero(classes == k) for k in range(n_cls)]
    n_layers = len(layers)
    out_obj, out_t, out_u, out_m = (np.full(n_layers, INF) for _ in range(4))
    out_end = np.full(n_layers, -1, dtype=np.int64)
    fronts: list[_Front] = []
    prev: _Front | None = None
    for i, lt in enumerate(layers):
        lim = cap if prefix_caps is None else min(cap, float(prefix_caps[i]))
        parts: list[tuple[np.ndarray, ...]] = []
        for k in range(n_cls):
            cands = members[k][np.isfinite(lt.obj[members[k]]) & (lt.units[members[k]] <= lim)]
            if cands.size == 0:
                continue
            if prev is None:  # the first layer: no predecessor, no re-layout
                r_mem, r_obj, r_t, r_u = (np.zeros(1) for _ in range(4))
                r_idx = np.full(1, -1)
            else:
                # the best ways into class k: every earlier point, its re-layout to k added, on one front
                o = prev.obj + tt[prev.cls, k]
                r_idx = front(prev.mem, o)
                r_mem, r_obj = prev.mem[r_idx], o[r_idx]
                r_t = prev.time_s[r_idx] + class_trans[prev.cls[r_idx], k]
                r_u = prev.step_s[r_idx]
            mem = (r_mem[:, None] + lt.units[cands][None, :]).ravel()
            obj = (r_obj[:, None] + lt.obj[cands][None, :]).ravel()
            ok = mem <= lim
            keep = np.flatnonzero(ok)[front(mem[ok], obj[ok])]
            if keep.size == 0:
                continue
            ri, ci = np.divmod(keep, cands.size)
            parts.append((np.full(keep.size, k), mem[keep], obj[keep], r_t[ri] + lt.time_s[cands[ci]],
                          r_u[ri] + lt.step_s[cands[ci]], cands[ci], r_idx[ri]))
        if not parts:
            break  # no prefix this long fits: no longer one can (memory only grows with layers)
        cur = _Front(*(np.concatenate(col) for col in zip(*parts, strict=True)))
        fronts.append(cur)
        j = int(np.argmin(cur.obj))
        out_obj[i], out_t[i], out_u[i], out_m[i], out_end[i] = (cur.obj[j], cur.time_s[j], cur.step_s[j],
                                                                cur.mem[j], j)
        prev = cur
    return ExactTable(out_obj, out_t, out_u, out_m, out_end, fronts)
