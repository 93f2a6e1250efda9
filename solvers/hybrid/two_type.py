"""Stages of identical layers with at most two strategies, on exact (undiscretised) memory.

With one memory constraint, the LP relaxation of "one candidate per layer" has an optimum mixing at most
two candidates, and the integer optimum is almost always of that form too: ``n_a`` layers run strategy
``a`` and ``n_b`` run ``b`` in two contiguous blocks (one re-layout between them). For a pair the
objective and the memory are linear in ``n_a``, so the best ``n_a`` is an end of its feasible interval:
every pair and every layer count is solved in closed form, vectorised. This complements the memory-axis
DP, whose bins round memory up: it never loses memory to rounding, and it costs O(C² n) instead of the
DP's O(n · C · bins).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF = np.inf


@dataclass
class TwoTypeTable:
    """Per layer count n (index n-1): objective, time, step time and the mix (a, n_a, b), a first."""

    obj: np.ndarray
    time_s: np.ndarray
    step_s: np.ndarray
    first: np.ndarray
    n_first: np.ndarray
    second: np.ndarray

    def choice(self, n: int) -> list[int]:
        a, na, b = int(self.first[n - 1]), int(self.n_first[n - 1]), int(self.second[n - 1])
        return [a] * na + [b] * (n - na)


def solve(obj: np.ndarray, time_s: np.ndarray, step_s: np.ndarray, mem: np.ndarray, extra: np.ndarray,
          trans: np.ndarray, budget: float, max_layers: int, time_weight: float) -> TwoTypeTable:
    """Best ≤2-strategy stage for every n ≤ ``max_layers``: Σ memory + max transient ≤ ``budget``.

    ``trans`` is the candidate-to-candidate transition time per micro-batch (weighted by ``time_weight``
    in the objective, like the layers' time)."""
    c = obj.shape[0]
    n = np.arange(1, max_layers + 1, dtype=float)
    # pairs (a, b), ordered: block of a then block of b; a == b is the single-strategy stage
    grid_a, grid_b = np.meshgrid(np.arange(c), np.arange(c), indexing="ij")
    a, b = grid_a.ravel(), grid_b.ravel()
    same = a == b
    diag = np.diag(trans)
    cross = np.where(same, 0.0, trans[a, b])
    peak = np.maximum(extra[a], extra[b])
    # n_a layers of a, n - n_a of b: memory n_a (m_a - m_b) + n m_b + peak ≤ budget
    dm = (mem[a] - mem[b])[:, None]
    room = budget - peak[:, None] - n[None, :] * mem[b][:, None]
    # objective per layer of a minus per layer of b (including each block's internal transitions)
    w = time_weight
    dobj = (obj[a] - obj[b] + w * (diag[a] - diag[b]))[:, None]
    lo = np.where(same[:, None], n[None, :], 1.0)
    hi = np.where(same[:, None], n[None, :], n[None, :] - 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lim = np.where(dm > 0, np.floor(room / np.where(dm > 0, dm, 1.0) + 1e-9), INF)
        low_lim = np.where(dm < 0, np.ceil(room / np.where(dm < 0, dm, -1.0) - 1e-9), -INF)
    hi = np.minimum(hi, lim)
    lo = np.maximum(lo, low_lim)
    ok = (lo <= hi) & np.where(dm == 0, room >= 0, True)
    na = np.where(dobj < 0, hi, lo)  # more of the cheaper per-layer strategy
    nb = n[None, :] - na
    base = (na * obj[a][:, None] + nb * obj[b][:, None]
            + w * (np.maximum(na - 1, 0) * diag[a][:, None] + np.maximum(nb - 1, 0) * diag[b][:, None]
                   + cross[:, None]))
    total = np.where(ok, base, INF)
    best = np.argmin(total, axis=0)
    cols = np.arange(max_layers)
    na_best = na[best, cols]
    nb_best = n - na_best
    ab, bb = a[best], b[best]
    t = (na_best * time_s[ab] + nb_best * time_s[bb] + np.maximum(na_best - 1, 0) * diag[ab]
         + np.maximum(nb_best - 1, 0) * diag[bb] + np.where(ab == bb, 0.0, trans[ab, bb]))
    u = na_best * step_s[ab] + nb_best * step_s[bb]
    o = total[best, cols]
    feasible = np.isfinite(o)
    return TwoTypeTable(o, np.where(feasible, t, INF), np.where(feasible, u, INF), ab,
                        np.where(feasible, na_best, 0).astype(np.int64), bb)
