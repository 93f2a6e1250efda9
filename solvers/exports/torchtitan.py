"""A torchtitan 0.3.0 launch command: ``torchrun ... -m torchtitan.train --module M --config C`` with command-line
overrides (0.3.0 reads no TOML job file). torchtitan takes one layer layout (TP always with sequence parallelism, FSDP
for any sharding), one model part per virtual stage and one activation-checkpoint setting; of the settings it
accepts, the export writes the one that runs fastest within the memory limit by the plan's cost model. torch.compile
is on where the request's stack prices fused elementwise ops (the default), off where it prices them eager
(``training.stack.elementwise``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from solvers.cost_model.pipeline import chunks, virtual_stage_layers
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request
from solvers.exports.layout import dominant, expert_layout, micro_batch_size, with_experts
from solvers.exports.notes import layout_notes
from solvers.exports.pricing import as_run_notes, fastest_that_fits
from solvers.hybrid.baselines import megatron_embedding
from solvers.specs import ModelSpec
from solvers.strategy import PlanStrategy, Recompute


def torchtitan_fsdp_zero(plan: PlanStrategy) -> int:
    """The ZeRO stage torchtitan's FSDP amounts to for this plan. Without pipelining it reshards after every
    forward and reduce-scatters every micro-batch's gradients (ZeRO-3). Pipelined, torchtitan keeps the gathered
    parameters (reshard_after_forward off) and PyTorch's pipeline stage holds gradient sync and resharding to
    the last micro-batch: one all-gather and one reduce-scatter a step, unsharded weights and gradients between
    (ZeRO-1's memory and traffic). torchtitan's FSDP mesh is data-parallel shard x context-parallel ranks: with
    context parallelism it shards even a plan without ZeRO (over the CP ranks; ZeRO here spans dp x cp)."""
    s = dominant(plan)
    if s.zero == 0 and s.cp == 1:
        return 0
    return 1 if plan.pp > 1 else 3


@dataclass(frozen=True)
class TorchtitanRecompute:
    """An activation-checkpoint setting torchtitan 0.3.0 takes (the ``activation-checkpoint:MODE`` subcommand):
    none, selective (its per-op policy, which the cost model prices as such on a torchtitan stack) or full, one for
    every block. 0.3.0 dropped the ``selective_ac_option`` that checkpointed every N-th block."""

    mode: Recompute = "none"

    def modes(self, stage_layers: Sequence[int]) -> list[Recompute]:
        return [self.mode] * sum(stage_layers)

    def argument(self) -> str:
        return f"activation-checkpoint:{self.mode}"

    def describe(self) -> str:
        return f"{self.mode} activation checkpointing"


TORCHTITAN_RECOMPUTE = (TorchtitanRecompute("none"), TorchtitanRecompute("selective"), TorchtitanRecompute("full"))


def _dominant_recompute(plan: PlanStrategy) -> TorchtitanRecompute:
    return TorchtitanRecompute(dominant(plan).recompute)


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
    """What torchtitan runs from the exported command: the dominant layout on every layer with FSDP wherever the
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


# torchtitan 0.3.0's Llama 3 flavours (torchtitan/models/llama3/__init__.py) by the shape paraplan's model spec gives:
# (layers, hidden, heads, kv heads, FFN, vocab) -> the config function of llama3's config_registry
TORCHTITAN_CONFIGS: dict[tuple[int, int, int, int, int, int], tuple[str, str]] = {
    (32, 4096, 32, 8, 14336, 128256): ("llama3", "llama3_8b"),
    (80, 8192, 64, 8, 28672, 128256): ("llama3", "llama3_70b"),
    (126, 16384, 128, 8, 53248, 128256): ("llama3", "llama3_405b"),
}
# what a config function sets that the command line cannot undo (its model converters) and the plan did not price
CONFIG_CAVEATS = {
    "llama3_405b": "torchtitan's llama3_405b trains its linear layers in float8 (a converter of its model spec, "
                   "torchao required: pip install torchao) with torch.compile and async TP; paraplan priced bf16, "
                   "so the step may be faster than estimated; for bf16 add a config function without the "
                   "Float8LinearConverter",
}
TORCHTITAN_VERSION = "0.3.0"


@dataclass(frozen=True)
class TorchtitanModel:
    module: str
    config: str
    missing: str | None  # what the user must add where torchtitan has no config for the model; None if it has


def torchtitan_model(model: ModelSpec | None) -> TorchtitanModel:
    """torchtitan's ``--module``/``--config`` for the model: one of its Llama 3 configs where the shape is one of
    them, else the config function the user must add (named after the model), in the llama3 module for a dense
    SwiGLU model (the Llama architecture it implements), else in a module of their own."""
    if model is None:
        return TorchtitanModel("MODULE", "CONFIG", "without the request's model the export names no torchtitan "
                               "config: replace MODULE and CONFIG with a model module and its config function")
    key = (model.num_layers, model.hidden_size, model.num_attention_heads, model.kv_heads, model.ffn_size,
           model.vocab_size)
    if key in TORCHTITAN_CONFIGS:
        return TorchtitanModel(*TORCHTITAN_CONFIGS[key], None)
    config = "".join(c if c.isalnum() else "_" for c in model.name.lower())
    llama = model.mlp == "swiglu" and model.moe is None
    module = "llama3" if llama else "MODULE"
    where = ("torchtitan/models/llama3/config_registry.py (with a Llama3Model.Config flavour of that shape)"
             if llama else "the config_registry of a model module of your own (llama3 has no "
             + ("experts" if model.moe is not None else f"{model.mlp} MLP") + "), passed as --module")
    shape = (f"{model.num_layers} layers, hidden {model.hidden_size}, {model.num_attention_heads} heads, "
             f"{model.kv_heads} KV heads, FFN {model.ffn_size}, vocab {model.vocab_size}")
    return TorchtitanModel(module, config, f"torchtitan {TORCHTITAN_VERSION} has no config for {model.name} "
                           f"({shape}): add a config function {config}() to {where}")


def torchtitan_model_parts(plan: PlanStrategy) -> list[list[str]]:
    """The modules of every model part (``module_fqns_per_model_part``): the plan's stages as they are, each
    split into ``virtual_stages`` parts (as even as they divide) when interleaved; torchtitan's looped schedules
    give rank r the parts r, r + pp, r + 2 pp, ... The embedding goes with the first part, the final norm and
    the LM head with the last."""
    parts, start = [], 0
    for n in virtual_stage_layers(plan.stage_layers, chunks(plan.schedule, plan.virtual_stages)):
        parts.append([f"layers.{i}" for i in range(start, start + n)])
        start += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


@dataclass(frozen=True)
class TorchtitanBatch:
    """torchtitan 0.3.0's batch settings for the plan's micro-batches. The trainer accumulates global /
    (local x dp) steps and, pipelined, splits each local batch into local / microbatch-size pipeline
    micro-batches: without a pipeline the local batch is the plan's micro-batch and torchtitan accumulates the
    plan's micro-batches; with one, every micro-batch goes through the pipeline in one step."""

    local: int
    micro: int
    accumulation: int

    @staticmethod
    def of(plan: PlanStrategy, batch: int) -> TorchtitanBatch:
        m = micro_batch_size(plan, batch)
        if plan.pp > 1:
            return TorchtitanBatch(m * plan.micro_batches, m, 1)
        return TorchtitanBatch(m, m, plan.micro_batches)


def _batch_notes(plan: PlanStrategy, batch: int, b: TorchtitanBatch) -> list[str]:
    dp = dominant(plan).dp
    notes = []
    if b.local * dp * b.accumulation != batch:
        notes.append(f"the global batch {batch} is not {b.micro} samples x {plan.micro_batches} micro-batches x "
                     f"dp {dp}: torchtitan refuses a global batch that is no multiple of local batch x dp")
    if plan.schedule == "interleaved" and plan.pp > 1:
        rounds = max(1, plan.micro_batches // plan.pp)
        if plan.micro_batches % rounds:
            notes.append(f"PyTorch's Interleaved1F1B needs the micro-batches ({plan.micro_batches}) to be a "
                         f"multiple of their rounds ({rounds} = micro-batches // pp): it refuses this schedule")
    return notes


def torchtitan_command(plan: PlanStrategy, batch: int, seq: int, model: TorchtitanModel,
                       recompute: TorchtitanRecompute | None = None, compiled: bool = True) -> str:
    """The command; ``compiled``: torch.compile on, as a stack with fused elementwise ops is priced (torchtitan's
    own default is off for most configs), else explicitly off (eager, as ``training.stack.elementwise = "eager"``
    is priced)."""
    s = dominant(plan)
    notes = [f"torchtitan {TORCHTITAN_VERSION}: a config function (--module/--config) with command-line "
             f"overrides; run on NNODES x NPROC_PER_NODE = {plan.pp * s.world} GPUs"]
    if model.missing:
        notes.append(model.missing)
    if model.config in CONFIG_CAVEATS:
        notes.append(CONFIG_CAVEATS[model.config])
    # torchtitan takes any stage split by module names: uneven stages run as planned, no approximation
    notes += [n for n in layout_notes(plan, s, "torchtitan") if not n.startswith("uneven pipeline stages")]
    rc = recompute or _dominant_recompute(plan)
    if rc.modes(plan.stage_layers) != [x.recompute for x in plan.layers]:
        notes.append(f"the plan's recomputation ({', '.join(sorted({x.recompute for x in plan.layers}))}) runs as "
                     f"{rc.describe()}")
    shard = s.dp if s.zero >= 1 else 1
    replicate = 1 if s.zero >= 1 else s.dp
    fsdp = torchtitan_fsdp_zero(plan)
    if not s.zero and fsdp:
        notes.append(f"torchtitan shards the weights over the {s.cp} context-parallel ranks (its FSDP mesh is "
                     f"dp_shard x cp) where the plan keeps them whole: run as ZeRO-{fsdp}")
    elif s.zero and fsdp != s.zero:
        how = ("pipelined, FSDP keeps the gathered weights and gradients through the step and syncs at the last "
               "micro-batch" if plan.pp > 1 else "FSDP reshards after every forward")
        notes.append(f"ZeRO-{s.zero} runs as ZeRO-{fsdp} in torchtitan: {how}")
    if s.sp == "ulysses":
        notes.append("torchtitan has no Ulysses sequence parallelism: written as tensor parallelism")
    b = TorchtitanBatch.of(plan, batch)
    notes += _batch_notes(plan, batch, b)
    args = [f"--module {model.module} --config {model.config}",
            f"--parallelism.data_parallel_replicate_degree {replicate} "
            f"--parallelism.data_parallel_shard_degree {shard}",
            f"--parallelism.tensor_parallel_degree {s.tp} --parallelism.context_parallel_degree {s.cp}",
            f"--parallelism.pipeline_parallel_degree {plan.pp}"]
    ep, _ = expert_layout(plan)
    if ep > 1:
        args.append(f"--parallelism.expert_parallel_degree {ep}")
    if plan.pp > 1:
        schedule = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}[plan.schedule]
        parts = " ".join(",".join(p) for p in torchtitan_model_parts(plan))
        args += [f"--parallelism.pipeline_parallel_schedule {schedule} "
                 f"--parallelism.pipeline_parallel_microbatch_size {b.micro}",
                 f"--parallelism.module_fqns_per_model_part {parts}"]
    args.append(f"--training.local_batch_size {b.local} --training.global_batch_size {batch} "
                f"--training.seq_len {seq}")
    if plan.pp > 1 or ep > 1:  # CUDA graphs refuse pipelining (and EP's CPU-synchronising dispatch)
        args.append("--training.disable_cuda_graphs")
    args.append("--compile.enable" if compiled else "--compile.no-enable")
    args.append(rc.argument())
    launch = 'torchrun --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" -m torchtitan.train'
    return "\n".join([*(f"# {n}" for n in notes), *(f"{x} \\" for x in [launch, *(f"  {a}" for a in args[:-1])]),
                      f"  {args[-1]}"]) + "\n"


def _stack_note(job: ExportInput) -> str | None:
    """Say so where the run is priced on another framework's stack: the request's stack prices the export, and
    only on a torchtitan stack is "selective" torchtitan's per-op policy and the TP overlap none by default."""
    framework = job.stack.framework
    if job.request is None or framework == "torchtitan":
        return None
    return (f"priced on the request's stack ({framework}), as the plan was: to price it as torchtitan runs it (its "
            "per-op selective checkpointing, plain TP unless async TP), plan with training.stack.framework = "
            "\"torchtitan\"")


def write(job: ExportInput) -> str:
    rc = torchtitan_recompute(job.plan, job.expert_layers, job.request)
    notes = as_run_notes(torchtitan_run_plan(job.plan, job.expert_layers, rc), job, "torchtitan")
    stack = _stack_note(job)
    if notes and stack:
        notes.insert(1, stack)
    compiled = job.stack.elementwise_kernels == "fused"
    return "".join(f"# {n}\n" for n in notes) + torchtitan_command(job.plan, job.batch, job.seq,
                                                                torchtitan_model(job.model), rc, compiled)


EXPORTER = Exporter("torchtitan", "text/x-shellscript", "sh", exported_run, write)
