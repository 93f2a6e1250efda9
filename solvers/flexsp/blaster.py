"""The reference's "sequence blaster": sort, then cut into consecutive micro-batches with a linear-partition DP.

The DP minimises the sum over micro-batches of (fixed cost + a lower bound of the micro-batch's load:
its slowest sequence alone, or its least work spread over the cluster) subject to each micro-batch's
tokens fitting the cluster, for every micro-batch count from the minimum to ``extra`` more. Tokens fitting
is necessary, not sufficient (sequences must also fit whole into power-of-two groups), so a chunk the
packer cannot place passes its shortest sequences on to the next one (``pack_chunks``).
"""

from __future__ import annotations

import itertools

import numpy as np

from solvers.flexsp.packing import PackingContext, best_greedy, finish, longest_first, pack
from solvers.flexsp.plan import MicroBatch

MAX_CUTS = 512


def partition(ctx: PackingContext, order: list[int], counts: range) -> dict[int, list[list[int]]]:
    """For each micro-batch count in ``counts``, the best consecutive cut of ``order`` (longest first)."""
    t = ctx.table
    n, N = len(order), ctx.num_gpus
    rows = np.asarray(order, dtype=np.int64)
    s = t.lengths[rows]
    fits = t.fits[rows]
    min_time = np.where(fits, t.time_ms[rows], np.inf).min(axis=1)
    min_work = np.where(fits, t.work_ms[rows], np.inf).min(axis=1)
    tokens = np.concatenate([[0], np.cumsum(s)])
    work = np.concatenate([[0.0], np.cumsum(min_work)])
    cluster = int(t.capacity[0] // t.sizes[0]) * N
    # Cuts fall on a grid of at most MAX_CUTS positions, so the DP stays (MAX_CUTS)² for any batch.
    pos = np.unique(np.concatenate([np.arange(0, n, max(1, -(-n // MAX_CUTS))), [n]]))
    # The chunk's slowest sequence is its first one in longest-first order, up to the time table's
    # non-monotonicity on tiny lengths; the running max over the rest of the order bounds it from above.
    run_max = np.maximum.accumulate(np.concatenate([min_time, [0.0]])[::-1])[::-1]
    a, b = pos[:, None], pos[None, :]
    # cost[x, y]: the micro-batch order[pos[x]:pos[y]]; inf where it holds more tokens than the cluster.
    cost = t.beta_ms + np.maximum(run_max[a], (work[b] - work[a]) / N)
    cost = np.where((b > a) & (tokens[b] - tokens[a] <= cluster), cost, np.inf)
    m = len(pos)
    best = np.full((counts.stop, m), np.inf)
    arg = np.zeros((counts.stop, m), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, counts.stop):
        total = best[k - 1][:, None] + cost  # [x, y]
        arg[k] = np.argmin(total, axis=0)
        best[k] = total[arg[k], np.arange(m)]
    out = {}
    for k in counts:
        if not np.isfinite(best[k, m - 1]):
            continue
        cuts = [m - 1]
        for q in range(k, 0, -1):
            cuts.append(int(arg[q, cuts[-1]]))
        cuts.reverse()
        out[k] = [order[pos[x] : pos[y]] for x, y in itertools.pairwise(cuts)]
    return out


def pack_chunks(ctx: PackingContext, chunks: list[list[int]]) -> list[MicroBatch]:
    """Pack each chunk; what a chunk cannot hold (shortest first out) moves on to the next."""
    plan: list[MicroBatch] = []
    carry: list[int] = []
    queue = [list(c) for c in chunks]
    while queue or carry:
        rows = longest_first(ctx.table, carry + (queue.pop(0) if queue else []))
        mb = best_greedy(ctx, rows)
        if mb is None:
            p = pack(ctx, rows, np.inf, select=True)
            assert p is not None and p.taken, "a sequence that fits no group reached the blaster"
            taken = set(p.taken)
            carry = [r for r in rows if r not in taken]
            mb = best_greedy(ctx, sorted(taken)) or finish(ctx, p)
        else:
            carry = []
        plan.append(mb)
    return plan


def blast(ctx: PackingContext, extra: int = 1) -> dict[int, list[MicroBatch]]:
    """Plans from the sorted partition for micro-batch counts from the minimum to ``extra`` more."""
    t = ctx.table
    order = longest_first(t, list(range(len(t.lengths))))
    cluster = int(t.capacity[0] // t.sizes[0]) * ctx.num_gpus
    lo = max(1, -(-int(t.lengths.sum()) // cluster))
    return {k: pack_chunks(ctx, chunks) for k, chunks in partition(ctx, order, range(lo, lo + extra + 1)).items()}
