"""The layer dynamic program: per-layer strategies of one pipeline stage under its memory budget.

Memory is a discretised axis (``unit`` bytes a bin; each candidate's memory is rounded *up*, so a plan the
DP accepts always fits). The state after ``k`` layers is, for every transition class of the last layer and
every memory bin, the least objective reaching exactly that bin. Candidates whose re-layout costs
(``transition_s``) are identical form one class, so the state stays small (a class is typically one
(tp, cp, dp, sp) layout) while the transition matrix is honoured exactly.

One forward pass yields the optimum of every prefix length at once: for stages made of identical layers
that is the whole table a partition search needs, from a single DP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF = np.inf


@dataclass
class LayerTerms:
    """What the DP sees of one layer position: per candidate (aligned with the stage's candidate list)."""

    obj: np.ndarray  # scalarised objective (already includes the time weight); inf = excluded
    units: np.ndarray  # memory in bins (int, rounded up)
    time_s: np.ndarray  # per micro-batch time, carried along to report the stage's totals
    step_s: np.ndarray  # per step time


@dataclass
class PrefixTable:
    """Optimum per prefix length k (index k-1): objective, its time/step totals and where the path ends."""

    obj: np.ndarray
    time_s: np.ndarray
    step_s: np.ndarray
    units: np.ndarray
    end_class: np.ndarray
    choice: list[np.ndarray]  # per layer: [K, cap+1] candidate chosen to reach (class, bin)
    prev_class: list[np.ndarray]  # per layer: [K, cap+1] class of the layer before

    def path(self, k: int, classes: np.ndarray, units_per_layer: list[np.ndarray]) -> list[int]:
        """Candidate indices of the optimal k-layer prefix (k >= 1)."""
        cls, b = int(self.end_class[k - 1]), int(self.units[k - 1])
        out: list[int] = []
        for i in range(k - 1, -1, -1):
            c = int(self.choice[i][cls, b])
            out.append(c)
            prev = int(self.prev_class[i][cls, b])
            b -= int(units_per_layer[i][c])
            cls = prev
        out.reverse()
        return out


def run(layers: list[LayerTerms], classes: np.ndarray, class_trans: np.ndarray, cap: int,
        trans_weight: float = 1.0, prefix_caps: np.ndarray | None = None) -> PrefixTable:
    """Forward DP over ``layers`` with total memory ≤ ``cap`` bins; optimum for every prefix length.

    ``classes`` must be sorted (candidates of a class contiguous, every class non-empty). ``class_trans``
    is the class-to-class transition time per micro-batch; the objective weighs it by ``trans_weight``
    (the weight the layer objective puts on per-micro-batch time). ``prefix_caps[i]`` (≤ ``cap``, not
    increasing): the bins the first i + 1 layers may use, when that depends on the prefix (memory counted
    above a per-layer base that is subtracted from the budget exactly)."""
    n_cls = class_trans.shape[0]
    width = max(int(cap), 0) + 1
    bins = np.arange(width)
    n_cand = classes.shape[0]
    starts = np.flatnonzero(np.r_[True, classes[1:] != classes[:-1]])
    cand_ids = np.arange(n_cand)[:, None]
    cls_rows = np.arange(n_cls)[:, None]
    tt = class_trans * trans_weight
    n_layers = len(layers)
    out_obj, out_t, out_u = (np.full(n_layers, INF) for _ in range(3))
    out_units = np.zeros(n_layers, dtype=np.int64)
    out_cls = np.zeros(n_layers, dtype=np.int64)
    choices: list[np.ndarray] = []
    prevs: list[np.ndarray] = []
    gather: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # per distinct LayerTerms: source bins and validity
    v = vt = vu = np.zeros((0, width))
    for i, lt in enumerate(layers):
        # r[k', b]: best cost so far when the next layer is of class k' (transition included)
        if i == 0:
            r = np.full((n_cls, width), INF)
            r[:, 0] = 0.0
            rt = np.zeros((n_cls, width))
            ru = rt
            prev_cls = np.zeros((n_cls, width), dtype=np.int64)
        elif n_cls == 1:
            r, rt, ru = v + tt[0, 0], vt + class_trans[0, 0], vu
            prev_cls = np.zeros((1, width), dtype=np.int64)
        else:
            tot = v[:, None, :] + tt[:, :, None]  # [k, k', b]
            prev_cls = np.argmin(tot, axis=0)  # [k', b]
            r = np.take_along_axis(tot, prev_cls[None], axis=0)[0]
            rt = np.take_along_axis(vt, prev_cls, axis=0) + class_trans[prev_cls, cls_rows]
            ru = np.take_along_axis(vu, prev_cls, axis=0)
        g = gather.get(id(lt))
        if g is None:
            src = bins[None, :] - lt.units[:, None]
            g = gather[id(lt)] = (np.maximum(src, 0), src < 0)
        srcc, bad = g
        row = classes[:, None]
        cand = r[row, srcc] + lt.obj[:, None]  # [C, b]: candidate c' ends at bin b
        cand[bad] = INF
        v = np.minimum.reduceat(cand, starts, axis=0)
        # first candidate of each class achieving its minimum
        choice = np.minimum.reduceat(np.where(cand == v[classes], cand_ids, n_cand), starts, axis=0)
        choice = np.minimum(choice, n_cand - 1)
        src_best = srcc[choice, bins[None, :]]
        vt = rt[classes[choice], src_best] + lt.time_s[choice]
        vu = ru[classes[choice], src_best] + lt.step_s[choice]
        prevs.append(prev_cls[cls_rows, src_best])
        choices.append(choice)
        lim = width if prefix_caps is None else int(prefix_caps[i]) + 1
        sub = v[:, :lim]
        flat = int(np.argmin(sub)) if lim > 0 else 0
        if lim <= 0 or not np.isfinite(sub.flat[flat]):
            break  # no prefix this long fits: no longer one can (memory only grows with layers)
        k_best, b_best = divmod(flat, lim)
        out_obj[i] = v[k_best, b_best]
        out_t[i] = vt[k_best, b_best]
        out_u[i] = vu[k_best, b_best]
        out_units[i] = b_best
        out_cls[i] = k_best
    return PrefixTable(out_obj, out_t, out_u, out_units, out_cls, choices, prevs)
