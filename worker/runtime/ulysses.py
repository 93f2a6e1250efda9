"""DeepSpeed-Ulysses sequence parallelism: all-to-all around attention (written here; PyTorch's built-in
context parallel does not run on CPU/gloo).

Each rank of a sequence group holds a contiguous 1/sp slice of every sequence. Before attention, an
all-to-all turns (batch, seq/sp, heads, d) into (batch, seq, heads/sp, d): every rank then attends whole
sequences with a subset of the heads; a second all-to-all turns the result back. Weights are replicated in
the group, so their gradients are averaged over it together with data parallelism.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    world = dist.get_world_size(group)
    # all_to_all_single exchanges equal chunks of dim 0: move the scattered dim to the front.
    chunks = x.movedim(scatter_dim, 0).contiguous()
    out = torch.empty_like(chunks)
    dist.all_to_all_single(out, chunks, group=group)
    # out now holds [rank0's piece, rank1's piece, ...] along dim 0; put the pieces side by side on gather_dim.
    pieces = out.chunk(world, dim=0)
    return torch.cat([p.movedim(0, scatter_dim) for p in pieces], dim=gather_dim).contiguous()


class _AllToAll(torch.autograd.Function):
    """Differentiable re-split: the backward of scattering A and gathering B scatters B and gathers A."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int,
                gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim=scatter_dim, gather_dim=gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.group, scatter_dim=gather_dim, gather_dim=scatter_dim), None, None, None


def gather_sequence_scatter_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(b, s/sp, H, d) -> (b, s, H/sp, d), differentiable."""
    out: torch.Tensor = _AllToAll.apply(x, group, 2, 1)
    return out


def gather_heads_scatter_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(b, s, H/sp, d) -> (b, s/sp, H, d), differentiable."""
    out: torch.Tensor = _AllToAll.apply(x, group, 1, 2)
    return out


def apply_ulysses(model: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Make every attention of ``model`` exchange sequence for heads over ``group`` (None: no exchange).

    The caller feeds each rank its sequence slice (``worker.runtime.data``) and averages gradients over the
    group (data-parallel wrapper over dp x sp)."""
    from worker.runtime.model import Attention

    for module in model.modules():
        if isinstance(module, Attention):
            module.sequence_group = group
