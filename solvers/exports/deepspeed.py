"""A DeepSpeed config. DeepSpeed takes one layer layout, its pipeline engine refuses ZeRO-2 and -3, and the
layer split and expert parallelism live in the model code, so the config says in ``_paraplan_notes`` what to
put there and what the launch must pass.

DeepSpeed 0.19.8 checks ``train_batch_size == micro batch x accumulation x data-parallel size`` in
``DeepSpeedConfig``, with the data-parallel size taken from what ``deepspeed.initialize`` hands it:

- a pipelined model (``PipelineModule``): its grid, ``PipeModelDataParallelTopology(num_pp, num_mp=AutoTP,
  num_dp)``, so the data-parallel size is the plan's;
- both ``data_parallel_size`` and ``sequence_parallel_size`` in the config: DeepSpeed's own (data, sequence)
  mesh, the plan's data-parallel size beside a Ulysses group;
- otherwise nothing: all GPUs over ``sequence_parallel_size``. AutoTP's ranks then count as data-parallel
  replicas although they read the same batch, so an unpipelined AutoTP plan has no config whose batch
  arithmetic is the plan's; its TP group is written as Ulysses of the same degree on the mesh, priced.

So the export writes one of three shapes (``DeepSpeedShape``): a pipeline (AutoTP, no sequence parallelism:
the grid has no sequence axis, so the plan's sequence split is folded into AutoTP), the Ulysses mesh, or plain
data parallelism. Where DeepSpeed's run of that does not fit in memory by the plan's cost model, the export
takes the fastest setting of ZeRO stage and whole-layer checkpointing that fits (``deepspeed_setting``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from solvers.errors import SpecError
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request
from solvers.exports.layout import dominant, expert_layout, front_loaded_split, with_experts
from solvers.exports.notes import describe, layout_notes
from solvers.exports.pricing import as_run_notes, estimate_run, fastest_that_fits
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Recompute

Shape = Literal["pipeline", "mesh", "data"]


@dataclass(frozen=True)
class DeepSpeedShape:
    """What the config and the launch give DeepSpeed: the form, and the degrees DeepSpeed's arithmetic uses."""

    shape: Shape
    autotp: int  # tensor_parallel.autotp_size (pipelines only)
    ulysses: int  # sequence_parallel_size (the mesh only)
    dp: int
    zero: int


def sequence_degree(s: LayerStrategy) -> int:
    """How many ranks split a layer's sequence: ring CP and a Ulysses group alike."""
    return s.cp * (s.tp if s.sp == "ulysses" else 1)


def deepspeed_zero(plan: PlanStrategy) -> int:
    """The ZeRO stage DeepSpeed runs: the plan's, except that its pipeline engine refuses ZeRO-2 and -3
    ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"), so a pipelined plan gets ZeRO-1."""
    zero = dominant(plan).zero
    return min(zero, 1) if plan.pp > 1 else zero


def deepspeed_shape(plan: PlanStrategy) -> DeepSpeedShape:
    """The form whose batch arithmetic in DeepSpeed is the plan's (module docstring): DeepSpeed has one axis for
    the ranks that share a layer (TP, CP, Ulysses), AutoTP in a pipeline's grid, Ulysses on its mesh."""
    s = dominant(plan)
    tp = s.tp if s.sp != "ulysses" else 1
    split = tp * sequence_degree(s)  # the ranks that share a layer's work: DeepSpeed has one axis for them
    zero = deepspeed_zero(plan)
    if plan.pp > 1:
        return DeepSpeedShape("pipeline", split, 1, s.dp, zero)
    if split > 1:
        return DeepSpeedShape("mesh", 1, split, s.dp, zero)
    return DeepSpeedShape("data", 1, 1, s.dp, zero)


@dataclass(frozen=True)
class Setting:
    """What the export may choose beyond the plan's layout: the ZeRO stage (None: the plan's, as DeepSpeed
    takes it) and checkpointing every layer."""

    zero: int | None = None
    checkpoint_all: bool = False


AS_PLANNED = Setting()


def deepspeed_run_plan(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                       setting: Setting = AS_PLANNED) -> PlanStrategy:
    """What DeepSpeed runs from ``deepspeed_config``: the dominant layout on every layer in the shape
    ``deepspeed_shape`` chose (AutoTP in a pipeline, else Ulysses), its ZeRO stage, each layer's recomputation
    as whole-layer checkpointing (DeepSpeed has no selective kind), 1F1B (or GPipe) over DeepSpeed's uniform
    partition."""
    s, ds = dominant(plan), deepspeed_shape(plan)
    zero = ds.zero if setting.zero is None else setting.zero
    if ds.shape == "pipeline":
        base = replace(s, tp=ds.autotp, cp=1, sp=None, zero=zero)
    else:
        base = replace(s, tp=ds.ulysses, cp=1, sp="ulysses" if ds.ulysses > 1 else None, zero=zero)
    uly = base.sp == "ulysses"  # the embedding is replicated over the Ulysses group, split over AutoTP's
    recompute: list[Recompute] = [
        "full" if setting.checkpoint_all or x.recompute != "none" else "none" for x in plan.layers]
    return replace(plan, layers=with_experts(plan, base, expert_layers, recompute),
                   schedule="gpipe" if plan.schedule == "gpipe" else "1f1b", virtual_stages=1,
                   stage_layers=front_loaded_split(len(plan.layers), plan.pp),
                   embedding=EmbeddingStrategy(tp=1 if uly else base.tp, dp=base.dp * (base.tp if uly else 1),
                                               zero=base.zero))


def deepspeed_setting(plan: PlanStrategy, expert_layers: Sequence[bool] | None, request: Request | None) -> Setting:
    """The plan's settings where DeepSpeed's run of them fits in memory by the request's cost model; else the
    fastest that fits of ZeRO-3 (off a pipeline: DeepSpeed shards over the Ulysses group too) and checkpointing
    every layer, which DeepSpeed's own layout changes (ZeRO-1 in a pipeline, AutoTP without sequence
    parallelism, Ulysses' whole weights) may need."""
    if request is None:
        return AS_PLANNED
    try:
        if estimate_run(deepspeed_run_plan(plan, expert_layers), request).fits:
            return AS_PLANNED
    except SpecError:
        pass
    ds = deepspeed_shape(plan)
    zeros = sorted({ds.zero, 1 if ds.shape == "pipeline" else 3})
    options = [Setting(z, c) for z in zeros for c in (False, True)]
    chosen = fastest_that_fits(request, [(o, deepspeed_run_plan(plan, expert_layers, o)) for o in options])
    return chosen or AS_PLANNED


def exported_run(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                 request: Request | None = None) -> PlanStrategy | None:
    """What DeepSpeed runs from the plan's export (``RunPlan``), with the setting the export chooses by cost."""
    return deepspeed_run_plan(plan, expert_layers, deepspeed_setting(plan, expert_layers, request))


def _precision(precision: str) -> tuple[dict[str, Any], list[str]]:
    """The config's mixed-precision sections and what they cannot say."""
    if precision == "fp16":
        return {"fp16": {"enabled": True}}, []
    if precision == "fp32":
        return {}, []
    notes = [] if precision == "bf16" else [
        "fp8 is not expressible in a DeepSpeed config (FP8 matmuls come from the model code, e.g. Transformer "
        "Engine's fp8_autocast): written as bf16, and the as-run estimate is of bf16"]
    return {"bf16": {"enabled": True}}, notes


def _shape_notes(plan: PlanStrategy, ds: DeepSpeedShape) -> list[str]:
    """What the launch must pass so that DeepSpeed's batch arithmetic is the plan's, and the layout changes."""
    s = dominant(plan)
    seq = sequence_degree(s)
    if ds.shape == "pipeline":
        notes = [f"launch: deepspeed.initialize(model=PipelineModule(layers, num_stages={plan.pp}, "
                 f"topology=PipeModelDataParallelTopology(num_pp={plan.pp}, num_mp={ds.autotp}, num_dp={ds.dp}), "
                 f"partition_method='uniform'), config=this): DeepSpeed takes the data-parallel size {ds.dp} from "
                 "that grid (pipeline.stages is read by no DeepSpeed code; it records the model's stage count)"]
        if seq > 1:
            notes.append(f"DeepSpeed's pipeline grid has no sequence axis: the plan's {describe(s)} runs as AutoTP "
                         f"{ds.autotp} (tensor_parallel.autotp_size)")
        return notes
    if ds.shape == "mesh":
        notes = [f"launch: deepspeed.initialize(model, config=this) builds DeepSpeed's (data_parallel={ds.dp}, "
                 f"sequence_parallel={ds.ulysses}) mesh from data_parallel_size and sequence_parallel_size; the "
                 "model's attention runs in deepspeed.sequence.layer.DistributedAttention over its sequence group"]
        tp = s.tp if s.sp != "ulysses" else 1
        if tp > 1:
            notes.append(f"without an mpu DeepSpeed 0.19.8 counts AutoTP ranks as data-parallel replicas in its "
                         f"batch check, so unpipelined TP {tp} has no config that runs as planned: the plan's "
                         f"{describe(s)} runs as Ulysses sequence parallel {ds.ulysses}")
        elif s.cp > 1:
            notes.append(f"DeepSpeed has no ring-attention context parallelism: cp {s.cp} runs as Ulysses sequence "
                         f"parallel {ds.ulysses}")
        return notes
    return ["launch: deepspeed.initialize(model, config=this), no mpu: every GPU is a data-parallel replica"]


def deepspeed_config(plan: PlanStrategy, batch: int, seq: int, first_notes: Sequence[str] = (),
                     precision: str = "bf16", setting: Setting = AS_PLANNED) -> str:
    """The config that runs ``deepspeed_run_plan(plan, ..., setting)``, with what it changes in its notes."""
    s, ds = dominant(plan), deepspeed_shape(plan)
    run = deepspeed_run_plan(plan, None, setting)
    zero = dominant(run).zero
    mixed, precision_notes = _precision(precision)
    notes = [*first_notes, *_shape_notes(plan, ds), *layout_notes(plan, s, "DeepSpeed"), *precision_notes]
    cfg: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": max(batch // plan.micro_batches // ds.dp, 1),
        "gradient_accumulation_steps": plan.micro_batches,
        **mixed,
        "zero_optimization": {"stage": zero, "overlap_comm": True, "contiguous_gradients": True},
    }
    if ds.shape == "pipeline":
        cfg["pipeline"] = {"stages": plan.pp}
        if ds.autotp > 1:
            cfg["tensor_parallel"] = {"autotp_size": ds.autotp}
    elif ds.shape == "mesh":
        cfg["data_parallel_size"] = ds.dp
        cfg["sequence_parallel_size"] = ds.ulysses
    if ds.zero != s.zero:
        notes.append(f"ZeRO-{s.zero} written as ZeRO-{ds.zero}: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3")
    if zero != ds.zero:
        notes.append(f"ZeRO-{zero} instead of ZeRO-{ds.zero}: DeepSpeed's run of the latter would not fit in memory "
                     "by the plan's cost model")
    if plan.pp > 1:
        uniform = front_loaded_split(len(plan.layers), plan.pp)
        other = "" if uniform == plan.stage_layers else \
            f"; the plan's {list(plan.stage_layers)} is none of its partition methods"
        notes.append("DeepSpeed takes the layer split from the model code: PipelineModule(layers, "
                     f"num_stages={plan.pp}, partition_method='uniform') runs stages {list(uniform)}{other}")
    checkpointed = sum(x.recompute != "none" for x in run.layers)
    if checkpointed:
        # deepspeed.checkpointing.checkpoint wraps whole layers (a PipelineModule's activation_checkpoint_interval)
        cfg["activation_checkpointing"] = {"partition_activations": ds.autotp > 1,
                                           "contiguous_memory_optimization": False,
                                           "number_checkpoints": checkpointed}
        notes.append(f"activation checkpointing of {checkpointed} of {len(plan.layers)} layers: the model code wraps "
                     "them in deepspeed.checkpointing.checkpoint"
                     + (" (PipelineModule(..., activation_checkpoint_interval=1) checkpoints every layer)"
                        if plan.pp > 1 and checkpointed == len(plan.layers) else ""))
        if setting.checkpoint_all and any(x.recompute == "none" for x in plan.layers):
            notes.append("every layer checkpointed although the plan recomputes fewer: DeepSpeed's run as planned "
                         "would not fit in memory by the plan's cost model")
        if any(x.recompute == "selective" for x in plan.layers):
            notes.append("DeepSpeed checkpoints whole layers: selective recomputation runs as full")
    if plan.schedule == "interleaved":
        notes.append("DeepSpeed pipelines have no interleaved schedule: 1F1B")
    ep, _ = expert_layout(plan)
    if ep > 1:
        notes.append(f"expert parallelism is set in the model code: deepspeed.moe.layer.MoE(..., ep_size={ep})")
    cfg["_paraplan_notes"] = notes
    return json.dumps(cfg, indent=2) + "\n"


def write(job: ExportInput) -> str:
    precision = job.precision
    # fp8 is not in the config: the run is priced as the bf16 it is
    priced = job if precision != "fp8" or job.request is None else replace(
        job, request={**job.request, "training": {**job.request.get("training", {}), "precision": "bf16"}})
    setting = deepspeed_setting(job.plan, job.expert_layers, priced.request)
    run = deepspeed_run_plan(job.plan, job.expert_layers, setting)
    notes = as_run_notes(run, priced, "DeepSpeed")
    exact = ["lossless: DeepSpeed runs this plan as planned"] if run == job.plan and precision != "fp8" else []
    return deepspeed_config(job.plan, job.batch, job.seq, [*notes, *exact], precision, setting)


EXPORTER = Exporter("deepspeed", "application/json", "json", exported_run, write)
