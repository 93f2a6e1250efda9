"""Per-sequence costs on every allowed SP group size, as numpy tables for the planners' hot loops."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.flexsp.constants import FlexSPConstants, tiling_sizes


def allowed_group_sizes(c: FlexSPConstants) -> list[int]:
    """The tiling SP degrees (``tiling_sizes``) the cost model has a bandwidth for, smallest first; SP 1
    needs no all-to-all."""
    return [d for d in tiling_sizes(c.num_gpus, c.gpus_per_node) if d == 1 or d in c.alltoall_GBps_by_group_size]


@dataclass(frozen=True)
class CostTable:
    """Costs of each sequence (rows) on each group size (columns), in milliseconds.

    ``compute_ms``/``comm_ms`` exclude the per-group fixed cost ``beta_ms``. ``fits[i, j]`` says whether
    sequence i alone fits the memory of a group of ``sizes[j]`` GPUs.
    """

    lengths: np.ndarray  # int64 (n,)
    sizes: np.ndarray  # int64 (k,)
    compute_ms: np.ndarray  # (n, k)
    comm_ms: np.ndarray  # (n, k)
    fits: np.ndarray  # bool (n, k)
    capacity: np.ndarray  # int64 (k,) tokens a group of each size holds
    beta_ms: float

    @property
    def time_ms(self) -> np.ndarray:
        return self.compute_ms + self.comm_ms

    @property
    def work_ms(self) -> np.ndarray:
        """GPU-milliseconds: time × group size (what work conservation counts)."""
        return self.time_ms * self.sizes[None, :]

    def size_index(self, d: int) -> int:
        return int(np.searchsorted(self.sizes, d))


def cost_table(c: FlexSPConstants, lengths: np.ndarray | list[int], sizes: list[int] | None = None) -> CostTable:
    s = np.asarray(lengths, dtype=np.int64)
    ds = np.asarray(sizes if sizes is not None else allowed_group_sizes(c), dtype=np.int64)
    sf = s.astype(np.float64)[:, None]
    df = ds.astype(np.float64)[None, :]
    compute = (c.alpha1_ms_per_token2 * sf**2 + c.alpha2_ms_per_token * sf) / df
    bw = np.array([c.alltoall_GBps_by_group_size.get(int(d), np.inf) if d > 1 else np.inf for d in ds])
    comm = c.comm_mb_per_token * sf / df / bw[None, :]
    capacity = ds * c.token_capacity_per_gpu
    return CostTable(
        lengths=s,
        sizes=ds,
        compute_ms=compute,
        comm_ms=comm,
        fits=s[:, None] <= capacity[None, :],
        capacity=capacity,
        beta_ms=c.beta_ms,
    )
