"""Export a hybrid plan to the launch formats people run: Megatron-LM arguments, a DeepSpeed config, a
torchtitan TOML and Galvatron's ``galvatron_config_*.json``.

Only Galvatron can express a per-layer strategy. For the others the plan's *dominant* layer strategy (the
one most layers use; ties go to the more memory-frugal one) is written, and every approximation is listed
in the output (comments, or a ``_paraplan_notes`` key in JSON): layers that differ, uneven stage sizes,
ZeRO levels or sequence-parallel kinds the framework lacks. Recomputation that only some layers use maps to
each framework's per-layer-count knob where it has one (Megatron's block recompute); Megatron-LM takes one
granularity per run, so a plan mixing full and selective layers is written as the setting it accepts that runs
fastest within the memory limit by the plan's cost model.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, cast

from solvers.cost_model.pipeline import chunks, megatron_splits
from solvers.cost_model.validate import check_structure
from solvers.errors import SpecError
from solvers.hybrid.baselines import megatron_embedding, without_experts
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Recompute

Format = Literal["megatron", "deepspeed", "torchtitan", "galvatron"]
FORMATS: tuple[str, ...] = ("megatron", "deepspeed", "torchtitan", "galvatron")
EXPORT_OF: tuple[str, ...] = ("plan", "megatron", "zero3_dp", "pure_dp")  # the plan, or one of its baselines
_ZERO_COST = {3: 0, 2: 1, 1: 2, 0: 3}
_RC_COST = {"full": 0, "selective": 1, "none": 2}
T = TypeVar("T")


def dominant(plan: PlanStrategy) -> LayerStrategy:
    """The layout most layers use (expert fields aside); ties go to the more memory-frugal one."""
    counts = Counter(map(without_experts, plan.layers))
    return max(counts, key=lambda s: (counts[s], -_ZERO_COST[s.zero], -_RC_COST[s.recompute]))


def expert_layout(plan: PlanStrategy) -> tuple[int, int | None]:
    """(ep, etp) most of the plan's expert-parallel layers use; (1, None) when none does."""
    counts = Counter((x.ep, x.etp) for x in plan.layers if x.ep > 1 or x.etp is not None)
    return max(counts, key=lambda k: counts[k]) if counts else (1, None)


def run_expert_tp(plan: PlanStrategy, base: LayerStrategy) -> int | None:
    """The expert TP to give the MoE layers of a run that puts ``base`` on every layer: the one the plan's
    expert-parallel layers use (``LayerStrategy.expert_tp``, most of them), None where ``base`` implies it anyway
    or the plan shards no experts. An implied one would follow the run's layout instead: the plan's Ulysses
    layers keep the MLP whole (expert TP 1), a framework writing them as TP would split the experts over it,
    and ep * that need not divide the ranks (Megatron-LM refuses such arguments)."""
    counts = Counter((x.ep, x.expert_tp) for x in plan.layers if x.ep > 1 or x.etp is not None)
    if not counts:
        return None
    etp = max(counts, key=lambda k: counts[k])[1]
    return None if etp == replace(base, etp=None).expert_tp else etp


def _with_experts(plan: PlanStrategy, base: LayerStrategy, expert_layers: Sequence[bool] | None,
                  recompute: Sequence[Recompute] | None = None) -> tuple[LayerStrategy, ...]:
    """``base`` on every layer, with the plan's dominant expert layout on the MoE layers (``expert_layers``,
    else those of the plan that shard experts) and, if given, each layer's recomputation."""
    ep, _ = expert_layout(plan)
    etp = run_expert_tp(plan, base)
    moe = expert_layers or [x.ep > 1 or x.etp is not None for x in plan.layers]
    return tuple(replace(base, ep=ep if m else 1, etp=etp if m else None,
                         recompute=recompute[i] if recompute else base.recompute) for i, m in enumerate(moe))


def _batch(result: dict[str, Any], request: dict[str, Any] | None) -> tuple[int, int]:
    """(global batch, sequence length) from the request, else recovered from the estimate."""
    if request is not None:
        t = request.get("training", {})
        if "global_batch_size" in t:
            return int(t["global_batch_size"]), int(t.get("seq_length", 2048))
    est = result.get("estimate", {})
    thr, step = est.get("throughput_samples_per_s"), est.get("step_time_s")
    if not thr or not step:
        raise SpecError.at(("request", "training"), "exporting needs the request's training batch")
    return round(thr * step), round(est.get("tokens_per_s", 0.0) / thr)


def _notes(plan: PlanStrategy, main: LayerStrategy, framework: str) -> list[str]:
    notes: list[str] = []
    other = [i for i, s in enumerate(plan.layers) if without_experts(s) != main]
    if other:
        kinds = Counter(without_experts(plan.layers[i]) for i in other)
        desc = "; ".join(f"{n} x {_short(s)}" for s, n in kinds.most_common())
        notes.append(f"per-layer strategy not expressible in {framework}: {len(other)} of {len(plan.layers)} layers "
                     f"use another strategy ({desc}); all layers get {_short(main)}")
    if len(set(plan.stage_layers)) > 1:
        notes.append(f"uneven pipeline stages {list(plan.stage_layers)}")
    return notes


def _short(s: LayerStrategy) -> str:
    sp = f" sp={s.sp}" if s.sp else ""
    return f"tp{s.tp} cp{s.cp} dp{s.dp}{sp} zero{s.zero} recompute={s.recompute}"


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
        return ["full" if i < self.full_layers * chunks else "none" for n in stage_layers for i in range(n)]

    def describe(self) -> str:
        if self.selective:
            return "selective recomputation on every layer"
        return f"full recomputation of the first {self.full_layers} layers of every model chunk" \
            if self.full_layers else "no recomputation"


def _most_per_chunk(plan: PlanStrategy, modes: set[str]) -> int:
    """The most layers of those modes any stage holds, per model chunk (rounded up: never less recomputation)."""
    v = chunks(plan.schedule, plan.virtual_stages)
    return -(-max(sum(1 for x in _stage(plan, st) if x.recompute in modes) for st in range(plan.pp)) // v)


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
                    request: dict[str, Any] | None = None) -> MegatronLayout:
    """The split and recomputation the Megatron export writes: with the request, the pair that runs fastest
    within the memory limit by the plan's cost model (else the leanest); without it, the nearest split and the
    memory-safe recomputation."""
    if request is None:
        return _memory_safe_layout(plan)
    splits: list[tuple[int, ...] | None] = [*nearest_megatron_splits(plan)] or [None]
    options = megatron_recompute_options(plan)
    layouts = [MegatronLayout(split, option, by_cost_model=True) for split in splits for option in options]
    return _fastest_that_fits(request, [(lay, megatron_run_plan(plan, expert_layers, lay)) for lay in layouts]) \
        or _memory_safe_layout(plan)


def _fastest_that_fits(request: dict[str, Any], options: Sequence[tuple[T, PlanStrategy]]) -> T | None:
    """Of (option, the plan a framework runs with it): the option whose plan runs fastest within the memory
    limit by the request's cost model, else the one needing the least memory; None where none can be
    estimated."""
    from solvers.cost_model.api import estimate

    scored = []
    for option, run in options:
        try:
            est = estimate({**request, "strategy": run.to_dict()})
        except SpecError:
            continue
        scored.append(((not est["fits"], est["step_time_s"] if est["fits"] else est["peak_memory_gib"]), option))
    return min(scored, key=lambda t: t[0])[1] if scored else None


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
    return replace(plan, layers=_with_experts(plan, base, expert_layers, modes), stage_layers=tuple(parts),
                   embedding=megatron_embedding(base))


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


def _torchtitan_dominant_recompute(plan: PlanStrategy) -> TorchtitanRecompute:
    return TorchtitanRecompute(dominant(plan).recompute)  # selective: the op policy


def torchtitan_recompute(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                         request: dict[str, Any] | None = None) -> TorchtitanRecompute:
    """The activation checkpointing the torchtitan export writes: with the request, the setting that runs
    fastest within the memory limit by the plan's cost model (else the leanest); without it, the dominant
    layer's mode."""
    if request is None:
        return _torchtitan_dominant_recompute(plan)
    return _fastest_that_fits(request, [(rc, torchtitan_run_plan(plan, expert_layers, rc))
                                        for rc in TORCHTITAN_RECOMPUTE]) or _torchtitan_dominant_recompute(plan)


def torchtitan_run_plan(plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                        recompute: TorchtitanRecompute | None = None) -> PlanStrategy:
    """What torchtitan runs from ``torchtitan_toml``: the dominant layout on every layer with FSDP wherever the
    plan shards anything (``torchtitan_fsdp_zero``), TP with sequence parallelism, one activation-checkpoint
    setting (``recompute``, by default the dominant layer's mode)."""
    s = dominant(plan)
    base = replace(s, sp="megatron" if s.tp > 1 else None, zero=torchtitan_fsdp_zero(plan))
    modes = (recompute or _torchtitan_dominant_recompute(plan)).modes(plan.stage_layers)
    return replace(plan, layers=_with_experts(plan, base, expert_layers, modes),
                   embedding=megatron_embedding(base))


def front_loaded_split(items: int, parts: int) -> tuple[int, ...]:
    """Equal parts, the first ones taking one more item each while a remainder lasts: DeepSpeed's uniform
    pipeline partition (``partition_uniform``), and the chunks of a stage in the torchtitan export."""
    base, extra = divmod(items, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


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
    return replace(plan, layers=_with_experts(plan, base, expert_layers, [x.recompute for x in plan.layers]),
                   schedule="gpipe" if plan.schedule == "gpipe" else "1f1b", virtual_stages=1,
                   stage_layers=front_loaded_split(len(plan.layers), plan.pp),
                   embedding=EmbeddingStrategy(tp=1 if uly else base.tp, dp=base.dp * (base.tp if uly else 1),
                                               zero=base.zero))


def as_run_note(run: PlanStrategy, result: dict[str, Any], request: dict[str, Any] | None, framework: str) -> str:
    """The framework's run of the export, estimated by the plan's own cost model against the plan."""
    if request is None:
        return ""
    from solvers.cost_model.api import estimate

    try:
        est = estimate({**request, "strategy": run.to_dict()})
    except SpecError as err:  # the run is no valid plan: say why once, not once per layer of the run
        return f"{framework} cannot run it as exported: " + "; ".join(dict.fromkeys(p.msg for p in err.problems))
    plan_step = float(result.get("estimate", {}).get("step_time_s") or 0.0)
    step, peak = float(est["step_time_s"]), float(est["peak_memory_gib"])
    slower = f" ({step / plan_step - 1:+.1%} against the plan's {plan_step:.4g} s)" if plan_step else ""
    fits = "" if est["fits"] else ": OVER THE MEMORY LIMIT, it would not run"
    note = f"as {framework} runs it, estimated step {step:.4g} s{slower}, peak {peak:.1f} GiB per GPU{fits}"
    base = result.get("baselines", {}).get("megatron") or {}
    base_step = (base.get("estimate") or {}).get("step_time_s")
    if framework == "Megatron-LM" and base.get("fits") and base_step and (not est["fits"] or base_step < step):
        alt = PlanStrategy.from_dict(base["strategy"])
        ep, etp = expert_layout(alt)
        experts = (f" ep{ep}" + (f" etp{etp}" if etp is not None else "")) if ep > 1 or etp is not None else ""
        note += (f"; the best uniform Megatron-style plan fits and runs at {base_step:.4g} s: "
                 f"{_short(dominant(alt))}{experts}, pp {alt.pp}, {alt.micro_batches} micro-batches "
                 "(its arguments: export of=megatron)")
    return note


def megatron_args(plan: PlanStrategy, batch: int, seq: int, model: dict[str, Any] | None,
                  layout: MegatronLayout | None = None) -> str:
    s = dominant(plan)
    notes = _notes(plan, s, "Megatron-LM")
    layout = layout or _memory_safe_layout(plan)
    rc = layout.recompute
    if {x.recompute for x in plan.layers} >= {"full", "selective"}:
        notes.append("Megatron-LM takes one recomputation granularity: the plan's mix of full and selective "
                     f"layers runs as {rc.describe()}")
    mbs = batch // plan.micro_batches // s.dp
    args = [
        f"--tensor-model-parallel-size {s.tp}", f"--pipeline-model-parallel-size {plan.pp}",
        f"--context-parallel-size {s.cp}", f"--micro-batch-size {max(mbs, 1)}", f"--global-batch-size {batch}",
        f"--seq-length {seq}", "--bf16",
    ]
    if _megatron_base(plan).sp == "megatron":
        args.append("--sequence-parallel")
    if s.sp == "ulysses":
        notes.append("Megatron-LM has no Ulysses sequence parallelism: written as tensor parallelism with sequence "
                     "parallelism")
    if s.zero >= 1:
        args.append("--use-distributed-optimizer")
    if s.zero >= 2:
        notes.append(f"ZeRO-{s.zero} approximated by the distributed optimizer (ZeRO-1)")
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
        # layers per virtual stage needs an even split; an uneven one names the chunks per rank instead
        args.append(f"--num-virtual-stages-per-pipeline-rank {v}" if uneven
                    else f"--num-layers-per-virtual-pipeline-stage {parts[0] // v}")
        if plan.pp == 2:  # Megatron refuses interleaving on 2 stages unless p2p overlaps compute
            args.append("--overlap-p2p-comm")
    args += rc.args(parts, v)
    if uneven:
        args += [f"--decoder-first-pipeline-num-layers {parts[0]}", f"--decoder-last-pipeline-num-layers {parts[-1]}"]
    if model:
        # Megatron requires --max-position-embeddings and ties the output layer to the embedding by default
        args += [f"--num-layers {model.get('num_layers')}", f"--hidden-size {model.get('hidden_size')}",
                 f"--num-attention-heads {model.get('num_attention_heads')}", f"--max-position-embeddings {seq}"]
        if not model.get("tied_embeddings"):
            args.append("--untie-embeddings-and-output-weights")
        if model.get("ffn_hidden_size"):
            args.append(f"--ffn-hidden-size {model['ffn_hidden_size']}")
        kv = model.get("num_kv_heads")
        if kv and kv != model.get("num_attention_heads"):
            args += ["--group-query-attention", f"--num-query-groups {kv}"]
            if kv % s.tp:  # the plan replicates the KV heads over the TP group
                notes.append(f"{kv} query groups under tensor parallel {s.tp}: Megatron-Core releases before 0.16 "
                             "refuse it (num_query_groups must be a multiple of tensor_model_parallel_size)")
        if model.get("mlp") == "swiglu":
            args.append("--swiglu")
        if model.get("num_experts"):
            args += _megatron_moe_args(plan, model)
    head = "".join(f"# {n}\n" for n in notes)
    return head + " \\\n".join(args) + "\n"


def _megatron_moe_args(plan: PlanStrategy, model: dict[str, Any]) -> list[str]:
    """Experts, routing and expert parallelism. Megatron's integer --moe-layer-freq N puts MoE on layers 0,
    N, 2N, ...; the spec's every-N-th layer is N - 1, 2N - 1, ..., so anything but all-MoE is a pattern."""
    ep, _ = expert_layout(plan)
    etp = run_expert_tp(plan, _megatron_base(plan))  # as megatron_run_plan runs them
    pattern = [int(x) for x in model["expert_layers"]]
    args = [f"--num-experts {model['num_experts']}", f"--moe-router-topk {model['top_k']}",
            f"--moe-ffn-hidden-size {model['expert_ffn_hidden_size']}", f"--expert-model-parallel-size {ep}"]
    if etp is not None:
        args.append(f"--expert-tensor-parallel-size {etp}")
    if not all(pattern):
        args.append(f"--moe-layer-freq '[{','.join(map(str, pattern))}]'")
    return args


def _stage(plan: PlanStrategy, stage: int) -> tuple[LayerStrategy, ...]:
    start = sum(plan.stage_layers[:stage])
    return plan.layers[start:start + plan.stage_layers[stage]]


def deepspeed_config(plan: PlanStrategy, batch: int, seq: int, first_notes: Sequence[str] = ()) -> str:
    s = dominant(plan)
    notes = [*first_notes, *_notes(plan, s, "DeepSpeed")]
    mbs = max(batch // plan.micro_batches // s.dp, 1)
    cfg: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": mbs,
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
    notes = _notes(plan, s, "torchtitan")
    rc = recompute or _torchtitan_dominant_recompute(plan)
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
    mbs = max(batch // plan.micro_batches // s.dp, 1)
    bounds = [f'"layers.{b}"' for b in torchtitan_split_points(plan)]
    lines = [*(f"# {n}" for n in notes), "[training]", f"global_batch_size = {batch}",
             f"local_batch_size = {batch // s.dp}", f"seq_len = {seq}", "mixed_precision_param = \"bfloat16\"", "",
             "[parallelism]", f"data_parallel_replicate_degree = {replicate}",
             f"data_parallel_shard_degree = {shard}", f"tensor_parallel_degree = {s.tp}",
             f"context_parallel_degree = {s.cp}", f"pipeline_parallel_degree = {plan.pp}",
             f"pipeline_parallel_schedule = \"{schedule}\"", f"pipeline_parallel_microbatch_size = {mbs}"]
    if plan.pp > 1:
        lines.append(f"pipeline_parallel_split_points = [{', '.join(bounds)}]")
    ep, _ = expert_layout(plan)
    if ep > 1:
        lines.append(f"expert_parallel_degree = {ep}")
    lines += ["", "[activation_checkpoint]", *rc.toml()]
    return "\n".join(lines) + "\n"


def galvatron_notes(plan: PlanStrategy, run: PlanStrategy) -> list[str]:
    """What Galvatron runs differently from the plan (``run``: the written file read back), one note per kind of
    change with the number of layers it touches."""
    changes: Counter[tuple[str, Any, Any]] = Counter()
    for a, b in zip(plan.layers, run.layers, strict=True):
        for key in ("tp", "dp", "cp", "sp", "zero", "recompute", "ep", "etp"):
            if getattr(a, key) != getattr(b, key):
                changes[(key, getattr(a, key), getattr(b, key))] += 1
    why = {"recompute": "Galvatron checkpoints whole layers",
           "zero": "Galvatron sets ZeRO-3 per layer and one default_dp_type, ddp or zero2, for all other layers",
           "sp": "Galvatron's sequence_parallel is one switch for every tensor-parallel layer"}

    def say(key: str, value: Any, named: bool = True) -> str:
        return f"ZeRO-{value}" if key == "zero" else f"{key} {value}" if named else str(value)

    notes = [f"{n} of {len(plan.layers)} layers: {say(key, a)} written as {say(key, b, named=False)}"
             + (f" ({why[key]})" if key in why else "") for (key, a, b), n in changes.items()]
    if plan.embedding != run.embedding:
        notes.append(f"embedding {plan.embedding.to_dict()} written as {run.embedding.to_dict()} "
                     "(Galvatron's embed_sdp is ZeRO-3, else the layers' default_dp_type)")
    return notes


def galvatron_json(plan: PlanStrategy, batch: int, num_gpus: int | None, result: dict[str, Any] | None = None,
                   request: dict[str, Any] | None = None) -> str:
    """Galvatron's plan file, with ``_paraplan_notes`` (a key Galvatron ignores) saying what it runs differently:
    the file read back, against the plan (and, with the request, estimated as the other exports are)."""
    from solvers.formats.galvatron import plan_from_galvatron_config, plan_to_galvatron_config

    config = plan_to_galvatron_config(plan, global_batch_size=batch, num_gpus=num_gpus)
    try:
        run = plan_from_galvatron_config(config, num_gpus or plan.pp * (plan.layers[0].world if plan.layers else 1))
    except SpecError as err:
        notes = [f"Galvatron cannot read this file back as a plan: {err}"]
    else:
        note = as_run_note(run, result, request, "Galvatron") if result is not None else ""
        notes = ([note] if note else []) + galvatron_notes(plan, run)
    config["_paraplan_notes"] = notes
    return json.dumps(config, indent=2) + "\n"


def export(result: dict[str, Any], fmt: str, request: dict[str, Any] | None = None, of: str = "plan") -> str:
    """The plan of a hybrid ``result`` in ``fmt`` (``megatron``, ``deepspeed``, ``torchtitan``,
    ``galvatron``). ``request`` (the plan's request) supplies batch and model; without it the batch is
    recovered from the estimate and the model arguments are left out. ``of`` names what to export: the plan,
    or one of the result's baselines (``megatron``: the best uniform plan, which Megatron-LM runs as it is)."""
    if fmt not in FORMATS:
        raise SpecError.at(("format",), f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    if of != "plan":
        result = _baseline_result(result, of)
    try:
        plan = PlanStrategy.from_dict(result["strategy"])
    except (KeyError, TypeError, ValueError) as err:
        raise SpecError.at(("result", "strategy"), f"not a hybrid plan: {err}") from None
    # a stored result may be damaged or come from another version of paraplan: micro_batches 0 or ZeRO 7 raised
    # ZeroDivisionError / KeyError deep in the writers (an HTTP 500)
    problems = check_structure(plan, ("result", "strategy"))
    if problems:
        raise SpecError(problems)
    batch, seq = _batch(result, request)
    model = _model(request)
    experts = model["expert_layers"] if model else None
    if fmt == "megatron":
        layout = megatron_layout(plan, experts, request)
        note = as_run_note(megatron_run_plan(plan, experts, layout), result, request, "Megatron-LM")
        return (f"# {note}\n" if note else "") + megatron_args(plan, batch, seq, model, layout)
    if fmt == "deepspeed":
        ds = deepspeed_run_plan(plan, experts)
        note = as_run_note(ds, result, request, "DeepSpeed") if ds else ""
        return deepspeed_config(plan, batch, seq, [note] if note else [])
    if fmt == "torchtitan":
        rc = torchtitan_recompute(plan, experts, request)
        note = as_run_note(torchtitan_run_plan(plan, experts, rc), result, request, "torchtitan")
        return (f"# {note}\n" if note else "") + torchtitan_toml(plan, batch, seq, rc)
    gpus = None
    if request is not None:
        c = request.get("cluster", {})
        gpus = int(c.get("nodes", 1)) * int(c.get("gpus_per_node", 8))
    return galvatron_json(plan, batch, gpus, result, request)


def _baseline_result(result: dict[str, Any], name: str) -> dict[str, Any]:
    """A result whose plan is the baseline ``name`` (its strategy and estimate; the baselines kept)."""
    baselines = result.get("baselines") or {}
    if name not in baselines:
        known = ", ".join(["plan", *baselines])
        raise SpecError.at(("of",), f"unknown plan to export {name!r}; this result has: {known}")
    base = baselines[name] if isinstance(baselines[name], dict) else {}
    if not base.get("strategy"):
        why = base.get("note") or "it does not fit"
        raise SpecError.at(("of",), f"the {name} baseline has no plan to export: {why}")
    return {**result, "strategy": base["strategy"], "estimate": base.get("estimate") or {}}


def _model(request: dict[str, Any] | None) -> dict[str, Any] | None:
    if request is None or "model" not in request:
        return None
    from solvers.specs import ModelSpec

    try:
        m = ModelSpec.model_validate(request["model"])
    except ValueError:
        return None
    out: dict[str, Any] = {
        "num_layers": m.num_layers, "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
        "ffn_hidden_size": m.ffn_size, "num_kv_heads": m.kv_heads, "mlp": m.mlp, "tied_embeddings": m.tied_embeddings,
        "expert_layers": [m.is_moe_layer(i) for i in range(m.num_layers)] if m.moe else None}
    if m.moe:
        out.update(num_experts=m.moe.num_experts, top_k=m.moe.top_k, expert_ffn_hidden_size=m.expert_ffn_size)
    return out
