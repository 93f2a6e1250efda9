"""Length bucketing: shrink a micro-batch's MILP by grouping sequences of similar length.

A bucket stands for its members at its longest member's length, so any assignment of bucket counts the
MILP finds is feasible (memory) and its loads are upper bounds for the real sequences. Boundaries come
from a linear-partition DP that minimises the padding the bucketing adds (tokens rounded up to the
bucket's boundary), the reference's criterion.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Bucket:
    boundary: int  # the longest member's length: what the MILP uses for every member
    members: tuple[int, ...]  # cost-table rows, longest first


def bucket_sequences(rows: list[int], lengths: np.ndarray, max_buckets: int) -> list[Bucket]:
    """At most ``max_buckets`` buckets of consecutive lengths with the least total padding."""
    order = sorted(rows, key=lambda r: (-int(lengths[r]), r))
    s = np.array([int(lengths[r]) for r in order], dtype=np.int64)
    n = len(order)
    # Equal lengths always share a bucket; the DP runs on the distinct lengths.
    distinct, start = np.unique(-s, return_index=True)
    starts = [*list(start), n]
    u = len(distinct)
    k = min(max_buckets, u)
    if k == u:
        cut = list(range(u + 1))
    else:
        prefix = np.concatenate([[0], np.cumsum(s)])
        st = np.asarray(starts, dtype=np.int64)
        head = s[st[:-1]]  # each unit's length; a bucket starting at unit a pads up to head[a]
        best = np.full((k + 1, u + 1), np.inf)
        arg = np.zeros((k + 1, u + 1), dtype=np.int64)
        best[0, 0] = 0.0
        for b in range(1, k + 1):
            for j in range(b, u + 1):
                first = np.arange(b - 1, j)
                # Units first..j-1 share boundary head[first]: padding = boundary·count − their tokens.
                v = best[b - 1, first] + head[first] * (st[j] - st[first]) - (prefix[st[j]] - prefix[st[first]])
                q = int(np.argmin(v))
                best[b, j], arg[b, j] = v[q], first[q]
        cut = [u]
        for b in range(k, 0, -1):
            cut.append(int(arg[b, cut[-1]]))
        cut.reverse()
    out = []
    for a, e in itertools.pairwise(cut):
        members = tuple(order[starts[a] : starts[e]])
        out.append(Bucket(int(s[starts[a]]), members))
    return out
