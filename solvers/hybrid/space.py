"""The hybrid planner's search space: which degrees, schedules and per-layer strategies are legal.

Any GPU count works: degrees are divisors (of the GPU count, of the heads, of the batch), never assumed to be
powers of two. Tensor parallelism stays inside a node unless the request allows otherwise, because TP
all-reduces on every layer and would otherwise cross the (10x slower) network.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal, cast

from solvers.errors import SpecError
from solvers.hybrid.moe import with_expert_layouts
from solvers.request import HybridRequest
from solvers.specs import ModelSpec
from solvers.strategy import (
    RECOMPUTE_MODES,
    SP_KINDS,
    EmbeddingStrategy,
    LayerStrategy,
    PlanStrategy,
    Recompute,
    Schedule,
    SpKind,
)

ALL_SP: tuple[SpKind, ...] = SP_KINDS
ALL_RECOMPUTE: tuple[Recompute, ...] = RECOMPUTE_MODES


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class PipelineConfig:
    """One point of the outer search: everything a stage context needs besides the stage index."""

    pp: int
    micro_batches: int
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    embedding: EmbeddingStrategy | None = None  # None: the cost model's default


@dataclass(frozen=True)
class SearchSpace:
    num_gpus: int
    gpus_per_node: int
    num_layers: int
    global_batch_size: int
    seq_length: int
    heads: int
    kv_heads: int
    max_tp: int
    max_pp: int
    max_cp: int
    tp_across_nodes: bool = False
    sp_kinds: tuple[SpKind, ...] = ALL_SP
    zero_levels: tuple[int, ...] = (0, 1, 2, 3)
    recomputes: tuple[Recompute, ...] = ALL_RECOMPUTE
    schedules: tuple[Schedule, ...] = ("1f1b", "interleaved")
    micro_batches: tuple[int, ...] | None = None  # None: every divisor of the batch that makes sense
    virtual_stage_options: tuple[int, ...] = (2,)
    pipeline_parallel: bool = True
    num_experts: int = 1  # > 1: MoE layers also choose expert layouts (solvers.hybrid.moe)
    ffn: int = 0  # the dense layers' FFN width, which Megatron TP must divide (0: no dense layers, unchecked)
    allow_approximate: bool = False
    notes: list[str] = field(default_factory=list, compare=False)

    # ------------------------------------------------------------------ outer space
    def pp_options(self) -> list[int]:
        if not self.pipeline_parallel:
            return [1]
        return [p for p in divisors(self.num_gpus) if p <= self.max_pp and p <= self.num_layers]

    def micro_batch_options(self, pp: int) -> list[int]:
        if self.micro_batches is not None:
            return [m for m in self.micro_batches if self.global_batch_size % m == 0]
        # Fewer micro-batches than stages leaves stages idle by construction; keep pp=1 free to accumulate. But a
        # global batch smaller than pp has no other way through pp stages (and may need them: 16 GPUs, TP 8 and a
        # batch of 1 was refused as unsplittable though pp 2 with one micro-batch runs).
        every = divisors(self.global_batch_size)
        return [m for m in every if m >= pp] or every

    def pipeline_configs(self) -> list[PipelineConfig]:
        out: list[PipelineConfig] = []
        for pp in self.pp_options():
            for m in self.micro_batch_options(pp):
                for sched in self.schedules:
                    if sched == "interleaved":
                        # Megatron's interleaving needs pp > 1, m a multiple of pp and equal model chunks.
                        if pp == 1 or m % pp:
                            continue
                        for v in self.virtual_stage_options:
                            if self.num_layers >= pp * v:
                                out.append(PipelineConfig(pp, m, sched, v))
                    elif pp > 1 or sched == self.schedules[0]:
                        # with one stage every schedule is the same: keep one
                        out.append(PipelineConfig(pp, m, sched, 1))
        return out

    # ------------------------------------------------------------------ per-layer space
    def tp_cap(self) -> int:
        return self.max_tp if self.tp_across_nodes else min(self.max_tp, self.gpus_per_node)

    def tp_options(self, stage_gpus: int) -> list[int]:
        cap = self.tp_cap()
        # A TP group must sit inside one node's contiguous ranks: it must also divide gpus_per_node.
        return [
            t for t in divisors(stage_gpus)
            if t <= cap and self.heads % t == 0
            and (self.tp_across_nodes or self.gpus_per_node % t == 0 or t == 1)
        ]

    def layer_candidates(self, stage_gpus: int, micro_batch_samples: int) -> tuple[LayerStrategy, ...]:
        """Every legal layer strategy on a stage of ``stage_gpus`` GPUs for micro-batches of that many samples.

        A tuple, the same object on every call: the cost model recognises it by identity instead of hashing
        hundreds of strategies per question."""
        # a data-parallel degree divides the stage's GPUs: it divides the micro-batch iff it divides their gcd
        whole = math.gcd(stage_gpus, micro_batch_samples)
        key = (self._layer_space, stage_gpus, whole)
        hit = _CANDIDATES.get(key)
        if hit is None:
            if len(_CANDIDATES) > 4096:  # a process serving many requests: keep the cache bounded
                _CANDIDATES.clear()
            hit = _CANDIDATES[key] = tuple(self._layer_candidates(stage_gpus, whole))
        return hit

    @functools.cached_property
    def _layer_space(self) -> SearchSpace:
        """This space without what only the pipeline depends on: spaces that differ in those alone (a sizing
        front's sizes) get the same candidate tuples, which cost models recognise by identity. Its TP cap is the
        one the candidates obey (a request without ``max_tp`` caps TP at the cluster's GPUs, then at a node's)."""
        return replace(self, max_tp=self.tp_cap(), num_gpus=0, num_layers=0, global_batch_size=0, max_pp=0,
                       schedules=(), micro_batches=None, virtual_stage_options=(), pipeline_parallel=False)

    def _layer_candidates(self, stage_gpus: int, micro_batch_samples: int) -> list[LayerStrategy]:
        out: list[LayerStrategy] = []
        for tp, cp in self._tp_cp_splits(stage_gpus):
            dp = stage_gpus // (tp * cp)
            if micro_batch_samples % dp:
                continue  # every data-parallel rank gets whole samples
            for sp in self._sp_options(tp):
                if not self.splits_layer(tp, cp, sp):
                    continue
                for zero in self._zero_options(dp * cp):
                    for rc in self.recomputes:
                        out.append(LayerStrategy(tp=tp, dp=dp, cp=cp, sp=sp, zero=zero, recompute=rc))
        if self.num_experts > 1:
            out = with_expert_layouts(out, self.num_experts, self.gpus_per_node, self.allow_approximate)
        return out

    def splits_layer(self, tp: int, cp: int, sp: SpKind) -> bool:
        """Whether a layer splits evenly ``tp`` x ``cp`` ways under ``sp``: the sequence over cp (and over tp
        under SP), and under Megatron TP the KV heads and the FFN width too (an MoE layer's experts that TP
        does not divide: the cost model prices them out)."""
        if self.seq_length % (cp * (tp if sp is not None else 1)):
            return False
        return sp == "ulysses" or ((not self.kv_heads % tp or not tp % self.kv_heads) and not self.ffn % tp)

    def _tp_cp_splits(self, stage_gpus: int) -> Iterator[tuple[int, int]]:
        """(tp, cp) pairs legal on a stage of that many GPUs; the rest of the stage is data parallel."""
        for tp in self.tp_options(stage_gpus):
            for cp in divisors(stage_gpus // tp):
                if cp <= self.max_cp and not self.seq_length % (2 * cp if cp > 1 else 1):
                    yield tp, cp

    def unsplittable(self) -> str | None:
        """Why no layer strategy exists, where the GPU count is the cause: every split of it into
        pp x tp x cp x dp leaves a data-parallel degree that divides no micro-batch of the global batch.
        None where some split's degree would do (then another constraint, or memory, is the cause)."""
        splits: dict[int, tuple[int, int, int]] = {}  # data-parallel degree -> the first (pp, tp, cp) leaving it
        for c in self.pipeline_configs():
            g = self.num_gpus // c.pp
            for tp, cp in self._tp_cp_splits(g):
                if not any(self.splits_layer(tp, cp, sp) for sp in self._sp_options(tp)):
                    continue
                dp = g // (tp * cp)
                if (self.global_batch_size // c.micro_batches) % dp == 0:
                    return None
                splits.setdefault(dp, (c.pp, tp, cp))
        interleaved_only = self.schedules == ("interleaved",)
        rules = (f"pp ≤ {min(self.max_pp, self.num_layers)}{' dividing the micro-batches' if interleaved_only else ''}"
                 f", tp ≤ {self.tp_cap()} dividing the {self.heads} heads and either the FFN width of {self.ffn} and "
                 f"(or as a multiple) the {self.kv_heads} KV heads, or under Ulysses the sequence of {self.seq_length}"
                 + (f", cp ≤ {self.max_cp} with 2 cp dividing the sequence" if self.max_cp > 1 else ", cp 1"))
        if not splits:
            return f"no split of {self.num_gpus:,} GPUs into pp x tp x cp x dp obeys {rules}"
        dp = min(splits)
        pp, tp, cp = splits[dp]
        if self.micro_batches:  # the request fixed the micro-batch, the unit a data-parallel degree must divide
            m = self.micro_batches[0]
            batch = (f"a micro-batch ({self.global_batch_size:,} samples in constraints.micro_batches = {m} are "
                     f"{self.global_batch_size // m:,} each)")
        else:
            batch = f"the global batch of {self.global_batch_size:,}"
        fix = ["constraints.micro_batches"] * bool(self.micro_batches) + ["constraints.schedule"] * interleaved_only
        return (f"{self.num_gpus:,} GPUs split into pp x tp x cp x dp ({rules}) leave no data-parallel degree "
                f"that gives each rank whole samples of {batch}: the least is dp {dp:,} (pp {pp}, tp {tp}, cp {cp}); "
                f"choose {', '.join([*fix, 'a GPU count or a global batch'])} that fit")

    def allows(self, plan: PlanStrategy) -> bool:
        """Whether ``plan`` lies in this space (all its choices honour the request's constraints)."""
        if plan.pp not in self.pp_options() or plan.micro_batches not in self.micro_batch_options(plan.pp):
            return False
        if plan.schedule not in self.schedules or (
                plan.schedule == "interleaved" and plan.virtual_stages not in self.virtual_stage_options):
            return False
        g = self.num_gpus // plan.pp
        legal = set(self.layer_candidates(g, self.global_batch_size // plan.micro_batches))
        return all(x in legal for x in plan.layers)

    def embedding_options(self, stage_gpus: int) -> list[EmbeddingStrategy]:
        """Vocabulary-parallel embedding / LM head: TP inside a node, data parallel over the rest."""
        tps = [t for t in divisors(stage_gpus) if t <= self.tp_cap()]
        # ZeRO-2 sits between 1 and 3 for a single (vocabulary) matrix; keep it only where 1 is unavailable
        zeros = [z for z in self.zero_levels if z != 2 or 1 not in self.zero_levels]
        out = []
        for t in tps:
            dp = stage_gpus // t
            for z in (zeros if dp > 1 else [min(self.zero_levels)]):
                out.append(EmbeddingStrategy(tp=t, dp=dp, zero=z))
        return out

    def _sp_options(self, tp: int) -> list[SpKind]:
        if tp == 1:
            return [None]
        opts = [s for s in self.sp_kinds if s != "ulysses" or self.heads % tp == 0]
        return opts or [None]

    def _zero_options(self, replicas: int) -> list[int]:
        """ZeRO levels for weights replicated ``replicas`` times (dp x cp: ZeRO shards over both)."""
        if replicas == 1:
            return [min(self.zero_levels)]  # nothing to shard: all levels are the same plan
        return list(self.zero_levels)


_CANDIDATES: dict[tuple[SearchSpace, int, int], tuple[LayerStrategy, ...]] = {}

SpaceMode = Literal["full", "galvatron"]


def _sp_kinds(asked: str | None, mode: SpaceMode) -> tuple[SpKind, ...]:
    if asked is not None:
        return (None,) if asked == "none" else (cast(SpKind, asked),)
    return ALL_SP if mode == "full" else ("megatron",)


def layer_kinds(model: ModelSpec) -> list[Hashable]:
    """Layers of one kind cost the same (embedding and head are the stages' fixed terms)."""
    return ["moe" if model.is_moe_layer(i) else "dense" for i in range(model.num_layers)]


def expert_layers(model: ModelSpec) -> list[bool]:
    """Which layers are MoE (the uniform baselines give only those the experts' layout)."""
    return [model.is_moe_layer(i) for i in range(model.num_layers)]


def space_mode(req: HybridRequest) -> SpaceMode:
    return "galvatron" if req.cost_model.kind == "galvatron" else "full"


def build_space(req: HybridRequest, mode: SpaceMode = "full") -> SearchSpace:
    """The search space of a request; ``mode="galvatron"`` restricts it to what Galvatron 2.4 searches."""
    c, m, t = req.constraints, req.model, req.training
    n = req.cluster.num_gpus
    notes: list[str] = []
    schedules: tuple[Schedule, ...]
    if mode == "galvatron" and c.schedule == "interleaved":
        # its cost model prices no interleaved plan: the search found none and blamed the memory limit
        raise SpecError.at(("constraints", "schedule"), "Galvatron's cost model has the gpipe and 1f1b schedules "
                                                        "only, not interleaved")
    if c.schedule is not None:
        schedules = (c.schedule,)
    elif mode == "galvatron":
        schedules = ("1f1b",)
    else:
        schedules = ("1f1b", "interleaved")
    # a stack without a distributed optimizer (or ZeRO, FSDP) keeps every state whole on each replica
    if c.zero and not t.stack.distributed_optimizer:
        raise SpecError.at(("constraints", "zero"), f"ZeRO-{c.zero} shards states over data-parallel ranks and "
                                                    "training.stack.distributed_optimizer is false")
    zero_levels = ((c.zero,) if c.zero is not None else (0, 1, 2, 3) if t.stack.distributed_optimizer else (0,))
    micro = (c.micro_batches,) if c.micro_batches is not None else None
    if c.micro_batches is not None and t.global_batch_size % c.micro_batches:
        raise SpecError.at(
            ("constraints", "micro_batches"),
            f"{c.micro_batches} micro-batches do not divide global_batch_size {t.global_batch_size}",
        )
    space = SearchSpace(
        num_gpus=n,
        gpus_per_node=req.cluster.gpus_per_node,
        num_layers=m.num_layers,
        global_batch_size=t.global_batch_size,
        seq_length=t.seq_length,
        heads=m.num_attention_heads,
        kv_heads=m.kv_heads,
        max_tp=c.max_tp or n,
        max_pp=c.max_pp or n,
        # ring attention pays off for long sequences only: keep ≥ 2048 tokens per rank unless asked otherwise;
        # no shipped framework runs it on unfused attention kernels
        max_cp=(c.max_cp or (max(1, t.seq_length // 2048) if t.stack.attention == "fused" else 1))
        if mode == "full" else 1,
        tp_across_nodes=c.tp_across_nodes,
        sp_kinds=_sp_kinds(c.sp, mode),
        zero_levels=zero_levels if mode == "full" or c.zero is not None or len(zero_levels) == 1 else (0, 2, 3),
        recomputes=ALL_RECOMPUTE if mode == "full" else ("none", "full"),
        schedules=schedules,
        micro_batches=micro,
        num_experts=m.moe.num_experts if (m.moe is not None and mode == "full") else 1,
        ffn=m.ffn_size if not all(expert_layers(m)) else 0,
        allow_approximate=c.allow_approximate,
        virtual_stage_options=tuple(range(2, (c.max_virtual_stages or 2) + 1)),
        notes=notes,
    )
    return space
