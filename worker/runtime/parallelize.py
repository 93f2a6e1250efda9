"""Apply a RuntimePlan to the model on this rank, layer by layer: meshes, then TP / Ulysses / ring attention,
recompute, re-layouts between neighbouring layers, data parallelism and pipeline stages, in torchtitan's order
(TP -> activation checkpointing -> FSDP / gradient all-reduce -> pipeline schedule). MoE layers are sharded first
(``expert_parallel``: experts over their own fold of the stage's ranks), and their expert gradients are reduced
over expert-dp, apart from the dense parameters.

``ParallelModel.train_step`` runs one optimizer step over the global batch (all micro-batches) and returns
the global mean loss, identical on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from worker.runtime.checkpointing import apply_checkpointing
from worker.runtime.data import local_batch
from worker.runtime.data_parallel import ReplicatedParameters, apply_fsdp, set_gradient_sync
from worker.runtime.expert_parallel import (
    ExpertMeshes,
    ExpertShard,
    apply_expert_parallel,
    build_expert_meshes,
    expert_data_parallel,
    expert_parameters,
)
from worker.runtime.layouts import apply_relayouts
from worker.runtime.model import blocks, build_model, lm_loss
from worker.runtime.pipeline import Schedule, build_schedule, cut_stage, stage_ids
from worker.runtime.plan import LayerLayout, RuntimePlan
from worker.runtime.ring_attention import apply_context_parallel
from worker.runtime.tensor_parallel import reduce_partial_gradients, tensor_parallel_block, tensor_parallel_ends
from worker.runtime.ulysses import apply_ulysses

MeshShape = tuple[int, int, int]  # (dp, cp, tp) of a layout


def _shape(layout: LayerLayout) -> MeshShape:
    return layout.dp, layout.cp, layout.tp


def data_dims(layout: LayerLayout) -> tuple[str, ...]:
    """The mesh dimensions whose ranks average a layout's gradients (``LayerLayout.data_ranks``): dp, and the ranks
    that replicate the weights while splitting the sequence: the cp ring's and, with Ulysses, the tp dim's."""
    return ("dp", "cp", "tp") if layout.ulysses > 1 else ("dp", "cp")


class Meshes:
    """One device mesh ``pp x dp x cp x tp`` over the whole world per distinct (dp, cp, tp) of the plan's layouts,
    every one of them created on every rank in the same order (creating a process group is collective). Each rank
    uses the sub-meshes of its own pipeline stage; local rank ``r`` of a stage is the same process under every
    layout, which is what lets activations move between layouts (``layouts.relayout``)."""

    def __init__(self, plan: RuntimePlan, device_type: str) -> None:
        every = [*plan.layers, plan.embedding, plan.head]
        self._meshes: dict[MeshShape, DeviceMesh] = {}
        for shape in sorted({_shape(x) for x in every}):
            self._meshes[shape] = init_device_mesh(device_type, (plan.pp, *shape), mesh_dim_names=("pp", "dp", "cp",
                                                                                                   "tp"))
        self._data: dict[tuple[MeshShape, tuple[str, ...]], DeviceMesh] = {}
        for shape, dims in sorted({(_shape(x), data_dims(x)) for x in every}):
            self._data[shape, dims] = self._flatten(self._meshes[shape], dims)
        base = self._meshes[_shape(plan.embedding)]
        self.pp: DeviceMesh = base["pp"]
        self.stage: DeviceMesh = base["dp", "cp", "tp"]._flatten("stage")  # local rank = dp * cp * tp index

    @staticmethod
    def _flatten(mesh: DeviceMesh, dims: tuple[str, ...]) -> DeviceMesh:
        used = tuple(d for d in dims if mesh[d].size() > 1) or dims[:1]
        return mesh[used[0]] if len(used) == 1 else mesh[used]._flatten("_".join(used))

    def of(self, layout: LayerLayout) -> DeviceMesh:
        return self._meshes[_shape(layout)]

    def data(self, layout: LayerLayout) -> DeviceMesh:
        """The 1-D mesh of the ranks that average ``layout``'s gradients (its ZeRO stage shards over them)."""
        return self._data[_shape(layout), data_dims(layout)]


def apply_model_parallel(plan: RuntimePlan, model: nn.Module, meshes: Meshes) -> None:
    """Tensor parallelism, Ulysses and ring attention, each layer in its own layout, and the embedding / LM head in
    theirs."""
    for key, block in blocks(model).items():
        layout = plan.layers[int(key)]
        if layout.tensor_parallel > 1:
            tensor_parallel_block(block, meshes.of(layout)["tp"], sequence_parallel=layout.sp == "megatron")
        if layout.ulysses > 1:
            apply_ulysses(block, meshes.of(layout)["tp"].get_group())
        if layout.cp > 1:
            apply_context_parallel(block, meshes.of(layout)["cp"].get_group())
    if plan.embedding.tensor_parallel > 1:
        tensor_parallel_ends(model, meshes.of(plan.embedding)["tp"], embedding_sp=plan.embedding.sp == "megatron",
                             head_sp=plan.head.sp == "megatron", vocab_parallel_loss=vocab_parallel_loss(plan))


def apply_data_parallel(plan: RuntimePlan, model: nn.Module, meshes: Meshes, param_dtype: torch.dtype | None,
                        shards: list[ExpertShard]) -> list[ReplicatedParameters]:
    """Each block's gradients reduced over its own data-parallel ranks at its own ZeRO stage, the embedding, final
    norm and LM head's over theirs: FSDP2 for ZeRO-2/3 (the module itself becomes the FSDP root, keeping off the
    parameters that are not sharded), ``ReplicatedParameters`` for ZeRO-0/1 (returned: the step reduces them).
    An MoE layer's expert ``shards`` first, over expert-dp (``expert_data_parallel``)."""
    groups: list[ReplicatedParameters] = []
    for shard in shards:
        layout = plan.layers[shard.index]
        groups += expert_data_parallel([shard], layout.zero, layout.data_ranks, param_dtype) or []
    experts = expert_parameters(shards)  # as they are now (FSDP2 replaced the sharded ones)
    replicated: dict[tuple[DeviceMesh, int], list[nn.Parameter]] = {}  # (data mesh, ZeRO stage) -> parameters
    kept_off: set[nn.Parameter] = set(experts)  # parameters no dense FSDP module shards
    sharded_any = False
    parts: list[tuple[LayerLayout, list[nn.Parameter], nn.Module | None]] = [
        (plan.layers[int(key)], [p for p in block.parameters() if p not in experts], block)
        for key, block in blocks(model).items()]
    ends = [p for name, p in model.named_parameters() if not name.startswith("layers.")]
    parts.append((plan.embedding, ends, None))  # the root: sharded by the fully_shard of the model below
    for layout, params, module in parts:
        mesh = meshes.data(layout)
        if mesh.size() > 1 and layout.zero >= 2:
            sharded_any = True
            if module is not None:
                apply_fsdp(module, mesh, layout.zero, param_dtype, ignored_params=experts or None)
            continue
        kept_off.update(params)
        if mesh.size() > 1:
            replicated.setdefault((mesh, layout.zero), []).extend(params)
    if sharded_any:
        emb = plan.embedding
        apply_fsdp(model, meshes.data(emb), emb.zero if emb.zero >= 2 else 2, param_dtype, ignored_params=kept_off)
    return groups + [ReplicatedParameters(params, mesh.get_group(), zero) for (mesh, zero), params in replicated.items()
                      if params]


def vocab_parallel_loss(plan: RuntimePlan) -> bool:
    """Cross-entropy on vocabulary-sharded logits (no logits all-gather) whenever the LM head is tensor-parallel."""
    return plan.head.tensor_parallel > 1


def parallelize_module_for(plan: RuntimePlan, model: nn.Module, meshes: Meshes, param_dtype: torch.dtype | None,
                           expert_meshes: ExpertMeshes | None = None) -> tuple[nn.Module, list[ReplicatedParameters]]:
    """Every parallelism except the pipeline, applied to ``model`` (the whole model or one stage). An MoE plan
    needs the ``expert_meshes`` (``build_expert_meshes``)."""
    shards: list[ExpertShard] = []
    if any(plan.experts):
        tp_meshes = {int(key): meshes.of(plan.layers[int(key)])["tp"] for key in blocks(model)}
        shards = apply_expert_parallel(model, plan, expert_meshes or {}, tp_meshes)
    apply_model_parallel(plan, model, meshes)
    apply_checkpointing(model, plan.recompute)
    apply_relayouts(model, plan.layers, plan.embedding, plan.head, meshes.stage.get_group())
    return model, apply_data_parallel(plan, model, meshes, param_dtype, shards)


def optimizer_param_groups(params: list[nn.Parameter]) -> list[dict[str, Any]]:
    """One AdamW param group per kind of tensor (plain, or DTensor on a given mesh): the foreach kernels take
    one kind at a time, and a per-layer plan mixes them."""
    groups: dict[object, list[nn.Parameter]] = {}
    for p in params:
        key = ("dtensor", id(p.device_mesh)) if isinstance(p, DTensor) else "plain"
        groups.setdefault(key, []).append(p)
    return [{"params": ps} for ps in groups.values()]


@dataclass
class ParallelModel:
    plan: RuntimePlan
    meshes: Meshes
    device: torch.device
    modules: list[nn.Module]  # what this rank trains: the model, or its pipeline stages
    replicated: list[ReplicatedParameters]  # ZeRO-0/1 parameter groups, reduced by the step itself
    schedule: Schedule | None = None
    has_first: bool = True
    has_last: bool = True
    optimizer: torch.optim.Optimizer | None = None
    notes: list[str] = field(default_factory=list)

    def parameters(self) -> Iterator[nn.Parameter]:
        for m in self.modules:
            yield from m.parameters()

    def release_others_state(self) -> None:
        """ZeRO-1: keep optimizer state only for this rank's own share (after loading a checkpoint)."""
        assert self.optimizer is not None
        for group in self.replicated:
            group.release_others_state(self.optimizer)

    @property
    def dp_rank(self) -> int:
        """This rank's share of the input batch's rows (the embedding's data-parallel rank)."""
        return self.meshes.of(self.plan.embedding)["dp"].get_local_rank()

    @property
    def sp_rank(self) -> int:
        """This rank's share of its context chunks (the embedding's Ulysses rank)."""
        return self.meshes.of(self.plan.embedding)["tp"].get_local_rank() if self.plan.embedding.ulysses > 1 else 0

    @property
    def cp_rank(self) -> int:
        """Which context chunks of the input sequence this rank takes (the embedding's cp rank)."""
        return self.meshes.of(self.plan.embedding)["cp"].get_local_rank()

    def _autocast(self) -> torch.autocast:
        enabled = self.device.type == "cuda" and self.plan.precision in ("bf16", "fp16")
        dtype = torch.float16 if self.plan.precision == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype, enabled=enabled)

    def train_step(self, tokens: torch.Tensor, rows_are_local: bool = False) -> float:
        """One optimizer step on the global batch ``tokens`` (batch, seq + 1), or with ``rows_are_local`` on this
        data-parallel rank's rows of it (a dataset shard); returns the global mean loss."""
        assert self.optimizer is not None
        plan = self.plan
        dp_rank, dp = (0, 1) if rows_are_local else (self.dp_rank, plan.dp)
        emb = plan.embedding
        inputs, labels = local_batch(tokens, dp_rank, dp, self.sp_rank, emb.ulysses, self.cp_rank, emb.cp)
        inputs, labels = inputs.to(self.device), labels.to(self.device)
        loss_sum, count = 0.0, 0
        # Forward and backward of a vocabulary-parallel loss must both run inside loss_parallel().
        with self._autocast(), loss_parallel() if vocab_parallel_loss(plan) else contextlib.nullcontext():
            if self.schedule is not None:
                losses: list[torch.Tensor] = []
                target: dict[str, Any] = {"target": labels, "losses": losses} if self.has_last else {}
                if self.has_first:
                    self.schedule.step(inputs, **target)
                else:
                    self.schedule.step(**target)
                if self.has_last:
                    loss_sum, count = float(torch.stack(losses).detach().mean()), 1
            else:
                model = self.modules[0]
                micro = plan.micro_batches
                for i, (x, y) in enumerate(zip(inputs.chunk(micro), labels.chunk(micro), strict=True)):
                    set_gradient_sync(self.modules, i == micro - 1)
                    loss = lm_loss(model(x), y) / micro
                    loss.backward()
                    loss_sum += float(loss.detach())
                count = 1
        reduce_partial_gradients(self.parameters())
        for group in self.replicated:
            group.reduce_gradients()
        self.optimizer.step()
        for group in self.replicated:
            group.broadcast_owned()
        self.optimizer.zero_grad(set_to_none=True)
        # Every rank that computed a loss holds the mean over its tokens, and every such rank has as many
        # tokens as the others: the global mean is the mean of those.
        agg = torch.tensor([loss_sum, float(count)], dtype=torch.float64, device=self.device)
        dist.all_reduce(agg)
        return float(agg[0] / agg[1])


def parallelize(plan: RuntimePlan, seed: int, device: torch.device, lr: float = 1e-3) -> ParallelModel:
    """Build the model of ``plan`` on this rank and apply the plan. Needs an initialised process group."""
    return apply_plan(plan, build_model(plan.model, seed, device), device, lr)


def apply_plan(plan: RuntimePlan, model: nn.Module, device: torch.device, lr: float = 1e-3) -> ParallelModel:
    """Apply ``plan`` to ``model`` (the full model, identical on every rank, Decoder-style names) on this
    rank; with pipeline parallelism the stages are cut from it. Needs an initialised process group."""
    meshes = Meshes(plan, device.type)
    expert_meshes = build_expert_meshes(plan, device.type)
    param_dtype = torch.bfloat16 if device.type == "cuda" and plan.precision == "bf16" else None
    if plan.pp == 1:
        module, replicated = parallelize_module_for(plan, model, meshes, param_dtype, expert_meshes)
        pm = ParallelModel(plan, meshes, device, [module], replicated)
    else:
        ids = stage_ids(meshes.pp.get_local_rank(), plan.pp, plan.virtual_stages)
        num_stages = plan.pp * plan.virtual_stages
        stages, replicated = [], []
        for i in ids:
            stage, groups = parallelize_module_for(plan, cut_stage(model, i, plan.stage_layers), meshes, param_dtype,
                                                   expert_meshes)
            stages.append(stage)
            replicated.extend(groups)
        del model
        schedule = build_schedule(stages, ids, num_stages, meshes.pp.get_group(), device, plan.micro_batches,
                                  plan.schedule, lm_loss)
        pm = ParallelModel(plan, meshes, device, stages, replicated, schedule, has_first=0 in ids,
                           has_last=num_stages - 1 in ids)
    pm.optimizer = torch.optim.AdamW(optimizer_param_groups(list(pm.parameters())), lr=lr, weight_decay=0.0)
    return pm
