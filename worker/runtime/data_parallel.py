"""Data parallelism, per layer, over the layer's own data-parallel ranks (``LayerLayout.data_ranks``: dp, cp and
the Ulysses ranks), at the layer's own ZeRO stage:

- ZeRO-0 (``ReplicatedParameters``): after the step's backward passes, each group of parameters has its
  gradients all-reduced (averaged) over its ranks in one flat buffer. Explicit rather than DDP: DDP takes neither
  DTensor (tensor-parallel) parameters nor several process groups in one model, and a pipeline runs several
  backward passes per step.
- ZeRO-1 (``ReplicatedParameters``): gradients all-reduced in full as for ZeRO-0; the optimizer state is
  sharded: every parameter has one owner among the ranks (whole tensors, balanced by size, as torch's
  ZeroRedundancyOptimizer). A rank then drops the gradients of the parameters others own; the optimizer skips a
  parameter without a gradient, so it steps, and keeps state for, its own only; each owner then broadcasts its
  updated parameters. AdamW is elementwise, so this is the same update as unsharded. (Every rank's optimizer
  lists every parameter, so that its checkpoint has the same structure on every rank.)
- ZeRO-2 / ZeRO-3 (``apply_fsdp``): FSDP2 ``fully_shard`` of the block on its data-parallel mesh. FSDP2 has no
  ZeRO-2 proper: ZeRO-2 maps to ``reshard_after_forward=False`` (parameters stay gathered between forward and
  backward, gradients are reduce-scattered; between steps the parameters are sharded too), ZeRO-3 to
  ``reshard_after_forward=True`` (re-gathered for backward).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


def apply_fsdp(module: nn.Module, mesh: DeviceMesh, zero: int, param_dtype: torch.dtype | None = None,
               ignored_params: set[nn.Parameter] | None = None) -> nn.Module:
    """Shard ``module``'s parameters (except those already sharded by a submodule's ``fully_shard`` and
    ``ignored_params``) in place with FSDP2 over the 1-D data-parallel ``mesh``; with tensor-parallel (DTensor)
    parameters the mesh must come from the same device mesh as theirs (2-D FSDP x TP)."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    if policy is None:
        fully_shard(module, mesh=mesh, reshard_after_forward=zero >= 3, ignored_params=ignored_params)
    else:
        fully_shard(module, mesh=mesh, reshard_after_forward=zero >= 3, mp_policy=policy,
                    ignored_params=ignored_params)
    return module


def _local(t: torch.Tensor) -> torch.Tensor:
    """The rank's own elements (a DTensor's local shard; under no_grad ``to_local`` is the very storage)."""
    return t.to_local() if isinstance(t, DTensor) else t


def all_reduce_flat(tensors: list[torch.Tensor], group: dist.ProcessGroup, divide_by: int = 1) -> None:
    """Sum ``tensors`` over ``group`` in place, divided by ``divide_by``: one flat all-reduce for all of them (one
    message, not one per tensor)."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat /= divide_by
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


class ReplicatedParameters:
    """Parameters held whole by every rank of ``group`` (ZeRO-0, or ZeRO-1 with ``zero=1``)."""

    def __init__(self, params: Iterable[nn.Parameter], group: dist.ProcessGroup, zero: int) -> None:
        if zero not in (0, 1):
            raise ValueError(f"zero={zero}: replicated parameters are ZeRO-0 or ZeRO-1")
        self.params, self.group, self.zero = list(params), group, zero
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.owner = self._balance() if zero == 1 else [self.rank] * len(self.params)
        self.stepped = [o == self.rank for o in self.owner]
        if not any(self.stepped) and self.params:
            # Fewer tensors than ranks: this rank also steps the smallest one (as its owner does, from the same
            # reduced gradients: the same values), so that its optimizer never has an empty state, which
            # torch.distributed.checkpoint would fill with zeros for every parameter before saving.
            self.stepped[min(range(len(self.params)), key=lambda i: _local(self.params[i]).numel())] = True

    def _balance(self) -> list[int]:
        """Owner of each parameter: largest first, to the least loaded rank (the same on every rank: the shapes
        are)."""
        load, owner = [0] * self.size, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -_local(self.params[i]).numel()):
            owner[i] = min(range(self.size), key=lambda r: (load[r], r))
            load[owner[i]] += _local(self.params[i]).numel()
        return owner

    def others(self) -> list[nn.Parameter]:
        """The parameters this rank does not step: other ranks own them (none under ZeRO-0)."""
        return [p for p, mine in zip(self.params, self.stepped, strict=True) if not mine]

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Average the gradients over the group (every rank calls this after the step's backward passes); under
        ZeRO-1 then drop those of the parameters other ranks own."""
        grads = []
        for p in self.params:
            if p.grad is None:  # unused this step: a zero gradient, so that every rank sends the same buffer
                p.grad = torch.zeros_like(p)
            grads.append(_local(p.grad))
        all_reduce_flat(grads, self.group, self.size)
        for p in self.others():
            p.grad = None

    def release_others_state(self, optimizer: torch.optim.Optimizer) -> None:
        """ZeRO-1: forget optimizer state of parameters other ranks own (a resumed checkpoint loads all of it)."""
        for p in self.others():
            optimizer.state.pop(p, None)

    @torch.no_grad()
    def broadcast_owned(self) -> None:
        """ZeRO-1, after the optimizer step: every owner sends its updated parameters to the others."""
        if self.zero != 1:
            return
        for owner in range(self.size):
            mine = [_local(p) for p, o in zip(self.params, self.owner, strict=True) if o == owner]
            if not mine:
                continue
            flat = torch.cat([t.reshape(-1) for t in mine])
            dist.broadcast(flat, src=dist.get_global_rank(self.group, owner), group=self.group)
            if owner != self.rank:
                offset = 0
                for t in mine:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()


def set_gradient_sync(modules: Iterable[nn.Module], enabled: bool) -> None:
    """Skip (False) or do (True) the FSDP gradient reduction of the next backward, for gradient accumulation
    (replicated parameters reduce once per step anyway)."""
    for module in modules:
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(enabled)
