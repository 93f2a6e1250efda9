"""A plan's MoE layers on this rank: expert parallelism, expert TP and LSH-MoE as the plan says, per MoE layer.

Parallel folding (``solvers.run_experts``): the ranks of a pipeline stage, which run the layer's attention in the
layer's own ``dp x tp`` layout, are re-read for an MoE layer's experts as ``edp x ep x etp`` (etp varying
fastest), one fold mesh ``pp x edp x ep x etp`` per expert layout the plan uses. On it:

- ``ep``: the layer's experts are dealt out over the ep ranks (ranks ``etp`` apart), tokens reach them by
  all-to-all (``moe.MoELayer``);
- ``etp``: each expert's MLP is split over the etp neighbours (columns of w1/w3, rows of w2);
- ``edp``: the ranks that hold the same expert shard. Every token of the step is owned by exactly one rank
  (data parallelism, the sequence split of Ulysses or Megatron SP, and under plain TP each tp rank routes its
  1/tp of the tokens), so an expert shard's gradient summed over edp is the sum over every data shard's loss;
  divided by the number of data shards ``D`` (the layer's dp, times its Ulysses degree: ``data_ranks``) it is the
  gradient of the global mean loss, as the dense parameters' average over the data-parallel group is. The
  shard's gradient is scaled by ``edp / D`` in backward (``Experts.grad_scale``) and then averaged over edp: with
  ZeRO-2/3 (and edp > 1) by FSDP2 sharding the expert states over edp, otherwise by ``ReplicatedParameters``
  (ZeRO-0, or ZeRO-1: optimizer state owned tensor by tensor over edp) before the optimizer step;
- the router is replicated and sees this rank's tokens only: under TP it is a DTensor replicated over the tp
  group (DTensor sums its gradient over the group's tokens), otherwise the data-parallel wrapper averages it
  with the other dense parameters;
- ``lsh``: LSH-MoE compression of the all-to-alls with the cost model's hash count and projection width.

Nothing here is approximated: an expert layout the fold cannot run is refused by ``solvers.run_layout``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from solvers.cost_model.moe import LSH_HASHES, LSH_PROJ_DIM
from worker.runtime.data_parallel import ReplicatedParameters
from worker.runtime.lsh import LSHCompression
from worker.runtime.model import blocks
from worker.runtime.moe import AllToAllStats, MoELayer, moe_layers
from worker.runtime.plan import RuntimePlan

ExpertMeshes = dict[tuple[int, int], DeviceMesh]  # (ep, etp) -> the fold mesh pp x edp x ep x etp


@dataclass
class ExpertShard:
    layer: MoELayer  # this rank's shard of one MoE layer
    edp: DeviceMesh  # the ranks holding the same expert shard
    index: int  # the layer's global index


def build_expert_meshes(plan: RuntimePlan, device_type: str) -> ExpertMeshes:
    """One fold mesh per expert layout of the plan (over a stage's ranks, whatever the layer's attention layout).
    Every rank builds all of them in the same order (building a mesh is collective, and pipeline stages hold
    different layers)."""
    ranks = plan.stage_ranks
    layouts = sorted({(x.ep, x.etp) for x in plan.experts if x is not None})
    return {(ep, etp): init_device_mesh(device_type, (plan.pp, ranks // (ep * etp), ep, etp),
                                        mesh_dim_names=("pp", "edp", "ep", "etp")) for ep, etp in layouts}


def apply_expert_parallel(model: nn.Module, plan: RuntimePlan, meshes: ExpertMeshes,
                          tp_meshes: Mapping[int, DeviceMesh]) -> list[ExpertShard]:
    """Replace each MoE layer of ``model`` (a Decoder or a pipeline stage of one, whole MoE layers identical on
    every rank) by this rank's shard of it, in place; before tensor parallelism and checkpointing. ``tp_meshes``:
    each layer's tensor-parallel mesh."""
    out: list[ExpertShard] = []
    for key, block in blocks(model).items():
        full = block.get_submodule("feed_forward")
        index = int(key)
        tp_mesh = tp_meshes[index]
        tensor_parallel = plan.layers[index].tensor_parallel > 1
        # Attention under TP without SP leaves the tp ranks the same tokens: each routes its 1/tp of them.
        token_group = tp_mesh.get_group() if tensor_parallel and plan.layers[index].sp != "megatron" else None
        layout = plan.experts[index] if index < len(plan.experts) else None
        if (layout is None) != (not isinstance(full, MoELayer)):
            raise ValueError(f"layer {index}: the plan has {'a dense' if layout is None else 'an MoE'} layer there, "
                             f"the model {type(full).__name__}")
        if layout is None or not isinstance(full, MoELayer):
            continue
        mesh = meshes[(layout.ep, layout.etp)]
        layer = MoELayer.sharded_from(full, mesh["ep"].get_group() if layout.ep > 1 else None,
                                      mesh["etp"].get_group() if layout.etp > 1 else None, token_group)
        if layout.lsh:
            layer.compression = LSHCompression(layer.hidden, LSH_HASHES, LSH_PROJ_DIM, seed=index)
        if tensor_parallel:  # replicated weight, rows sharded: DTensor sums the gradient over the tp group
            parallelize_module(layer.router.gate, tp_mesh, SequenceParallel(sequence_dim=0, use_local_output=True))
        setattr(block, "feed_forward", layer)  # noqa: B010
        out.append(ExpertShard(layer, mesh["edp"], index))
    return out


def expert_data_parallel(shards: Iterable[ExpertShard], zero: int, data_shards: int,
                         param_dtype: torch.dtype | None = None) -> list[ReplicatedParameters]:
    """Reduce expert gradients over expert-dp (see the module's docstring): FSDP2 over edp for ZeRO-2/3, else the
    returned groups, which the training step reduces after the last backward, before the optimizer step (also over
    one rank: a shard no row reached this step gets a zero gradient, as its slice of the whole layer's has)."""
    manual: dict[DeviceMesh, list[nn.Parameter]] = {}
    for shard in shards:
        edp = shard.edp.size()
        # (a factor, not FSDP2's gradient divide factor: that needs PREMUL_SUM, which gloo lacks)
        shard.layer.experts.grad_scale = edp / data_shards
        if zero >= 2 and edp > 1:
            policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else \
                MixedPrecisionPolicy()
            fully_shard(shard.layer.experts, mesh=shard.edp, reshard_after_forward=zero >= 3, mp_policy=policy)
        else:
            manual.setdefault(shard.edp, []).extend(shard.layer.experts.parameters())
    return [ReplicatedParameters(params, edp.get_group(), zero if zero < 2 else 0) for edp, params in manual.items()]


def expert_parameters(shards: Iterable[ExpertShard]) -> set[nn.Parameter]:
    """The expert shards' parameters as they are now (FSDP2 replaces them by sharded ones): the dense
    data-parallel wrapper must leave them to ``expert_data_parallel``."""
    return {p for shard in shards for p in shard.layer.experts.parameters()}


def alltoall_metrics(modules: Iterable[nn.Module], device: torch.device) -> dict[str, float]:
    """The MoE layers' all-to-all traffic of the run, summed over every rank (bytes), the slowest rank's time."""
    total = AllToAllStats()
    for m in modules:
        for layer in moe_layers(m):
            total.bytes_sent += layer.stats.bytes_sent
            total.bytes_uncompressed += layer.stats.bytes_uncompressed
            total.seconds += layer.stats.seconds
            total.calls += layer.stats.calls
    sums = torch.tensor([total.bytes_sent, total.bytes_uncompressed], dtype=torch.float64, device=device)
    dist.all_reduce(sums)
    slowest = torch.tensor([total.seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    total.bytes_sent, total.bytes_uncompressed = int(sums[0]), int(sums[1])
    total.seconds = float(slowest[0])
    return total.as_dict()
