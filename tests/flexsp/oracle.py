"""Exhaustive optimum of one micro-batch, for checking the MILP on small cases.

Dynamic programming over subsets: best[mask][g] is the least possible slowest-group load when the
sequences in ``mask`` are split into groups that use exactly ``g`` GPUs (any leftover GPUs idle). Every
partition of the sequences into groups, and every size for every group, is considered.
"""

from __future__ import annotations

import math

import numpy as np

from solvers.flexsp.cost import CostTable


def exhaustive_min_load_ms(table: CostTable, rows: list[int], num_gpus: int) -> float:
    n = len(rows)
    sizes = [int(d) for d in table.sizes]
    lengths = [int(table.lengths[r]) for r in rows]
    time = [[float(table.time_ms[r, j]) for j in range(len(sizes))] for r in rows]
    full = (1 << n) - 1
    # Load and tokens of every subset on every size.
    tokens = [0] * (1 << n)
    load = np.zeros((1 << n, len(sizes)))
    for mask in range(1, 1 << n):
        low = (mask & -mask).bit_length() - 1
        rest = mask & (mask - 1)
        tokens[mask] = tokens[rest] + lengths[low]
        load[mask] = load[rest] + np.array(time[low])
    best = np.full((1 << n, num_gpus + 1), math.inf)
    best[0, :] = 0.0  # no sequences: any number of idle GPUs
    for mask in range(1, 1 << n):
        low = mask & -mask
        rest = mask ^ low
        sub = rest
        while True:
            group = sub | low  # the group holding the lowest sequence of mask
            for j, d in enumerate(sizes):
                if tokens[group] > table.capacity[j]:
                    continue
                g = load[group, j]
                prev = best[mask ^ group, : num_gpus + 1 - d]
                cand = np.maximum(prev, g)
                best[mask, d:] = np.minimum(best[mask, d:], cand)
            if sub == 0:
                break
            sub = (sub - 1) & rest
    return float(best[full].min())
