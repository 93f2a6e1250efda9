"""A DeepSpeed config. DeepSpeed takes one layer layout (AutoTP or Ulysses, no ring attention), its pipeline
engine refuses ZeRO-2 and -3, and the layer split and expert parallelism live in the model code, so the config
says in ``_paraplan_notes`` what to put there."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request
from solvers.exports.layout import dominant, expert_layout, front_loaded_split, micro_batch_size, with_experts
from solvers.exports.notes import layout_notes
from solvers.exports.pricing import as_run_note
from solvers.strategy import EmbeddingStrategy, PlanStrategy


def deepspeed_zero(plan: PlanStrategy) -> int:
    """The ZeRO stage DeepSpeed runs: the plan's, except that its pipeline engine refuses ZeRO-2 and -3
    ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"), so a pipelined plan gets ZeRO-1."""
    zero = dominant(plan).zero
    return min(zero, 1) if plan.pp > 1 else zero


def deepspeed_run_plan(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None) -> PlanStrategy | None:
    """What DeepSpeed runs from ``deepspeed_config``: the dominant layout on every layer (AutoTP without
    sequence parallelism; context parallelism as Ulysses), its ZeRO stage (``deepspeed_zero``) and the plan's
    recomputation, 1F1B over DeepSpeed's uniform partition. None when the layout has both TP and CP (DeepSpeed
    has no such combination to estimate)."""
    s = replace(dominant(plan), zero=deepspeed_zero(plan))
    if s.cp > 1 and s.tp > 1:
        return None
    base = replace(s, tp=s.cp, cp=1, sp="ulysses") if s.cp > 1 else replace(s, sp=None if s.sp == "megatron" else s.sp)
    uly = base.sp == "ulysses"  # the embedding is replicated over the Ulysses group, split over AutoTP's
    return replace(plan, layers=with_experts(plan, base, expert_layers, [x.recompute for x in plan.layers]),
                   schedule="gpipe" if plan.schedule == "gpipe" else "1f1b", virtual_stages=1,
                   stage_layers=front_loaded_split(len(plan.layers), plan.pp),
                   embedding=EmbeddingStrategy(tp=1 if uly else base.tp, dp=base.dp * (base.tp if uly else 1),
                                               zero=base.zero))


def exported_run(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                 request: Request | None = None) -> PlanStrategy | None:
    """What DeepSpeed runs from the plan's export (``RunPlan``): the config has no setting chosen by cost."""
    return deepspeed_run_plan(plan, expert_layers)


def deepspeed_config(plan: PlanStrategy, batch: int, seq: int, first_notes: Sequence[str] = ()) -> str:
    s = dominant(plan)
    notes = [*first_notes, *layout_notes(plan, s, "DeepSpeed")]
    cfg: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": micro_batch_size(plan, batch),
        "gradient_accumulation_steps": plan.micro_batches,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": (zero := deepspeed_zero(plan)), "overlap_comm": True,
                              "contiguous_gradients": True},
        "pipeline": {"stages": plan.pp},
    }
    if zero != s.zero:
        notes.append(f"ZeRO-{s.zero} written as ZeRO-{zero}: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3")
    if plan.pp > 1:
        uniform = front_loaded_split(len(plan.layers), plan.pp)
        notes.append("DeepSpeed takes the layer split from the model code: PipelineModule(layers, "
                     f"num_stages={plan.pp}, partition_method='uniform') runs stages {list(uniform)}"
                     + ("" if uniform == plan.stage_layers else
                        f"; the plan's {list(plan.stage_layers)} is none of its partition methods"))
    if s.tp > 1 and s.sp == "ulysses":
        cfg["sequence_parallel_size"] = s.tp
    elif s.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": s.tp}
    if s.cp > 1:
        notes.append("DeepSpeed has no ring-attention context parallelism: cp written as Ulysses sequence parallel")
        cfg["sequence_parallel_size"] = cfg.get("sequence_parallel_size", 1) * s.cp
    if any(x.recompute != "none" for x in plan.layers):
        cfg["activation_checkpointing"] = {"partition_activations": s.tp > 1, "contiguous_memory_optimization": False,
                                           "number_checkpoints": sum(x.recompute != "none" for x in plan.layers)}
    if plan.schedule == "interleaved":
        notes.append("DeepSpeed pipelines have no interleaved schedule: 1F1B")
    ep, _ = expert_layout(plan)
    if ep > 1:
        notes.append(f"expert parallelism is set in the model code: deepspeed.moe.layer.MoE(..., ep_size={ep})")
    cfg["_paraplan_notes"] = notes
    return json.dumps(cfg, indent=2) + "\n"


def write(job: ExportInput) -> str:
    run = deepspeed_run_plan(job.plan, job.expert_layers)
    note = as_run_note(run, job, "DeepSpeed") if run else ""
    return deepspeed_config(job.plan, job.batch, job.seq, [note] if note else [])


EXPORTER = Exporter("deepspeed", "application/json", "json", exported_run, write)
