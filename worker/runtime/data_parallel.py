"""Data parallelism: DDP for ZeRO-0, FSDP2 (``fully_shard``) for ZeRO-1/2/3.

FSDP2 has no optimizer-only sharding; ZeRO-1 and ZeRO-2 both map to ``reshard_after_forward=False``
(parameters stay gathered between forward and backward, gradients are reduce-scattered: ZeRO-2), ZeRO-3
to ``reshard_after_forward=True`` (parameters re-gathered for backward). Blocks are sharded one by one so
their all-gathers overlap compute, then the root (embedding, norm, head).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from worker.runtime.model import blocks


def apply_ddp(model: nn.Module, mesh: DeviceMesh, ignored: set[nn.Parameter] | None = None) -> nn.Module:
    """Wrap in DDP over the 1-D data-parallel ``mesh``; returns the wrapper (train through it). ``ignored``:
    parameters whose gradients are reduced elsewhere (expert shards: ``expert_parallel``)."""
    if ignored:
        names = [name for name, p in model.named_parameters() if p in ignored]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    return DistributedDataParallel(model, process_group=mesh.get_group(), device_ids=device_ids)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, zero: int, param_dtype: torch.dtype | None = None,
               ignored: set[nn.Parameter] | None = None) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over ``mesh`` (1-D dp, or 2-D dp x tp for HSDP-free 2-D), leaving the
    ``ignored`` parameters (expert shards) alone."""
    reshard = zero >= 3
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else None
    for module in [*blocks(model).values(), model]:
        if policy is None:
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard, ignored_params=ignored or None)
        else:
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy,
                        ignored_params=ignored or None)
    return model


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Skip (False) or do (True) the gradient reduction of the next backward, for gradient accumulation."""
    if isinstance(model, DistributedDataParallel):
        model.require_backward_grad_sync = enabled
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
