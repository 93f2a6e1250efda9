"""Stages of identical layers with two strategies (and up to two layers of a third), on exact memory.

With one memory constraint, the LP relaxation of "one candidate per layer" has an optimum mixing at most
two candidates, and the integer optimum is almost always of that form too: ``n_a`` layers run strategy
``a`` and ``n_b`` run ``b`` in two contiguous blocks (one re-layout between them). For a pair the
objective and the memory are linear in ``n_a``, so the best ``n_a`` is an end of its feasible interval:
every pair and every layer count is solved in closed form, vectorised. This complements the memory-axis
DP, whose bins round memory up: it never loses memory to rounding, and it costs O(C² n) instead of the
DP's O(n · C · bins).

Where the memory a pair leaves by rounding fits better layers, one or two layers of a third strategy take
it (``_with_third``): t5-11b on 16,384 H100 at seq 4096, an interleaved first stage of 6 layers under
memory runs 4 without recomputation, 1 with selective and 1 with full recomputation, 1.0 % faster a step
than the best pair (4 + 2 with full), as the exact layer DP finds in 30x the search time. On random small
stages (3-5 candidates, 4-7 layers), one layer beside the best pair missed 4.3 % of the optima,
one layer beside the 4 best pairs 2.0 %, up to two layers 0.8 %, up to two beside the 16 best 0.3 %
(gpt3-13b on 64 L4 at 16 GiB: 16 pairs find the exact DP's plan, 0.23 % faster than 4 pairs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF = np.inf
THIRD_FROM_PAIRS = 16  # a third strategy is tried beside this many best pairs per layer count
THIRD_LAYERS = 2  # ... on up to this many layers


@dataclass
class TwoTypeTable:
    """Per layer count n (index n-1): objective, time, step time and the mix: n_a layers of a, then n_c of
    ``third`` (none where it is -1), then b for the rest."""

    obj: np.ndarray
    time_s: np.ndarray
    step_s: np.ndarray
    first: np.ndarray
    n_first: np.ndarray
    second: np.ndarray
    third: np.ndarray
    n_third: np.ndarray

    def choice(self, n: int) -> list[int]:
        a, na, b, c, nc = (int(x[n - 1]) for x in (self.first, self.n_first, self.second, self.third, self.n_third))
        return [a] * na + [c] * nc + [b] * (n - na - nc)


def solve(obj: np.ndarray, time_s: np.ndarray, step_s: np.ndarray, mem: np.ndarray, extra: np.ndarray,
          trans: np.ndarray, budget: float, max_layers: int, time_weight: float) -> TwoTypeTable:
    """Best stage of two strategies (plus up to ``THIRD_LAYERS`` layers of a third) for every n ≤ ``max_layers``:
    Σ memory + max transient ≤ ``budget``.

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
    out = TwoTypeTable(o, np.where(feasible, t, INF), np.where(feasible, u, INF), ab,
                       np.where(feasible, na_best, 0).astype(np.int64), bb, np.full(max_layers, -1, dtype=np.int64),
                       np.zeros(max_layers, dtype=np.int64))
    # a third strategy beside each count's few best pairs (beside the best alone it missed optima the exact DP
    # finds: module docstring)
    ranked = np.argpartition(total, THIRD_FROM_PAIRS - 1, axis=0)[:THIRD_FROM_PAIRS] \
        if total.shape[0] > THIRD_FROM_PAIRS else np.argsort(total, axis=0)
    usable = np.isfinite(total[ranked, cols])
    na_ranked = np.where(usable, na[ranked, cols], 0).astype(np.int64)  # (an infeasible pair's count may be inf)
    return _with_third(out, a[ranked], na_ranked, b[ranked], usable, obj, time_s, step_s, mem, extra, trans,
                       budget, time_weight)


def _with_third(out: TwoTypeTable, a: np.ndarray, na: np.ndarray, b: np.ndarray, feasible: np.ndarray,
                obj: np.ndarray, time_s: np.ndarray, step_s: np.ndarray, mem: np.ndarray, extra: np.ndarray,
                trans: np.ndarray, budget: float, w: float) -> TwoTypeTable:
    """``out`` where, per count, one of the pairs given (rows of ``a``, ``na``, ``b``, ``feasible``, one column
    per count: n_a layers of a, the rest b) with k ≤ ``THIRD_LAYERS`` of its layers (from the end of a's block,
    the start of b's, or both) replaced by a block of any candidate c between the two is better and fits:
    O(P k² C n), in one array. Only counts whose best so far is above n x the least per-layer objective (memory
    binds) can gain, so only those are tried."""
    n = np.arange(1, out.obj.size + 1)
    rows = np.flatnonzero(feasible.any(axis=0) & (out.obj > n * float(np.min(obj)) * (1 + 1e-12)))
    if rows.size == 0:
        return out
    n, a, na, b, feasible = n[rows], a[:, rows], na[:, rows], b[:, rows], feasible[:, rows]
    # axes: (k, layers given up from a's block), pair, count, c
    k, da = (np.array(x)[:, None, None, None] for x in zip(*[(k, d) for k in range(1, THIRD_LAYERS + 1)
                                                             for d in range(k + 1)], strict=True))
    ka, kb = na[None, :, :, None] - da, (n - na)[None, :, :, None] - k + da  # the blocks left beside c's
    diag = np.diag(trans)
    ai, bi, every = a[None, :, :, None], b[None, :, :, None], np.arange(obj.size)[None, None, None, :]
    peak = np.maximum(np.where(ka > 0, extra[ai], 0.0), np.where(kb > 0, extra[bi], 0.0))
    used = ka * mem[ai] + kb * mem[bi] + k * mem[every] + np.maximum(peak, extra[every])
    moves = (np.maximum(ka - 1, 0) * diag[ai] + np.maximum(kb - 1, 0) * diag[bi] + (k - 1) * diag[every]
             + np.where(ka > 0, trans[ai, every], 0.0) + np.where(kb > 0, trans[every, bi], 0.0))
    fits = feasible[None, :, :, None] & (ka >= 0) & (kb >= 0) & (used <= budget)
    total = np.where(fits, ka * obj[ai] + kb * obj[bi] + k * obj[every] + w * moves, INF)
    flat = np.moveaxis(total, 2, 0).reshape(rows.size, -1)  # per count: (combination, pair, c) flattened
    pick = np.argmin(flat, axis=1)
    q, p, c = np.unravel_index(pick, (k.shape[0], a.shape[0], obj.size))
    local = np.arange(rows.size)
    value = flat[local, pick]
    better = value < out.obj[rows] * (1 - 1e-12)
    if not np.any(better):
        return out
    kc, ka_c, kb_c = k[q, 0, 0, 0], ka[q, p, local, 0], kb[q, p, local, 0]
    a_c, b_c = a[p, local], b[p, local]
    fields = {"obj": value, "time_s": ka_c * time_s[a_c] + kb_c * time_s[b_c] + kc * time_s[c]
              + np.broadcast_to(moves, total.shape)[q, p, local, c],
              "step_s": ka_c * step_s[a_c] + kb_c * step_s[b_c] + kc * step_s[c], "first": a_c, "n_first": ka_c,
              "second": b_c, "third": c, "n_third": kc}
    at = rows[better]
    for name, new in fields.items():
        getattr(out, name)[at] = new[better]
    return out
