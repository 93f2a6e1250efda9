"""A torchtitan TOML job config. torchtitan takes one layer layout (TP always with sequence parallelism, FSDP
for any sharding), one model part per virtual stage and one activation-checkpoint setting; of the settings it
accepts, the export writes the one that runs fastest within the memory limit by the plan's cost model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import cast

from solvers.cost_model.pipeline import chunks
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request
from solvers.exports.layout import dominant, expert_layout, front_loaded_split, micro_batch_size, with_experts
from solvers.exports.notes import layout_notes
from solvers.exports.pricing import as_run_note, fastest_that_fits
from solvers.hybrid.baselines import megatron_embedding
from solvers.strategy import PlanStrategy, Recompute


def torchtitan_fsdp_zero(plan: PlanStrategy) -> int:
    """The ZeRO stage torchtitan's FSDP amounts to for this plan. Without pipelining it reshards after every
    forward and reduce-scatters every micro-batch's gradients (ZeRO-3). Pipelined, torchtitan keeps the gathered
    parameters (reshard_after_forward off) and PyTorch's pipeline stage holds gradient sync and resharding to
    the last micro-batch: one all-gather and one reduce-scatter a step, unsharded weights and gradients between
    (ZeRO-1's memory and traffic)."""
    if dominant(plan).zero == 0:
        return 0
    return 1 if plan.pp > 1 else 3


@dataclass(frozen=True)
class TorchtitanRecompute:
    """An activation-checkpoint setting torchtitan takes: mode none or full, or selective with the op-level
    policy (``selective_ac_option = "op"``: our selective recomputation) or full checkpointing of every N-th
    transformer block of a stage (``selective_ac_option = "N"``)."""

    mode: str = "none"
    every: int = 0  # with mode "selective": 0 for the op policy, else N

    def modes(self, stage_layers: Sequence[int]) -> list[Recompute]:
        if self.mode in ("none", "full"):
            return [cast(Recompute, self.mode)] * sum(stage_layers)
        if not self.every:
            return ["selective"] * sum(stage_layers)
        return ["full" if (j + 1) % self.every == 0 else "none" for n in stage_layers for j in range(n)]

    def toml(self) -> list[str]:
        option = [f'selective_ac_option = "{self.every or "op"}"'] if self.mode == "selective" else []
        return [f'mode = "{self.mode}"', *option]

    def describe(self) -> str:
        if self.mode != "selective":
            return f"{self.mode} activation checkpointing"
        return f"full checkpointing of one block in {self.every}" if self.every else "selective (op) checkpointing"


TORCHTITAN_RECOMPUTE = (TorchtitanRecompute("none"), TorchtitanRecompute("selective"),
                        *(TorchtitanRecompute("selective", n) for n in (4, 3, 2)), TorchtitanRecompute("full"))


def _dominant_recompute(plan: PlanStrategy) -> TorchtitanRecompute:
    return TorchtitanRecompute(dominant(plan).recompute)  # selective: the op policy


def torchtitan_recompute(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                         request: Request | None = None) -> TorchtitanRecompute:
    """The activation checkpointing the torchtitan export writes: with the request, the setting that runs
    fastest within the memory limit by the plan's cost model (else the leanest); without it, the dominant
    layer's mode."""
    if request is None:
        return _dominant_recompute(plan)
    return fastest_that_fits(request, [(rc, torchtitan_run_plan(plan, expert_layers, rc))
                                       for rc in TORCHTITAN_RECOMPUTE]) or _dominant_recompute(plan)


def torchtitan_run_plan(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                        recompute: TorchtitanRecompute | None = None) -> PlanStrategy:
    """What torchtitan runs from ``torchtitan_toml``: the dominant layout on every layer with FSDP wherever the
    plan shards anything (``torchtitan_fsdp_zero``), TP with sequence parallelism, one activation-checkpoint
    setting (``recompute``, by default the dominant layer's mode)."""
    s = dominant(plan)
    base = replace(s, sp="megatron" if s.tp > 1 else None, zero=torchtitan_fsdp_zero(plan))
    modes = (recompute or _dominant_recompute(plan)).modes(plan.stage_layers)
    return replace(plan, layers=with_experts(plan, base, expert_layers, modes),
                   embedding=megatron_embedding(base))


def exported_run(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                 request: Request | None = None) -> PlanStrategy:
    """What torchtitan runs from the plan's export (``RunPlan``)."""
    return torchtitan_run_plan(plan, expert_layers, torchtitan_recompute(plan, expert_layers, request))


def torchtitan_split_points(plan: PlanStrategy) -> list[int]:
    """The first layer of every model part after the first. Interleaved, torchtitan's looped schedules give
    rank r the parts r, r + pp, r + 2 pp, ...: each stage's layers become ``virtual_stages`` parts (as even as
    they divide) laid out in that order."""
    v = chunks(plan.schedule, plan.virtual_stages)
    per_rank = [front_loaded_split(n, v) for n in plan.stage_layers]
    sizes = [per_rank[k % plan.pp][k // plan.pp] for k in range(plan.pp * v)]
    points, start = [], 0
    for n in sizes[:-1]:
        start += n
        points.append(start)
    return points


def torchtitan_toml(plan: PlanStrategy, batch: int, seq: int, recompute: TorchtitanRecompute | None = None) -> str:
    s = dominant(plan)
    notes = layout_notes(plan, s, "torchtitan")
    rc = recompute or _dominant_recompute(plan)
    if rc.modes(plan.stage_layers) != [x.recompute for x in plan.layers]:
        notes.append(f"the plan's recomputation ({', '.join(sorted({x.recompute for x in plan.layers}))}) runs as "
                     f"{rc.describe()}")
    shard = s.dp if s.zero >= 1 else 1
    replicate = 1 if s.zero >= 1 else s.dp
    fsdp = torchtitan_fsdp_zero(plan)
    if s.zero and fsdp != s.zero:
        how = ("pipelined, FSDP keeps the gathered weights and gradients through the step and syncs at the last "
               "micro-batch" if plan.pp > 1 else "FSDP reshards after every forward")
        notes.append(f"ZeRO-{s.zero} runs as ZeRO-{fsdp} in torchtitan: {how}")
    if s.sp == "ulysses":
        notes.append("torchtitan has no Ulysses sequence parallelism: written as tensor parallelism")
    schedule = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}[plan.schedule]
    bounds = [f'"layers.{b}"' for b in torchtitan_split_points(plan)]
    lines = [*(f"# {n}" for n in notes), "[training]", f"global_batch_size = {batch}",
             f"local_batch_size = {batch // s.dp}", f"seq_len = {seq}", "mixed_precision_param = \"bfloat16\"", "",
             "[parallelism]", f"data_parallel_replicate_degree = {replicate}",
             f"data_parallel_shard_degree = {shard}", f"tensor_parallel_degree = {s.tp}",
             f"context_parallel_degree = {s.cp}", f"pipeline_parallel_degree = {plan.pp}",
             f"pipeline_parallel_schedule = \"{schedule}\"",
             f"pipeline_parallel_microbatch_size = {micro_batch_size(plan, batch)}"]
    if plan.pp > 1:
        lines.append(f"pipeline_parallel_split_points = [{', '.join(bounds)}]")
    ep, _ = expert_layout(plan)
    if ep > 1:
        lines.append(f"expert_parallel_degree = {ep}")
    lines += ["", "[activation_checkpoint]", *rc.toml()]
    return "\n".join(lines) + "\n"


def write(job: ExportInput) -> str:
    rc = torchtitan_recompute(job.plan, job.expert_layers, job.request)
    note = as_run_note(torchtitan_run_plan(job.plan, job.expert_layers, rc), job, "torchtitan")
    return (f"# {note}\n" if note else "") + torchtitan_toml(job.plan, job.batch, job.seq, rc)


EXPORTER = Exporter("torchtitan", "application/toml", "toml", exported_run, write)
