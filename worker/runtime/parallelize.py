"""Apply a RuntimePlan to the model on this rank: mesh, then TP / Ulysses / ring attention, recompute, data
parallelism and pipeline stages, in torchtitan's order (TP -> activation checkpointing -> FSDP/DDP -> pipeline
schedule). MoE layers are sharded first (``expert_parallel``: experts over their own fold of the stage's ranks),
and their expert gradients are reduced over expert-dp, apart from the dense parameters.

``ParallelModel.train_step`` runs one optimizer step over the global batch (all micro-batches) and returns
the global mean loss, identical on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from worker.runtime.checkpointing import apply_checkpointing
from worker.runtime.data import local_batch
from worker.runtime.data_parallel import apply_ddp, apply_fsdp, set_gradient_sync
from worker.runtime.expert_parallel import (
    ExpertMeshes,
    apply_expert_parallel,
    build_expert_meshes,
    expert_data_parallel,
    expert_parameters,
)
from worker.runtime.model import build_model, lm_loss
from worker.runtime.pipeline import Schedule, build_schedule, cut_stage, stage_ids
from worker.runtime.plan import RuntimePlan
from worker.runtime.ring_attention import apply_context_parallel
from worker.runtime.tensor_parallel import apply_tensor_parallel
from worker.runtime.ulysses import apply_ulysses


def build_mesh(plan: RuntimePlan, device_type: str) -> DeviceMesh:
    """pp x dp x cp x tp over the world, tp varying fastest (neighbouring ranks share a tensor group), then the
    context-parallel ring (as torchtitan's pp, dp, cp, tp)."""
    return init_device_mesh(device_type, (plan.pp, plan.dp, plan.cp, plan.tp),
                            mesh_dim_names=("pp", "dp", "cp", "tp"))


def data_parallel_mesh(mesh: DeviceMesh, plan: RuntimePlan) -> DeviceMesh:
    """The ranks that average gradients: dp, and the ranks that replicate the weights while splitting the
    sequence: the cp ring's and, with Ulysses, the sequence ranks of the tp dim."""
    dims = ("dp",) + (("cp",) if plan.cp > 1 else ()) + (("tp",) if plan.sp == "ulysses" else ())
    if len(dims) == 1:
        return mesh["dp"]
    return mesh[dims]._flatten("_".join(dims))


def vocab_parallel_loss(plan: RuntimePlan) -> bool:
    """Cross-entropy on vocabulary-sharded logits (no logits all-gather) whenever tensor parallelism is on."""
    return plan.tensor_parallel > 1


def parallelize_module_for(plan: RuntimePlan, model: nn.Module, mesh: DeviceMesh,
                           param_dtype: torch.dtype | None, notes: list[str],
                           expert_meshes: ExpertMeshes | None = None,
                           before_step: list[Callable[[], None]] | None = None) -> nn.Module:
    """Every parallelism except the pipeline, applied to ``model`` (the whole model or one stage). An MoE plan
    needs the ``expert_meshes`` (``build_expert_meshes``); what reduces expert gradients outside the data-parallel
    wrapper is appended to ``before_step`` (to run after the last backward of a step)."""
    shards = apply_expert_parallel(model, plan, expert_meshes or {}, mesh["tp"]) if any(plan.experts) else []
    if plan.tensor_parallel > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=plan.sp == "megatron",
                              vocab_parallel_loss=vocab_parallel_loss(plan))
    if plan.sequence_parallel > 1:
        apply_ulysses(model, mesh["tp"].get_group())
    if plan.cp > 1:
        apply_context_parallel(model, mesh["cp"].get_group())
    apply_checkpointing(model, plan.recompute)
    dp_mesh = data_parallel_mesh(mesh, plan)
    if shards:
        reduce = expert_data_parallel(shards, plan.zero, dp_mesh.size(), param_dtype)
        if reduce is not None:
            assert before_step is not None, "an MoE plan's expert gradients need the training step's hook"
            before_step.append(reduce)
    ignored = expert_parameters(shards)
    if dp_mesh.size() == 1 and plan.tensor_parallel == 1:
        return model
    zero = plan.zero
    if zero == 0 and dp_mesh.size() > 1 and (plan.tensor_parallel > 1 or plan.pp > 1):
        # DDP takes no DTensor parameters, and its bucket rebuilding breaks on the first step when a pipeline
        # runs several backward passes under no_sync; FSDP2 without resharding is the closest equivalent.
        why = "TP" if plan.tensor_parallel > 1 else "pipeline micro-batching"
        notes.append(f"zero=0 ran as FSDP2 reshard_after_forward=False (DDP does not compose with {why})")
        zero = 2
    if zero == 0:
        return apply_ddp(model, dp_mesh, ignored) if dp_mesh.size() > 1 else model
    if dp_mesh.size() == 1:
        return model
    return apply_fsdp(model, dp_mesh, zero, param_dtype, ignored)


@dataclass
class ParallelModel:
    plan: RuntimePlan
    mesh: DeviceMesh
    device: torch.device
    modules: list[nn.Module]  # what this rank trains: the model, or its pipeline stages
    schedule: Schedule | None = None
    has_first: bool = True
    has_last: bool = True
    optimizer: torch.optim.Optimizer | None = None
    notes: list[str] = field(default_factory=list)
    before_step: list[Callable[[], None]] = field(default_factory=list)  # after the last backward of a step

    def parameters(self) -> Iterator[nn.Parameter]:
        for m in self.modules:
            yield from m.parameters()

    @property
    def dp_rank(self) -> int:
        return self.mesh["dp"].get_local_rank()

    @property
    def sp_rank(self) -> int:
        return self.mesh["tp"].get_local_rank() if self.plan.sp == "ulysses" else 0

    @property
    def cp_rank(self) -> int:
        return self.mesh["cp"].get_local_rank()

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
        inputs, labels = local_batch(tokens, dp_rank, dp, self.sp_rank, plan.sequence_parallel, self.cp_rank, plan.cp)
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
                    set_gradient_sync(model, i == micro - 1)
                    loss = lm_loss(model(x), y) / micro
                    loss.backward()
                    loss_sum += float(loss.detach())
                count = 1
        for reduce in self.before_step:
            reduce()
        self.optimizer.step()
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
    mesh = build_mesh(plan, device.type)
    expert_meshes = build_expert_meshes(plan, device.type)
    notes: list[str] = []
    before_step: list[Callable[[], None]] = []
    param_dtype = torch.bfloat16 if device.type == "cuda" and plan.precision == "bf16" else None
    if plan.pp == 1:
        modules = [parallelize_module_for(plan, model, mesh, param_dtype, notes, expert_meshes, before_step)]
        pm = ParallelModel(plan, mesh, device, modules, notes=notes, before_step=before_step)
    else:
        pp_rank = mesh["pp"].get_local_rank()
        ids = stage_ids(pp_rank, plan.pp, plan.virtual_stages)
        num_stages = plan.pp * plan.virtual_stages
        stages = [parallelize_module_for(plan, cut_stage(model, i, plan.stage_layers), mesh, param_dtype, notes,
                                         expert_meshes, before_step) for i in ids]
        del model
        schedule = build_schedule(stages, ids, num_stages, mesh["pp"].get_group(), device, plan.micro_batches,
                                  plan.schedule, lm_loss)
        pm = ParallelModel(plan, mesh, device, stages, schedule, has_first=0 in ids,
                           has_last=num_stages - 1 in ids, notes=notes, before_step=before_step)
    pm.optimizer = torch.optim.AdamW(list(pm.parameters()), lr=lr, weight_decay=0.0)
    return pm
