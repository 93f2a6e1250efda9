"""How fast a GEMM runs as a function of its shape: an efficiency curve, not a flat percentage.

A matmul of (m x k) by (k x n) reaches ``eta_max`` of the tensor-core peak only when every dimension is
large; each dimension ``d`` contributes a saturation factor ``d / (d + d_half)`` (tile quantisation and
too few tiles to fill the SMs on thin shapes). A GEMM is never faster than moving its operands through
HBM (roofline). Everything is numpy-vectorised over candidate strategies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ArrayLike = np.ndarray | float


@dataclass(frozen=True)
class GemmEfficiency:
    eta_max: float = 0.80  # fraction of the dense tensor-core peak a large, well-shaped GEMM reaches
    d_half: float = 96.0  # output dimension (m or n) at which that axis alone halves the efficiency
    k_half: float = 96.0  # the same for the reduction dimension k, which streams through the tile
    bytes_per_element: float = 2.0

    def efficiency(self, m: ArrayLike, n: ArrayLike, k: ArrayLike) -> np.ndarray:
        m, n, k = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k))
        return np.asarray(self.eta_max * (m / (m + self.d_half)) * (n / (n + self.d_half)) * (k / (k + self.k_half)))

    def time_s(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, peak_flops: float, mem_bw_Bps: float) -> np.ndarray:
        """Seconds for one (m x k) @ (k x n) matmul."""
        m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
        compute = 2.0 * m * n * k / (peak_flops * self.efficiency(m, n, k))
        traffic = self.bytes_per_element * (m * k + k * n + m * n) / mem_bw_Bps
        return np.maximum(compute, traffic)
