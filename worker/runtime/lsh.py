"""LSH-MoE all-to-all compression (Nie et al., NeurIPS'24, arXiv 2411.08446).

Token copies bound for one expert are hashed with cross-polytope LSH: a random rotation ``R`` (the same on
every rank: drawn from a seeded generator) maps a row ``x`` to ``Rx``, and the bucket is the index of the
largest coordinate of ``[Rx, -Rx]`` (the nearest vertex of the cross-polytope). ``num_hashes`` independent
rotations are combined (a row's bucket is the tuple of its codes, and the expert), so two rows share a
bucket only when every hash agrees: more hashes, finer buckets, more bytes, less error.

Only bucket centroids (means) are sent; experts run on centroids; each row gets its centroid's expert
output plus its residual ``x - centroid``. Gradients flow through the centroid mean and the residual add
(hash codes are piecewise constant: no gradient, as in the paper).
"""

from __future__ import annotations

import torch
from torch import nn

from worker.runtime.moe import Compressed, moe_layers


class CrossPolytopeLSH:
    def __init__(self, hidden: int, num_hashes: int = 6, proj_dim: int = 16, seed: int = 0) -> None:
        if num_hashes < 1 or proj_dim < 1:
            raise ValueError("num_hashes and proj_dim must be positive")
        gen = torch.Generator().manual_seed(seed)
        m = min(proj_dim, hidden)
        # A random rotation restricted to m output coordinates: Q of a Gaussian matrix's QR, m columns.
        rot = [torch.linalg.qr(torch.randn(hidden, hidden, generator=gen))[0][:, :m] for _ in range(num_hashes)]
        self.rotations = torch.stack(rot)  # (num_hashes, hidden, m)

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, num_hashes) bucket codes in [0, 2m)."""
        r = self.rotations.to(device=x.device, dtype=x.dtype)
        proj = torch.einsum("nh,lhm->nlm", x, r)
        return torch.argmax(torch.cat((proj, -proj), dim=-1), dim=-1)


class LSHCompression:
    """A ``moe.Compression``: one centroid per (expert, LSH bucket)."""

    def __init__(self, hidden: int, num_hashes: int = 6, proj_dim: int = 16, seed: int = 0) -> None:
        self.lsh = CrossPolytopeLSH(hidden, num_hashes, proj_dim, seed)

    def compress(self, rows: torch.Tensor, expert: torch.Tensor, num_experts: int) -> Compressed:
        with torch.no_grad():
            key = torch.cat((expert[:, None], self.lsh.codes(rows)), dim=1)
            # lexicographic unique: buckets come out sorted by expert first, as the dispatch needs
            uniq, bucket = torch.unique(key, dim=0, return_inverse=True)
            size = torch.bincount(bucket, minlength=uniq.shape[0])
        centroids = rows.new_zeros((uniq.shape[0], rows.shape[1])).index_add(0, bucket, rows)
        centroids = centroids / size[:, None].to(rows.dtype)
        residual = rows - centroids[bucket]
        counts = torch.bincount(uniq[:, 0], minlength=num_experts)
        return Compressed(centroids, counts, lambda y: y[bucket] + residual)


def enable_lsh(model: nn.Module, num_hashes: int = 6, proj_dim: int = 16, seed: int = 0) -> int:
    """Compress every MoE layer's all-to-alls (same seed on every rank); returns how many layers."""
    layers = moe_layers(model)
    for i, layer in enumerate(layers):
        layer.compression = LSHCompression(layer.hidden, num_hashes, proj_dim, seed + i)
    return len(layers)
