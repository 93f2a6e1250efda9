"""The Galvatron-compatible cost model: Galvatron's (hetu-galvatron 2.4.0) search-engine formulas on its
own profile and hardware files, behind paraplan's ``CostModel`` interface, so that plans of both planners
are compared under one model (``cost_model = {"kind": "galvatron", "profiles_dir", "hardware_dir"}``).

What Galvatron reports for a plan, and what ``evaluate`` reproduces:

Time. A layer's forward time is its profiled per-sample time times the samples it sees (``b / tp`` for a
micro-batch of ``b`` samples per data-parallel rank); backward is twice that, recomputation adds one more
forward. TP collectives: 4 all-reduces of the layer's activations per layer (6 with recomputation), at
the measured all-reduce bandwidth of the TP group (``sp_space = "tp"``), or 4 all-gather/reduce-scatter or
all-to-all collectives timed from ``sp_time`` (``"tp+sp"``; Ulysses uses all-to-all). The data-parallel
gradient all-reduce overlaps the backward pass: the overlapped part runs ``overlap_coe`` times slower;
ZeRO-3 adds a parameter all-gather. Pipeline stages add a p2p term. The embedding / LM head ("other") adds
its own profiled time, vocabulary-TP collectives and gradient sync. Per stage, ``C_s`` = sum of the layers'
times without gradient sync (+ the embedding/head on the first and last stage) and ``B_s`` = sum of the
layers' times with it; Galvatron's pipeline formula is

    T = max(sum_s C_s + (m - 1) C_last,
            max(min(p-1, m-1) C_0 / 3, sum_{s>0} C_s / 3) + max(2/3 (same)) + max(0, m + 1 - p) C_0)
        + max(0, max_s (B_s - sum_{j<=s} C_j))

(``m`` micro-batches, ``p`` stages); throughput = global batch / T. The formula presumes stage times that
do not grow along the pipeline (Galvatron partitions evenly); with a slow middle or last stage it can charge
less than ``m`` times that stage, less than the stage's own work, which a planner free to partition
unevenly will exploit. ``pipeline_formula = "bounded"`` keeps the pipeline part at least ``m max(C)``; it
changes nothing where the first stage is the slowest, as in Galvatron's own plans, and is the default (so
planners searching uneven partitions under this model cannot exploit the blind spot); ``"galvatron"`` keeps
the formula as is.

Memory (MB, per GPU). A layer: 4 x its parameters (/ tp unless Ulysses) times Galvatron's ZeRO-2 / ZeRO-3
ratio over its data-parallel group (which depends on whether there are several micro-batches and on
asynchronous gradient reduction), plus the profiled activation per sample for its TP degree (checkpoint
size with recomputation, / tp under Megatron SP) times the samples held under 1F1B: the first
``min(p - stage, m)`` micro-batches (under GPipe Galvatron counts a single micro-batch). Each layer's total
is rounded up to whole MB. The embedding / head adds its profiled model states (with ZeRO) and activations,
a 1 GB PyTorch context, and under Megatron SP the global communication buffer. Galvatron keeps 20% of a
budget above 20 GB for the allocator cache. A plan fits when every stage's total, cache included, is within
the budget.

How the non-separable parts map onto the ``CostModel`` interface (``evaluate`` == the shared aggregation,
``solvers.cost_model.aggregate``): a layer's ``time_s`` is its time without gradient sync (its share of
``C_s``), its ``step_time_s`` the extra the gradient sync adds (``B_s - C_s``, summed per stage); the
embedding/head time is ``stage_fixed.time_s``; ``pipeline_step_time`` recovers ``B_s`` from the two and
applies the formula above. Galvatron rounds each layer's memory up to a whole MB after adding its
activations: ``state_bytes`` carries the rounding (model states + rounding), ``activation_bytes`` the
activations divided by the in-flight count, so state + in-flight x activation is Galvatron's rounded
figure. Galvatron's search DP also adds an inter-layer re-layout term that the time it reports omits;
``transition_s`` is zero unless ``layer_transitions`` is set.

Galvatron's micro-batching is relative to a "minimum TP" data-parallel unit: ``m`` micro-batches of
``ceil(B / (N / p / min_tp) / m)`` samples per group of ``min_tp`` GPUs; layers may not use a smaller TP.
Here ``min_tp`` is the smallest power of two for which Galvatron's strict micro-batch rule holds (the best
for any plan: a larger one only enlarges the vocabulary-TP messages), and ``max_tp`` (which sizes the SP
buffer) the smallest power of two covering the plan's TP degrees, unless the request fixes them.

Megatron sequence parallelism is one flag for the whole model in Galvatron (``cost_model.sequence_parallel``,
default on, which also selects the ``_sp`` memory profiles); a TP layer's ``sp`` of None or "megatron" is
costed by that flag, "ulysses" as Galvatron's Ulysses layers.

Not expressible in Galvatron and so refused (SpecError from ``evaluate``; infinite cost for a planner's
candidate): context parallelism, expert parallelism, ZeRO-1, selective recomputation, interleaved
schedules, TP/DP groups that do not fill the stage, non-power-of-two degrees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from solvers.cost_model.aggregate import evaluate_plan
from solvers.cost_model.base import CostModel, Estimate, LayerCosts, PipelineTraits, StageContext, StageFixed
from solvers.cost_model.flops import model_flops_per_step
from solvers.cost_model.galvatron_files import (
    GalvatronHardware,
    GalvatronProfile,
    TimeMode,
    read_hardware,
    read_profile,
)
from solvers.errors import FieldProblem, SpecError
from solvers.request import HybridRequest, problems_from_validation
from solvers.specs import requested_memory_gib
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy

MB = float(2**20)
SpSpace = Literal["tp", "tp+sp"]


class GalvatronCostModelSpec(BaseModel):
    """``cost_model`` of a request with ``kind = "galvatron"``; defaults are Galvatron's (as the peer runner)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["galvatron"] = "galvatron"
    profiles_dir: str
    hardware_dir: str | list[str]  # a list is searched in order, file by file
    profile_name: str | None = None  # default: the only profile pair in profiles_dir
    time_profile_mode: TimeMode = "static"
    static_bsz: int | None = Field(default=None, gt=0)  # default: the first profiled batch size, as Galvatron
    sequence_parallel: bool = True  # Megatron SP on TP layers (Galvatron's global --sequence_parallel)
    sp_space: SpSpace = "tp"
    async_grad_reduce: bool = True
    pytorch_context_mb: float = Field(default=1024.0, ge=0)
    memory_cache: bool = True  # keep 20% of budgets above 20 GB for the allocator
    global_memory_buffer: bool = True
    costmodel_coe: float = Field(default=1.0, gt=0)
    min_tp: int | None = Field(default=None, gt=0)
    max_tp: int | None = Field(default=None, gt=0)
    layer_transitions: bool = False
    # "bounded" (default): never below the slowest stage's own work; identical to Galvatron's formula on
    # every plan Galvatron returned (tests/cost_model/test_galvatron.py). "galvatron": its formula as is.
    pipeline_formula: Literal["galvatron", "bounded"] = "bounded"


@dataclass(frozen=True)
class GalvatronOptions:
    sequence_parallel: bool = True
    sp_space: SpSpace = "tp"
    async_grad_reduce: bool = True
    pytorch_context_mb: float = 1024.0
    memory_cache: bool = True
    global_memory_buffer: bool = True
    costmodel_coe: float = 1.0
    min_tp: int | None = None
    max_tp: int | None = None
    layer_transitions: bool = False
    pipeline_formula: Literal["galvatron", "bounded"] = "bounded"


@dataclass(frozen=True)
class Batching:
    """Galvatron's micro-batching of one pipeline configuration."""

    min_tp: int
    mbsz: int  # samples per micro-batch per min_tp data-parallel group
    chunks: int  # micro-batches its memory model counts
    real_chunks: int  # micro-batches its pipeline time model counts


@dataclass(frozen=True)
class _LayerTime:
    """Milliseconds for all ``num_layers`` dummy layers, as Galvatron's TimeCostModel computes them."""

    total: float
    compute: float
    recompute: float
    tp_comm: float
    zero_gather: float
    p2p: float


def _pow2(x: int) -> bool:
    return x >= 1 and x & (x - 1) == 0


def _next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def chunk_sizes(size: int, chunks: int) -> list[int]:
    """Sizes of ``torch.arange(size).chunk(chunks)``: ceil-sized pieces, possibly fewer than ``chunks``."""
    step = -(-size // chunks)
    return [min(step, size - i * step) for i in range(chunks) if i * step < size] if size > 0 else []


def overlapped_backward(dp_ms: float, bct: float, dc: float, overlap: float) -> float:
    """Backward + gradient all-reduce (``dp_ms`` MB at ``dc`` ms/MB) with overlap slow-down ``overlap``.

    Galvatron: while both run, each is ``overlap`` times slower; the longer one finishes alone.
    """
    dpo, bco = dp_ms * dc * overlap, bct * overlap
    if dpo > bco:
        return bco + (dp_ms - bco / (dc * overlap)) * dc
    if dpo < bco:
        return dpo + bct - dpo / overlap
    return bco


def overlapped_pass(comm: float, comp: float, overlap: float) -> float:
    """One pass of the embedding/head: ``comp`` ms of compute overlapping ``comm`` ms of communication."""
    slowed = comp * overlap
    return comm + (slowed - comm) / overlap if slowed > comm else comm


def zero_ratio(stage: int, d: int, chunks: int, *, mixed: bool, async_grad_reduce: bool) -> float:
    """Galvatron's model-state multiplier for ZeRO-``stage`` (2 or 3) over ``d`` ranks.

    Model states are 4x the parameter size; ZeRO-2 shards optimizer states and gradients but keeps the
    half-precision weights (and, with several micro-batches, the gradient accumulation buffer); ZeRO-3
    shards everything but a small bias (+0.003) the Galvatron authors added to stay above measurements.
    """
    shard = 1 / d + 0.003
    if chunks == 1:
        if stage == 3:
            return shard
        return 7 / 8 * shard + 1 / 8 if mixed else 3 / 4 * shard + 1 / 4
    if async_grad_reduce:
        if stage == 3:
            return 7 / 8 * shard + 1 / 8 if mixed else 3 / 4 * shard + 1 / 4
        return 6 / 8 * shard + 2 / 8 if mixed else 2 / 4 * shard + 2 / 4
    if stage == 3:
        return shard * 5 / 4
    return (7 / 8 * shard + 1 / 8) * 5 / 4 if mixed else 3 / 4 * shard + 1 / 4


def galvatron_pipeline_time(compute: Sequence[float], with_sync: Sequence[float], chunks: int,
                            bounded: bool = False) -> float:
    """Galvatron's pipeline formula (see the module docstring): ``compute`` = C_s, ``with_sync`` = B_s.

    The formula assumes stage times that do not grow along the pipeline; when a later stage is the
    slowest it can charge less than ``m`` times that stage, below the work the stage must do.
    ``bounded`` keeps it at least ``m max(C)``.
    """
    p, m = len(compute), chunks
    c0, rest = compute[0], float(sum(compute[1:]))
    t = float(sum(compute)) + compute[-1] * (m - 1)
    warm = min(p - 1, m - 1) * c0
    t = max(t, max(warm / 3, rest / 3) + max(warm * 2 / 3, rest * 2 / 3) + c0 * max(0, m + 1 - p))
    if bounded:
        t = max(t, m * max(compute))
    reduce = max(b - float(sum(compute[: s + 1])) for s, b in enumerate(with_sync))
    return t + max(0.0, reduce)


class GalvatronCostModel(CostModel):
    """Galvatron 2.4.0's search-engine cost model for one request (model, cluster, batch, budget)."""

    def __init__(self, profile: GalvatronProfile, hardware: GalvatronHardware, *, num_layers: int,
                 hidden_size: int, seq_length: int, global_batch_size: int, precision: str,
                 memory_limit_mb: float, options: GalvatronOptions = GalvatronOptions(),
                 search_max_tp: int = 8, model_flops_per_step: float = 0.0, peak_flops_per_gpu: float = 1.0):
        self.profile = profile
        self.hardware = hardware
        self.num_layers = num_layers
        self.num_gpus = hardware.nodes * hardware.gpus_per_node
        self.hidden_size = hidden_size
        self.seq_length = seq_length
        self.global_batch_size = global_batch_size
        self.precision = precision
        self.mixed = precision != "fp32"
        self.elem_bytes = 2 if self.mixed else 4
        self.options = options
        self.search_max_tp = min(search_max_tp, self.num_gpus)
        self.memory_limit_mb = memory_limit_mb
        self.memory_limit_bytes = memory_limit_mb * MB
        # Galvatron: budgets above 20 GB keep 20% for PyTorch's cache (int MB); the rest is for the plan.
        budget = int(memory_limit_mb)
        self.cache_mb = float(int(budget * 0.2)) if options.memory_cache and budget // 1024 > 20 else 0.0
        self.model_flops_per_step = model_flops_per_step
        self.peak_flops_per_gpu = peak_flops_per_gpu
        self.warnings: list[str] = []
        self._layer_cache: dict[tuple[Any, ...], LayerCosts] = {}
        self._batching_cache: dict[tuple[int, int], Batching | None] = {}
        self._fixed_cache: dict[tuple[Any, ...], StageFixed] = {}

    # ----------------------------------------------------------------------------------- construction
    @classmethod
    def from_request(cls, req: HybridRequest) -> GalvatronCostModel:
        data = {"kind": req.cost_model.kind, **(req.cost_model.model_extra or {})}
        try:
            spec = GalvatronCostModelSpec.model_validate(data)
        except ValidationError as err:
            raise problems_from_validation(err, ("cost_model",), GalvatronCostModelSpec) from None
        problems = [FieldProblem(("cost_model", k), f"{k} must be a power of two")
                    for k in ("min_tp", "max_tp") if getattr(spec, k) is not None and not _pow2(getattr(spec, k))]
        # Layers take tp in [min_tp, max_tp]: a min_tp above the cluster or the TP cap the request sets left every
        # plan unpriced, and planning blamed constraints.memory_limit_gib ("no legal strategy")
        caps = [(req.cluster.num_gpus, f"the cluster's {req.cluster.num_gpus} GPUs"),
                (spec.max_tp, f"cost_model.max_tp ({spec.max_tp})"),
                (req.constraints.max_tp, f"constraints.max_tp ({req.constraints.max_tp})"),
                (None if req.constraints.tp_across_nodes else req.cluster.gpus_per_node,
                 f"a node's {req.cluster.gpus_per_node} GPUs (tensor parallelism stays inside a node unless "
                 "constraints.tp_across_nodes is true)")]
        over = [what for cap, what in caps if cap is not None and spec.min_tp is not None and spec.min_tp > cap]
        if over and not problems:
            problems.append(FieldProblem(("cost_model", "min_tp"), f"min_tp ({spec.min_tp}) exceeds {over[0]}: "
                                                                   "no layer can take a tensor-parallel degree"))
        if req.training.precision not in ("bf16", "fp16", "fp32"):
            problems.append(FieldProblem(("training", "precision"),
                                         f"Galvatron profiles bf16, fp16 or fp32, not {req.training.precision}"))
        if problems:
            raise SpecError(problems)
        profile = read_profile(spec.profiles_dir, precision=req.training.precision,
                               seq_length=req.training.seq_length, sequence_parallel=spec.sequence_parallel,
                               name=spec.profile_name, time_mode=spec.time_profile_mode,
                               static_bsz=spec.static_bsz)
        profiled = max(profile.activation_mb_per_sample, default=0)
        if spec.min_tp is not None and spec.min_tp > profiled:  # (else every layer is unpriced: "no plan")
            raise SpecError.at(("cost_model", "min_tp"), f"min_tp ({spec.min_tp}) exceeds the largest tensor-parallel "
                                                         f"degree the memory profile covers ({profiled})")
        hardware = read_hardware(spec.hardware_dir, nodes=req.cluster.nodes,
                                 gpus_per_node=req.cluster.gpus_per_node, need_sp_time=spec.sp_space == "tp+sp")
        options = GalvatronOptions(**{f: getattr(spec, f) for f in GalvatronOptions.__dataclass_fields__})
        # Galvatron budgets the memory it is told, as it is: its "80 GB" runs budget 80 x 1024 MB, above the
        # 79.15 GiB an A100-80GB gives CUDA, and its plans are compared under that budget, so unlike the analytic
        # model's (``solvers.specs.memory_limit_bytes``) it is not capped at the GPU's memory
        model = cls(profile, hardware, num_layers=req.model.num_layers, hidden_size=req.model.hidden_size,
                   seq_length=req.training.seq_length, global_batch_size=req.training.global_batch_size,
                   precision=req.training.precision,
                   memory_limit_mb=requested_memory_gib(req.cluster, req.constraints) * 2**30 / MB,
                   options=options,
                   search_max_tp=spec.max_tp or req.constraints.max_tp or 8,
                   model_flops_per_step=model_flops_per_step(req.model, req.training),
                   peak_flops_per_gpu=req.cluster.gpu.peak_flops(req.training.precision))
        asked, have = requested_memory_gib(req.cluster, req.constraints), req.cluster.gpu.memory_gib
        if asked > have:
            gpu = req.cluster.gpu.name
            model.warnings.append(f"constraints.memory_limit_gib = {asked:g} GiB is more than the {gpu}'s {have:.2f} "
                                  "GiB of device memory: Galvatron's model plans to the budget as given, as Galvatron "
                                  f"does (a plan above {have:.2f} GiB would not start)")
        # Galvatron takes the model's shape from its arguments and the costs from the profiles; say so when
        # they visibly describe different models (profiled parameter size = 4 bytes per parameter).
        expected_mb = req.model.layer_params(0) * 4 / MB
        if abs(profile.parameter_mb / expected_mb - 1) > 0.1:
            model.warnings.append(f"profile {profile.name} has {profile.parameter_mb:.0f} MB of parameters per layer; "
                                  f"{req.model.name} has {expected_mb:.0f} MB: the profiles describe another model")
        return model

    def with_options(self, **changes: Any) -> GalvatronCostModel:
        """A copy with some options changed (e.g. ``max_tp``), sharing the parsed files."""
        copy = GalvatronCostModel(
            self.profile, self.hardware, num_layers=self.num_layers, hidden_size=self.hidden_size,
            seq_length=self.seq_length, global_batch_size=self.global_batch_size, precision=self.precision,
            memory_limit_mb=self.memory_limit_mb, options=replace(self.options, **changes),
            search_max_tp=self.search_max_tp, model_flops_per_step=self.model_flops_per_step,
            peak_flops_per_gpu=self.peak_flops_per_gpu)
        copy.warnings = list(self.warnings)
        return copy

    # ----------------------------------------------------------------------------------- batching
    @property
    def max_tp(self) -> int:
        return self.options.max_tp or self.search_max_tp

    def batching(self, pp: int, micro_batches: int) -> Batching | None:
        """Galvatron's micro-batching for ``pp`` stages and ``micro_batches``; None if it allows none."""
        key = (pp, micro_batches)
        if key not in self._batching_cache:
            self._batching_cache[key] = self._batching(pp, micro_batches)
        return self._batching_cache[key]

    def _batching(self, pp: int, chunk: int) -> Batching | None:
        n, b = self.num_gpus, self.global_batch_size
        if n % pp or b % chunk:
            return None
        tps = [self.options.min_tp] if self.options.min_tp else [1 << i for i in range(n.bit_length())]
        for t in tps:
            if t * pp > n or n % (pp * t) or t > self.max_tp:
                continue
            groups = n // pp // t
            if b % groups or chunk > b // groups:
                continue
            mbsz = -(-(b // groups) // chunk)
            if chunk != -(-(b // groups) // mbsz):  # Galvatron's strict rule: this many micro-batches exactly
                continue
            local = b * t // (n // pp)
            c1 = max(1, -(-local // mbsz))
            real = len(chunk_sizes(int(b / groups), c1))
            chunks = min(c1, max(1, b // groups))
            return Batching(min_tp=t, mbsz=mbsz, chunks=chunks, real_chunks=real)
        return None

    # ----------------------------------------------------------------------------------- validity
    def layer_problem(self, s: LayerStrategy, pp: int, batching: Batching | None) -> str | None:
        """Why Galvatron cannot cost this layer strategy (None if it can)."""
        n_stage = self.num_gpus // pp
        if batching is None:
            return "Galvatron allows no micro-batching of this global batch into this many micro-batches"
        if s.cp != 1 or s.ep != 1:
            return "Galvatron has no context or expert parallelism"
        if s.recompute == "selective":
            return "Galvatron recomputes whole layers only (recompute 'none' or 'full')"
        if s.dp > 1 and s.zero == 1:
            return "Galvatron has no ZeRO-1 (use 0, 2 or 3)"
        if s.tp * s.dp != n_stage:
            return f"tp x dp must fill the {n_stage} GPUs of a stage"
        if not (_pow2(s.tp) and _pow2(s.dp)):
            return "Galvatron uses power-of-two degrees only"
        if not batching.min_tp <= s.tp <= self.max_tp:
            return f"tp must be within Galvatron's window [{batching.min_tp}, {self.max_tp}] here"
        if s.tp not in self.profile.activation_mb_per_sample:
            return f"the memory profile has no activation size for tp={s.tp}"
        if self.options.sp_space == "tp+sp" and s.tp > 1:
            table = self.hardware.sp_all2all if s.sp == "ulysses" else self.hardware.sp_allreduce
            if s.tp not in table:
                return f"the sp_time file has no collective times for {s.tp} GPUs"
        return None

    def _embedding_shards(self, e: EmbeddingStrategy, pp: int) -> int:
        """The copies of the embedding's weights its ZeRO shards over: the stage's GPUs over the vocabulary TP,
        or all of them where the vocabulary is sequence-split (vsp: weights as with vocabulary TP 1)."""
        return self.num_gpus // pp // (1 if e.sp == "ulysses" else e.tp)

    def embedding_problem(self, e: EmbeddingStrategy, pp: int, batching: Batching | None) -> str | None:
        if batching is None:
            return "no valid micro-batching"
        k = e.tp
        if not _pow2(k) or not batching.min_tp <= k <= self.max_tp or k * pp > self.num_gpus:
            return f"vocabulary tp must be a power of two within [{batching.min_tp}, {self.max_tp}]"
        # ZeRO over a single replica shards nothing (level 1 is level 0 there), as for the layers: refusing it
        # left constraints.zero = 1 with no embedding at all, and the planner then blamed the memory limit
        if e.zero == 1 and self._embedding_shards(e, pp) > 1:
            return "Galvatron has no ZeRO-1 for the embedding (use 0, 2 or 3)"
        if e.sp == "megatron":
            return "the vocabulary layers are tensor parallel (sp null) or sequence parallel (sp 'ulysses')"
        p = self.profile
        if not all(k in o.model_states and k in o.activation and 1 in o.model_states
                   for o in (p.other_pp_off, p.other_pp_first, p.other_pp_last)):
            return f"the memory profile has no embedding/head sizes for vocabulary tp={k}"
        return None

    # ----------------------------------------------------------------------------------- time
    def _layer_time(self, s: LayerStrategy, pp: int, samples: float, no_comm: bool) -> _LayerTime:
        """Galvatron's TimeCostModel for a micro-batch of ``samples`` (whole stage), in ms for L layers."""
        hw, L = self.hardware, self.num_layers
        tp, dp, ulysses, ckpt = s.tp, s.dp, s.sp == "ulysses", s.recompute == "full"
        b = samples / dp
        param = self.profile.parameter_mb if ulysses else self.profile.parameter_mb / tp
        fct = self.profile.layer_time.batch_ms(b / tp) * L
        bct = 2 * fct + (fct if ckpt else 0.0)
        dp_msg = 2 * (dp - 1) / dp * param * L / (2 if self.mixed else 1)
        gather_msg = dp_msg * 0.5
        if no_comm:
            dp_msg = 0.0
        if ulysses:
            dc = hw.coe(tp * dp)
        elif tp == 1 or dp == 1:
            dc = hw.coe(dp)
        else:
            dc = hw.coe(dp, consecutive=0)  # TP groups are contiguous ranks, so DP groups are strided
        tp_comm = self._tp_comm_ms(s, b) if tp > 1 else 0.0
        if dp == 1:
            body = fct + bct + tp_comm
        elif tp == 1 or dp > 2:
            body = fct + overlapped_backward(dp_msg, bct, dc, hw.overlap_coe) + tp_comm
        else:  # dp == 2: Galvatron lets only half the backward overlap the gradient sync
            body = fct + bct / 2 + overlapped_backward(dp_msg, bct / 2, dc, hw.overlap_coe) + tp_comm
        gather = gather_msg * dc if (s.zero == 3 and dp > 1) else 0.0
        p2p = 0.0
        if pp > 1:
            if pp not in hw.p2p_coe:
                raise SpecError.at(("cost_model", "hardware_dir"), f"no p2p bandwidth for pipeline degree {pp}")
            p2p = pp * 2 * b * self.seq_length * self.hidden_size * self.elem_bytes / MB * hw.p2p_coe[pp]
        total = body + gather + p2p
        return _LayerTime(total=total, compute=3 * fct, recompute=fct if ckpt else 0.0, tp_comm=tp_comm,
                          zero_gather=gather, p2p=p2p)

    def _tp_comm_ms(self, s: LayerStrategy, b: float) -> float:
        tp, L, ckpt = s.tp, self.num_layers, s.recompute == "full"
        if self.options.sp_space == "tp+sp":
            count = 4 * L * (1.5 if ckpt else 1.0)
            msg = b * self.seq_length * self.hidden_size * self.elem_bytes
            table = (self.hardware.sp_all2all if s.sp == "ulysses" else self.hardware.sp_allreduce)[tp]
            per = table.ms_by_bytes.get(msg)  # type: ignore[call-overload]
            return count * (per if per is not None else table.fit(msg / MB))
        volume = 2 * (tp - 1) / tp * (b * self.seq_length * self.hidden_size * 4 * 4 / MB) * L
        volume *= (1.5 if ckpt else 1.0) / (2 if self.mixed else 1)
        tc = self.hardware.coe(tp) if s.dp == 1 else self.hardware.coe(tp, consecutive=1)
        return volume * tc

    def _other_time_ms(self, e: EmbeddingStrategy, pp: int, batching: Batching) -> list[float]:
        """Galvatron's OtherTimeCostModel (no-gradient-sync variant, the one its pipeline formula uses)."""
        hw, k, n = self.hardware, e.tp, self.num_gpus
        mbsz, min_tp = batching.mbsz, batching.min_tp
        vsp = e.sp == "ulysses"
        dpk = n // pp // k
        if vsp:  # sequence-split vocabulary: no vocabulary collectives, gradients synced over the whole stage
            one = 0.0
        elif self.options.sp_space == "tp+sp":
            msg = mbsz * self.seq_length * self.hidden_size * self.elem_bytes
            one = 0.0 if k == 1 else hw.sp_allreduce[k].fit(msg / MB)
        else:
            coe = hw.coe(k) if (k == 1 or dpk == 1) else hw.coe(k, consecutive=0)
            one = (k - 1) / k * (mbsz * self.seq_length * self.hidden_size / MB) * self.elem_bytes * coe
        fct = self.profile.other_time.batch_ms(mbsz / min_tp)
        if vsp:
            dp_coe = hw.coe(n // pp) * (n // pp - 1) / (n // pp)
            states = (self.profile.other_pp_off if pp == 1 else self.profile.other_pp_last).model_states[1]
        else:
            dp_coe = (hw.coe(dpk) if (k == 1 or dpk == 1) else hw.coe(dpk, consecutive=0)) * (dpk - 1) / dpk
            states = (self.profile.other_pp_off if pp == 1 else self.profile.other_pp_first).model_states[k]
        grad = states / 4 * dp_coe
        fwd_f, bwd_f = (0.5, 1.0) if e.zero == 3 else (0.0, 0.5)

        def stage_ms(comp: float, tp_ms: float) -> float:
            return (overlapped_pass(grad * fwd_f, comp, hw.overlap_coe)
                    + overlapped_pass(grad * (bwd_f - 0.5), comp * 2, hw.overlap_coe) + tp_ms)

        if pp == 1:
            return [stage_ms(fct, 2 * one)]  # Galvatron counts the vocabulary collective twice (embedding + head)
        out = [0.0] * pp
        out[0] = out[-1] = stage_ms(fct / 2, one)
        return out

    # ----------------------------------------------------------------------------------- memory
    def _layer_memory_mb(self, s: LayerStrategy, ctx: StageContext, batching: Batching) -> tuple[float, float]:
        """(model states, activations held at the stage's peak) in MB, as Galvatron's MemoryCostModel."""
        b, t, pp = self.global_batch_size, batching.min_tp, ctx.pp
        tp, dp, ulysses = s.tp, s.dp, s.sp == "ulysses"
        chunks = max(1, -(-((b // dp) // (tp // t)) // batching.mbsz))
        chunks = min(chunks, max(1, b // (tp * dp // t)))
        sizes = chunk_sizes(int(b / dp / (tp // t)), chunks)
        if ctx.schedule == "1f1b" or pp == 1:
            held = min(pp - ctx.stage, chunks)
            samples = b / dp * sum(sizes[:held]) / sum(sizes)
        else:  # Galvatron's GPipe memory: one micro-batch
            samples = float(sizes[0])
        states = 4 * (self.profile.parameter_mb if ulysses else self.profile.parameter_mb / tp)
        if dp > 1 and s.zero in (2, 3):
            sdp = tp * dp if ulysses else dp
            states *= zero_ratio(s.zero, sdp, chunks, mixed=self.mixed,
                                 async_grad_reduce=self.options.async_grad_reduce)
        if s.recompute == "full":
            act = self.profile.checkpoint_activation_mb_per_sample * samples
            if self.options.sequence_parallel:
                act /= tp
        else:
            act = self.profile.activation_mb_per_sample[tp] * samples
        return states, act

    def in_flight_micro_batches(self, ctx: StageContext) -> float:
        batching = self.batching(ctx.pp, ctx.micro_batches)
        if batching is None or (ctx.schedule == "gpipe" and ctx.pp > 1):
            return 1.0
        return float(max(1, min(ctx.pp - ctx.stage, batching.chunks)))

    def _other_memory_mb(self, e: EmbeddingStrategy, ctx: StageContext, batching: Batching) -> tuple[float, float]:
        """(model states, activations) of the embedding/head on this stage, MB (before rounding)."""
        p, k, pp, stage = self.profile, e.tp, ctx.pp, ctx.stage
        n_stage = self.num_gpus // pp
        samples = self.global_batch_size * k / n_stage / batching.chunks
        model_tp, shards = (1 if e.sp == "ulysses" else k), self._embedding_shards(e, pp)
        if e.zero in (2, 3):
            ratio = zero_ratio(e.zero, shards, batching.chunks, mixed=self.mixed,
                               async_grad_reduce=self.options.async_grad_reduce)
        else:
            ratio = 1.0
        if pp == 1:
            return p.other_pp_off.model_states[model_tp] * ratio, p.other_pp_off.activation[k] * samples
        states = act = 0.0
        if stage == 0:
            held = pp if ctx.schedule == "1f1b" else 1
            states += p.other_pp_first.model_states[model_tp] * ratio
            act += p.other_pp_first.activation[k] * samples * held
        if stage == pp - 1:
            states += p.other_pp_last.model_states[model_tp] * ratio
            act += p.other_pp_last.activation[k] * samples
        return states, act

    def _buffer_mb(self, batching: Batching) -> float:
        """Megatron-SP global communication buffer Galvatron reserves on every stage."""
        if not (self.options.sequence_parallel and self.options.global_memory_buffer):
            return 0.0
        size = batching.mbsz / batching.min_tp * self.max_tp * self.hidden_size * self.seq_length * 4 / MB
        return float(int(size / 2 if self.mixed else size))

    # ----------------------------------------------------------------------------------- CostModel
    def layer_costs(self, layer: int, candidates: Sequence[LayerStrategy], ctx: StageContext) -> LayerCosts:
        # Galvatron profiles one layer type: every layer of a stage costs the same, whatever the embedding.
        key = (tuple(candidates), ctx.pp, ctx.stage, ctx.micro_batches, ctx.schedule, ctx.virtual_stages)
        if key not in self._layer_cache:
            self._layer_cache[key] = self._layer_costs(candidates, ctx)
        return self._layer_cache[key]

    def _layer_costs(self, candidates: Sequence[LayerStrategy], ctx: StageContext) -> LayerCosts:
        n = len(candidates)
        cols = {name: np.zeros(n) for name in ("time", "step", "state", "act", "compute", "recompute", "tp_comm",
                                                "zero_gather", "pp_p2p", "model_states", "rounding")}
        batching = self.batching(ctx.pp, ctx.micro_batches)
        unsupported = ctx.schedule == "interleaved" or ctx.virtual_stages > 1
        scale = 1e-3 * self.options.costmodel_coe / self.num_layers
        in_flight = self.in_flight_micro_batches(ctx)
        for i, s in enumerate(candidates):
            if unsupported or batching is None or self.layer_problem(s, ctx.pp, batching) is not None:
                cols["time"][i] = cols["state"][i] = np.inf
                continue
            samples = self.global_batch_size / batching.real_chunks
            quiet = self._layer_time(s, ctx.pp, samples, no_comm=True)
            full = self._layer_time(s, ctx.pp, samples, no_comm=False)
            cols["time"][i] = quiet.total * scale
            cols["step"][i] = (full.total - quiet.total) * scale
            cols["compute"][i] = quiet.compute * scale
            cols["recompute"][i] = quiet.recompute * scale
            cols["tp_comm"][i] = quiet.tp_comm * scale
            cols["zero_gather"][i] = quiet.zero_gather * scale
            cols["pp_p2p"][i] = quiet.p2p * scale
            states, act = self._layer_memory_mb(s, ctx, batching)
            rounded = math.ceil(states + act)  # Galvatron's DP works on whole MB per layer
            cols["state"][i] = (rounded - act) * MB
            cols["act"][i] = act / in_flight * MB
            cols["model_states"][i] = states * MB
            cols["rounding"][i] = (rounded - act - states) * MB
        return LayerCosts(
            time_s=cols["time"], step_time_s=cols["step"], state_bytes=cols["state"],
            activation_bytes=cols["act"], peak_extra_bytes=np.zeros(n),
            parts_s={k: cols[k] for k in ("compute", "recompute", "tp_comm", "zero_gather", "pp_p2p")},
            step_parts_s={"dp_comm_exposed": cols["step"]},
            memory_parts_bytes={"model_states": cols["model_states"], "rounding": cols["rounding"]},
        )

    def transition_s(self, prev: Sequence[LayerStrategy], nxt: Sequence[LayerStrategy],
                     ctx: StageContext) -> np.ndarray:
        out = np.zeros((len(prev), len(nxt)))
        batching = self.batching(ctx.pp, ctx.micro_batches)
        if not self.options.layer_transitions or batching is None:
            return out
        # Galvatron's DP objective (not its reported time): re-layout of activations when TP grows, or
        # changes under Megatron SP; its 1e-9-scale tie-breaking biases are left out.
        sample = self.seq_length * self.hidden_size * self.elem_bytes
        for i, a in enumerate(prev):
            for j, c in enumerate(nxt):
                if not (c.tp > a.tp or (self.options.sequence_parallel and c.tp != a.tp)):
                    continue
                big, small_dp = max(a.tp, c.tp), min(a.dp, c.dp)
                volume = (big - 1) / big * batching.mbsz * (big // batching.min_tp) * sample
                coe = self.hardware.coe(big) if (big == 1 or small_dp == 1) else self.hardware.coe(big, 1)
                out[i, j] = volume * coe * 1e-7
        return out

    def stage_fixed(self, ctx: StageContext) -> StageFixed:
        key = (ctx.pp, ctx.stage, ctx.micro_batches, ctx.schedule, ctx.embedding)
        if key not in self._fixed_cache:
            self._fixed_cache[key] = self._stage_fixed(ctx)
        return self._fixed_cache[key]

    def _stage_fixed(self, ctx: StageContext) -> StageFixed:
        batching = self.batching(ctx.pp, ctx.micro_batches)
        e = ctx.embedding or self.default_embedding(ctx.pp)
        if batching is None or self.embedding_problem(e, ctx.pp, batching) is not None:
            return StageFixed(time_s=np.inf, other_bytes=np.inf)
        time_s = self._other_time_ms(e, ctx.pp, batching)[ctx.stage] * 1e-3
        states, act = self._other_memory_mb(e, ctx, batching)
        # Galvatron rounds the embedding/head + context total up to whole MB, then adds the SP buffer.
        total = math.ceil(states + act + self.options.pytorch_context_mb)
        reserve = total - states - act + self._buffer_mb(batching) + self.cache_mb
        in_flight = self.in_flight_micro_batches(ctx)
        return StageFixed(
            time_s=time_s, state_bytes=states * MB, activation_bytes=act / in_flight * MB,
            other_bytes=reserve * MB, parts_s={"embedding_head": time_s} if time_s else {},
            memory_parts_bytes={"embedding_head_states": states * MB,
                                "context_buffers_cache": reserve * MB},
        )

    def default_embedding(self, pp: int) -> EmbeddingStrategy:
        """Galvatron's embedding without a plan: vocabulary TP 1, data parallel over the stage, no ZeRO."""
        return EmbeddingStrategy(tp=1, dp=self.num_gpus // pp, zero=0)

    @property
    def pipeline_traits(self) -> PipelineTraits:
        """Both forms of the formula charge at least Σ C + (m - 1) C_last and add, past the pipelined part, at
        least B_0 - C_0: the first stage's gradient sync that its compute does not hide (its step time less its
        embedding time). The bounded form also charges at least m × the slowest stage; Galvatron's own can
        charge less."""
        return PipelineTraits(at_least_slowest_stage=self.options.pipeline_formula == "bounded",
                              at_least_chain=True, adds_first_stage_sync=True)

    def pipeline_micro_batches(self, ctx: StageContext) -> int:
        """The micro-batches the pipeline formula counts (Galvatron's real chunks): the m of its bounds."""
        batching = self.batching(ctx.pp, ctx.micro_batches)
        return batching.real_chunks if batching else ctx.micro_batches

    def pipeline_step_time(self, stage_time_s: Sequence[float], stage_step_time_s: Sequence[float],
                           ctx: StageContext) -> float:
        batching = self.batching(ctx.pp, ctx.micro_batches)
        if batching is None:
            return math.inf
        fixed = [self.stage_fixed(replace(ctx, stage=s)).time_s for s in range(len(stage_time_s))]
        # B_s (with gradient sync, without the embedding/head) from the two aggregated sums.
        with_sync = [c + st - f for c, st, f in zip(stage_time_s, stage_step_time_s, fixed, strict=True)]
        return galvatron_pipeline_time(list(stage_time_s), with_sync, batching.real_chunks,
                                       bounded=self.options.pipeline_formula == "bounded")

    # ----------------------------------------------------------------------------------- whole plans
    def plan_problems(self, plan: PlanStrategy) -> list[FieldProblem]:
        """Why Galvatron's model cannot evaluate ``plan`` (field paths into the request's strategy)."""
        out: list[FieldProblem] = []
        loc = ("strategy",)
        if plan.schedule == "interleaved" or plan.virtual_stages > 1:
            out.append(FieldProblem((*loc, "schedule"), "Galvatron has GPipe and 1F1B schedules only"))
        if not _pow2(plan.pp) or self.num_gpus % plan.pp:
            out.append(FieldProblem((*loc, "pp"), f"pp must be a power of two dividing {self.num_gpus} GPUs"))
            return out
        batching = self.batching(plan.pp, plan.micro_batches)
        if batching is None:
            out.append(FieldProblem((*loc, "micro_batches"),
                                    f"Galvatron cannot split a global batch of {self.global_batch_size} into "
                                    f"{plan.micro_batches} micro-batches on {self.num_gpus // plan.pp} GPUs "
                                    "per stage"))
            return out
        seen: set[LayerStrategy] = set()
        for i, s in enumerate(plan.layers):
            if s in seen:
                continue
            seen.add(s)
            why = self.layer_problem(s, plan.pp, batching)
            if why:
                out.append(FieldProblem((*loc, "layers", i), why))
        why = self.embedding_problem(plan.embedding, plan.pp, batching)
        if why:
            out.append(FieldProblem((*loc, "embedding"), why))
        return out

    def for_plan(self, plan: PlanStrategy) -> GalvatronCostModel:
        """The model ``evaluate(plan)`` aggregates: ``max_tp`` bound to the plan's TP degrees unless fixed;
        no Megatron-SP buffer when Galvatron would find the plan in its "Ulysses only" search (sequence-split
        vocabulary, no Megatron-TP layer)."""
        changes: dict[str, Any] = {}
        if self.options.max_tp is None:
            widest = max([s.tp for s in plan.layers] + [plan.embedding.tp])
            changes["max_tp"] = min(_next_pow2(widest), self.num_gpus)
        if plan.embedding.sp == "ulysses" and all(s.tp == 1 or s.sp == "ulysses" for s in plan.layers):
            changes["global_memory_buffer"] = False
        return self.with_options(**changes) if changes else self

    def evaluate(self, plan: PlanStrategy) -> Estimate:
        model = self.for_plan(plan)
        problems = model.plan_problems(plan)
        if problems:
            raise SpecError(problems)
        est = evaluate_plan(model, plan, global_batch_size=self.global_batch_size, seq_length=self.seq_length,
                            model_flops_per_step=self.model_flops_per_step,
                            peak_flops_per_gpu=self.peak_flops_per_gpu)
        batching = model.batching(plan.pp, plan.micro_batches)
        assert batching is not None
        _fit_breakdown(est)
        est.notes.extend(self.warnings)
        est.notes.append(f"Galvatron 2.4.0 model: min_tp={batching.min_tp}, max_tp={model.max_tp}, "
                         f"micro-batch {batching.mbsz} per min_tp group, {batching.real_chunks} micro-batches, "
                         f"memory budget {self.memory_limit_mb:.0f} MB incl. {self.cache_mb:.0f} MB cache")
        return est


def _fit_breakdown(est: Estimate) -> None:
    """Make the time breakdown sum to the step time where Galvatron's formula charges the pipeline less
    than ``m`` times its slowest stage (the shared breakdown counts that much busy time)."""
    b = est.breakdown_s
    step_parts = b.get("dp_comm_exposed", 0.0)
    pipe_parts = sum(b.values()) - step_parts
    target = est.step_time_s - step_parts
    if pipe_parts > target * (1 + 1e-12) and pipe_parts > 0:
        for k in b:
            if k != "dp_comm_exposed":
                b[k] *= target / pipe_parts
        est.notes.append("Galvatron's pipeline formula assumes stage times that do not grow along the "
                         "pipeline; here it charges less than micro-batches x the slowest stage "
                         "(cost_model.pipeline_formula = 'bounded' does not)")
