"""Megatron-LM (core_r0.19) launch scripts. Megatron-LM takes one layer layout, one pipeline split with equal
middle stages (whole model chunks when interleaved) and one recomputation granularity per run; of the splits and
recomputation settings it accepts, the export writes the pair that runs fastest within the memory limit by the
plan's cost model. The script also carries the model's architecture (Megatron's defaults are GPT's), the
request's precision and the environment Megatron asserts, and its header says what runs differently from the
plan, priced, or that the run is the plan (lossless)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from solvers.cost_model.pipeline import chunks, megatron_splits
from solvers.exports.exporter import Exporter
from solvers.exports.inputs import ExportInput, Request, UniformPlan
from solvers.exports.layout import dominant, expert_layout, micro_batch_size, run_expert_tp, stage, with_experts
from solvers.exports.notes import describe, layout_notes
from solvers.exports.pricing import RunEstimate, as_run, fastest_that_fits
from solvers.hybrid.baselines import megatron_embedding
from solvers.specs import ModelSpec, MoESpec
from solvers.strategy import LayerStrategy, PlanStrategy, Recompute


@dataclass(frozen=True)
class MegatronRecompute:
    """A recomputation setting Megatron-LM accepts. It takes one granularity: full recomputation of the first
    ``full_layers`` layers of every model chunk (block; all of them: uniform), or selective recomputation on
    every layer, or none. Both at once (``--recompute-activations`` beside ``--recompute-method``) is refused at
    start-up ("recompute method is not yet supported for selective recomputing granularity")."""

    full_layers: int = 0  # per model chunk: a stage of an interleaved plan holds ``chunks`` of them
    selective: bool = False

    def args(self, stage_layers: Sequence[int], chunks: int = 1) -> list[str]:
        if self.selective:
            return ["--recompute-activations"]
        if self.full_layers == 0:
            return []
        if self.full_layers * chunks >= max(stage_layers):
            return ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
        return ["--recompute-granularity full", "--recompute-method block",
                f"--recompute-num-layers {self.full_layers}"]

    def modes(self, stage_layers: Sequence[int], chunks: int = 1) -> list[Recompute]:
        if self.selective:
            return ["selective"] * sum(stage_layers)
        # block recomputation takes the first layers of each model chunk (a stage's chunks are equal: its layers
        # run chunk by chunk), not the first of the stage
        return ["full" if i % max(n // chunks, 1) < self.full_layers else "none"
                for n in stage_layers for i in range(n)]

    def describe(self) -> str:
        if self.selective:
            return "selective recomputation on every layer"
        return f"full recomputation of the first {self.full_layers} layers of every model chunk" \
            if self.full_layers else "no recomputation"


def _most_per_chunk(plan: PlanStrategy, modes: set[str]) -> int:
    """The most layers of those modes any stage holds, per model chunk (rounded up: never less recomputation)."""
    v = chunks(plan.schedule, plan.virtual_stages)
    return -(-max(sum(1 for x in stage(plan, st) if x.recompute in modes) for st in range(plan.pp)) // v)


def megatron_recompute_options(plan: PlanStrategy) -> list[MegatronRecompute]:
    """The settings worth running a plan's recomputation as: none, selective everywhere (where the plan uses
    any recomputation), block recomputation of as many layers as the plan recomputes fully in its fullest
    stage, and of as many as it recomputes at all (its selective layers made full)."""
    full, any_ = _most_per_chunk(plan, {"full"}), _most_per_chunk(plan, {"full", "selective"})
    options = [MegatronRecompute()]
    if any_:
        options.append(MegatronRecompute(selective=True))
    options += [MegatronRecompute(k) for k in sorted({full, any_}) if k]
    return options


def _memory_safe_recompute(plan: PlanStrategy) -> MegatronRecompute:
    """Without a cost model: recompute at least what the plan does (a selective-only plan stays selective,
    a plan with full layers recomputes fully every layer it recomputes at all)."""
    if _most_per_chunk(plan, {"full"}):
        return MegatronRecompute(_most_per_chunk(plan, {"full", "selective"}))
    return MegatronRecompute(selective=any(x.recompute == "selective" for x in plan.layers))


def nearest_megatron_splits(plan: PlanStrategy, limit: int = 8) -> list[tuple[int, ...]]:
    """The pipeline splits Megatron-LM runs (``pipeline.megatron_splits``) nearest to the plan's, nearest
    first (least squared difference per stage). Empty where none is whole model chunks."""
    want = plan.stage_layers
    splits = megatron_splits(len(plan.layers), plan.pp, chunks(plan.schedule, plan.virtual_stages), near=want)
    return sorted(splits, key=lambda p: sum((a - b) ** 2 for a, b in zip(p, want, strict=True)))[:limit]


@dataclass(frozen=True)
class MegatronLayout:
    """What the Megatron export writes beyond the dominant layer layout: the pipeline split (None: none
    Megatron accepts, the plan's is written and refused) and the recomputation setting."""

    split: tuple[int, ...] | None
    recompute: MegatronRecompute
    by_cost_model: bool = False  # chosen as the fastest that fits (else: the nearest split, memory-safe)


def _memory_safe_layout(plan: PlanStrategy) -> MegatronLayout:
    splits = nearest_megatron_splits(plan, limit=1)
    return MegatronLayout(splits[0] if splits else None, _memory_safe_recompute(plan))


def megatron_layout(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                    request: Request | None = None) -> MegatronLayout:
    """The split and recomputation the Megatron export writes: with the request, the pair that runs fastest
    within the memory limit by the plan's cost model (else the leanest); without it, the nearest split and the
    memory-safe recomputation."""
    if request is None:
        return _memory_safe_layout(plan)
    splits: list[tuple[int, ...] | None] = [*nearest_megatron_splits(plan)] or [None]
    options = megatron_recompute_options(plan)
    layouts = [MegatronLayout(split, option, by_cost_model=True) for split in splits for option in options]
    return fastest_that_fits(request, [(lay, megatron_run_plan(plan, expert_layers, lay)) for lay in layouts]) \
        or _memory_safe_layout(plan)


def _megatron_base(plan: PlanStrategy) -> LayerStrategy:
    """The layer layout Megatron-LM runs for every layer of ``plan`` (experts aside): the dominant one, Ulysses as
    TP with sequence parallelism (``--sequence-parallel``, the nearest to its sequence-split activations), plain
    TP as plain TP (the plan may have no SP because the sequence does not split over TP, or by request)."""
    s = dominant(plan)
    return replace(s, sp="megatron" if s.tp > 1 and s.sp is not None else None,
                   zero=min(s.zero, 1) if s.dp * s.cp > 1 else 0)


def megatron_run_plan(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                      layout: MegatronLayout | None = None) -> PlanStrategy:
    """What Megatron-LM runs from ``megatron_args``: the dominant layout on every layer (``_megatron_base``:
    Ulysses as TP with sequence parallelism, ZeRO-2/3 as the distributed optimizer), one pipeline split and one
    recomputation setting (``layout``, by default the nearest split and the memory-safe recomputation), the
    embedding on the layers' TP group."""
    base = _megatron_base(plan)
    layout = layout or _memory_safe_layout(plan)
    parts = layout.split or plan.stage_layers
    modes = layout.recompute.modes(parts, chunks(plan.schedule, plan.virtual_stages))
    return replace(plan, layers=with_experts(plan, base, expert_layers, modes), stage_layers=tuple(parts),
                   embedding=megatron_embedding(base))


def exported_run(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                 request: Request | None = None) -> PlanStrategy:
    """What Megatron-LM runs from the plan's export (``RunPlan``)."""
    return megatron_run_plan(plan, expert_layers, megatron_layout(plan, expert_layers, request))


# What the model spec does not carry, for the presets' families (matched on the name's start): the rotary base
# and the query/key/value biases of their Hugging Face configs. Llama 2 uses Megatron's default base (10000).
_ROPE_FAMILIES: tuple[tuple[str, int, bool], ...] = (  # (name prefix, rotary base, bias on q/k/v only)
    ("llama3", 500000, False), ("qwen2", 1000000, True), ("mixtral", 1000000, False), ("llama2", 10000, False),
)


@dataclass(frozen=True)
class Launch:
    """How the arguments are launched: the GPUs per node and nodes (None: left to the launcher's
    ``$DISTRIBUTED_ARGS``) and the training precision (``TrainingSpec.precision``)."""

    gpus_per_node: int | None = None
    nodes: int | None = None
    precision: str = "bf16"

    @classmethod
    def of(cls, job: ExportInput) -> Launch:
        """From the plan's request: its cluster as written (a cluster of groups names no GPUs per node) and its
        parsed precision."""
        if job.request is None:
            return cls()
        cluster = job.request.get("cluster") or {}
        gpn, nodes = cluster.get("gpus_per_node"), cluster.get("nodes")
        ok = isinstance(gpn, int) and isinstance(nodes, int)
        return cls(gpn if ok else None, nodes if ok else None, job.precision)

    def command(self) -> str:
        where = (f"--nproc_per_node {self.gpus_per_node} --nnodes {self.nodes}" if self.gpus_per_node
                 else "$DISTRIBUTED_ARGS")
        return f"torchrun {where} pretrain_gpt.py"


def _precision_args(precision: str, notes: list[str]) -> list[str]:
    """Megatron-LM's precision flags; FP8 runs its matrix multiplies through Transformer Engine (E4M3 forward,
    E5M2 backward: ``hybrid``) with BF16 everywhere else, as the cost model's fp8 does."""
    if precision == "fp16":
        return ["--fp16"]
    if precision == "fp32":
        return []
    if precision == "fp8":
        notes.append("fp8: Transformer Engine's hybrid format (E4M3 forward, E5M2 gradients), delayed scaling, "
                     "BF16 elsewhere")
        return ["--bf16", "--fp8-format hybrid", "--fp8-recipe delayed"]
    return ["--bf16"]


def _recompute_note(plan: PlanStrategy, run: PlanStrategy | None, rc: MegatronRecompute) -> str | None:
    """What runs of the plan's recomputation, where it is not what the plan does layer by layer."""
    if run is not None and [x.recompute for x in run.layers] == [x.recompute for x in plan.layers]:
        return None
    kinds = Counter(x.recompute for x in plan.layers)
    mix = ", ".join(f"{n} x {k}" for k, n in kinds.most_common())
    if {"full", "selective"} <= set(kinds):
        why = "Megatron-LM takes one recomputation granularity: the plan's mix of full and selective layers"
    else:
        why = ("Megatron-LM recomputes selectively every layer or none, fully the first N of every model chunk: "
               "the plan's recomputation")
    return f"{why} runs as {rc.describe()} (the plan: {mix})"


def megatron_args(plan: PlanStrategy, batch: int, seq: int, model: ModelSpec | None,
                  layout: MegatronLayout | None = None, launch: Launch | None = None,
                  run: PlanStrategy | None = None) -> str:
    """The launch script: notes on what differs from the plan, the environment, torchrun and the arguments.
    ``run``: what Megatron-LM runs from them (``megatron_run_plan``), to name only the differences."""
    s = dominant(plan)
    launch = launch or Launch()
    layout = layout or _memory_safe_layout(plan)
    rc = layout.recompute
    # the layers' strategy is compared without recomputation: that is one setting for the whole run, noted apart
    notes = layout_notes(plan, s, "Megatron-LM", recompute=False)
    note = _recompute_note(plan, run, rc)
    if note:
        notes.append(note)
    args = [
        f"--tensor-model-parallel-size {s.tp}", f"--pipeline-model-parallel-size {plan.pp}",
        f"--context-parallel-size {s.cp}", f"--micro-batch-size {micro_batch_size(plan, batch)}",
        f"--global-batch-size {batch}", f"--seq-length {seq}", *_precision_args(launch.precision, notes),
    ]
    mbs = micro_batch_size(plan, batch)
    if batch % (mbs * s.dp):  # Megatron derives the accumulation steps and asserts they are whole
        notes.append(f"global batch {batch} is no multiple of micro-batch {mbs} x data parallel {s.dp}: Megatron-LM "
                     "will refuse these arguments")
    if _megatron_base(plan).sp == "megatron":
        args.append("--sequence-parallel")
    if s.sp == "ulysses":
        notes.append("Megatron-LM has no Ulysses sequence parallelism: written as tensor parallelism with sequence "
                     "parallelism")
    if s.zero >= 1 and s.dp * s.cp > 1:
        args.append("--use-distributed-optimizer")
    if s.zero >= 2 and s.dp * s.cp > 1:
        notes.append(f"ZeRO-{s.zero} is not Megatron-LM's: it runs as the distributed optimizer (ZeRO-1: optimizer "
                     "states sharded, gradients and parameters whole)")
    v = chunks(plan.schedule, plan.virtual_stages)
    split = layout.split
    parts = split or plan.stage_layers
    if split is None:
        notes.append(f"Megatron-LM cannot split {len(plan.layers)} layers into {plan.pp} stages"
                     + (f" of {v} equal model chunks" if v > 1 else "") + ": it will refuse these arguments")
    elif split != plan.stage_layers:
        why = "the fastest within the memory limit by the plan's cost model" if layout.by_cost_model else "the nearest"
        notes.append(f"pipeline stages {list(plan.stage_layers)} run as {list(split)}: Megatron-LM sets the first and "
                     f"last stage sizes and splits the rest evenly{' in whole model chunks' if v > 1 else ''}; of the "
                     f"splits it accepts this is {why}")
    uneven = len(set(parts)) > 1
    if v > 1:
        # layers per virtual stage needs an even split; an uneven one names the chunks per rank instead. P2P
        # communication overlaps compute by default (core_r0.19), which interleaving on 2 stages needs
        args.append(f"--num-virtual-stages-per-pipeline-rank {v}" if uneven
                    else f"--num-layers-per-virtual-pipeline-stage {parts[0] // v}")
    args += rc.args(parts, v)
    if uneven:
        args += [f"--decoder-first-pipeline-num-layers {parts[0]}", f"--decoder-last-pipeline-num-layers {parts[-1]}"]
    if model is not None:
        args += _model_args(plan, model, seq, notes)
    if run is not None and run == plan:
        notes.insert(0, "lossless: Megatron-LM runs this plan as it is (every layer, stage and setting as planned)")
    head = "".join(f"# {n}\n" for n in notes)
    # Megatron-LM asserts one CUDA connection under TP or CP, so that communication kernels queue in issue order
    env = "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" if s.tp > 1 or s.cp > 1 else ""
    return head + env + launch.command() + " \\\n" + " \\\n".join(args) + "\n"


def _model_args(plan: PlanStrategy, model: ModelSpec, seq: int, notes: list[str]) -> list[str]:
    """The model's shape and architecture, so that Megatron-LM builds the model the plan priced (its defaults are
    GPT's: LayerNorm, learned positions, biases, GeLU, dropout 0.1); what Megatron-Core versions differ on is
    added to ``notes``."""
    # Megatron requires --max-position-embeddings and ties the output layer to the embedding by default
    args = [f"--num-layers {model.num_layers}", f"--hidden-size {model.hidden_size}",
            f"--num-attention-heads {model.num_attention_heads}", f"--max-position-embeddings {seq}",
            f"--ffn-hidden-size {model.ffn_size}",
            f"--attention-dropout {model.attention_dropout:g}", f"--hidden-dropout {model.hidden_dropout:g}"]
    if model.head_dim is not None and model.head_dim * model.num_attention_heads != model.hidden_size:
        args.append(f"--kv-channels {model.head_dim}")
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    kv, tp = model.kv_heads, dominant(plan).tp
    if kv != model.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {kv}"]
        if kv % tp:  # the plan replicates the KV heads over the TP group
            notes.append(f"{kv} query groups under tensor parallel {tp}: Megatron-Core releases before 0.16 "
                         "refuse it (num_query_groups must be a multiple of tensor_model_parallel_size)")
    if model.mlp == "swiglu":
        args += _llama_args(model, notes)
    if model.vocab_size:
        args += _vocab_args(model.vocab_size, tp, notes)
    if model.moe:
        args += _moe_args(plan, model, model.moe)
    return args


def _llama_args(model: ModelSpec, notes: list[str]) -> list[str]:
    """A SwiGLU model is of the Llama family (Llama, Mistral, Mixtral, Qwen2): RMSNorm, rotary positions, no
    linear biases. The spec names none of these; the presets' rotary base and q/k/v biases are looked up by
    name (``_ROPE_FAMILIES``)."""
    args = ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope", "--disable-bias-linear"]
    family = next((f for f in _ROPE_FAMILIES if model.name.lower().startswith(f[0])), None)
    if family is None:
        notes.append("SwiGLU model written as the Llama family's (RMSNorm, rotary positions, no linear biases) at "
                     "Megatron's rotary base 10000: set --rotary-base (and --add-qkv-bias) as the model's config says")
        return args
    _, base, qkv_bias = family
    args.append(f"--rotary-base {base}")
    if qkv_bias:
        args.append("--add-qkv-bias")
    return args


def _vocab_args(vocab: int, tp: int, notes: list[str]) -> list[str]:
    """The vocabulary, padded as little as Megatron-LM allows: it pads to a multiple of
    ``make-vocab-size-divisible-by`` x TP (128 by default, which would pad 32000 to 32256 under TP 4)."""
    div = next(d for d in (128, 64, 32, 16, 8, 4, 2, 1) if vocab % (d * tp) == 0 or d == 1)
    if vocab % (div * tp):
        padded = -(-vocab // tp) * tp
        notes.append(f"vocabulary {vocab} padded to {padded}: Megatron-LM splits it evenly over tensor parallel {tp}")
    return ["--tokenizer-type NullTokenizer", f"--vocab-size {vocab}", f"--make-vocab-size-divisible-by {div}"]


def _moe_args(plan: PlanStrategy, model: ModelSpec, moe: MoESpec) -> list[str]:
    """Experts, routing and expert parallelism. Megatron's integer --moe-layer-freq N puts MoE on layers 0,
    N, 2N, ...; the spec's every-N-th layer is N - 1, 2N - 1, ..., so anything but all-MoE is a pattern."""
    ep, _ = expert_layout(plan)
    etp = run_expert_tp(plan, _megatron_base(plan))  # as megatron_run_plan runs them
    pattern = [int(model.is_moe_layer(i)) for i in range(model.num_layers)]
    args = [f"--num-experts {moe.num_experts}", f"--moe-router-topk {moe.top_k}",
            f"--moe-ffn-hidden-size {model.expert_ffn_size}", f"--expert-model-parallel-size {ep}"]
    if etp is not None:
        args.append(f"--expert-tensor-parallel-size {etp}")
    if not all(pattern):
        args.append(f"--moe-layer-freq '[{','.join(map(str, pattern))}]'")
    return args


def _uniform_hint(uniform: UniformPlan | None, est: RunEstimate) -> str:
    """Where the result's best uniform Megatron-style plan fits and this run does not, or runs slower: that
    plan, which Megatron-LM runs unchanged."""
    if uniform is None or (est.fits and uniform.step_time_s >= est.step_time_s):
        return ""
    alt = uniform.plan
    ep, etp = expert_layout(alt)
    experts = (f" ep{ep}" + (f" etp{etp}" if etp is not None else "")) if ep > 1 or etp is not None else ""
    return (f"; the best uniform Megatron-style plan fits and runs at {uniform.step_time_s:.4g} s: "
            f"{describe(dominant(alt))}{experts}, pp {alt.pp}, {alt.micro_batches} micro-batches "
            "(its arguments: export of=megatron)")


def write(job: ExportInput) -> str:
    experts = job.expert_layers
    layout = megatron_layout(job.plan, experts, job.request)
    run = megatron_run_plan(job.plan, experts, layout)
    notes, est = as_run(run, job, "Megatron-LM")
    if est is not None:
        notes[0] += _uniform_hint(job.uniform, est)
    return "".join(f"# {n}\n" for n in notes) + megatron_args(job.plan, job.batch, job.seq, job.model, layout,
                                                            Launch.of(job), run)


EXPORTER = Exporter("megatron", "text/plain", "txt", exported_run, write)
