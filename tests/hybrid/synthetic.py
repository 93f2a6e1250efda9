"""A small synthetic cost model for testing the planner against the CostModel protocol.

It is deliberately simple but has every feature that makes the search hard: memory/time trade-offs
(recompute, ZeRO, TP, CP), per-step costs (gradient sync), transient memory (ZeRO-3 gathers), re-layout
costs between layers of different layouts, stage-dependent in-flight micro-batches, embedding/head costs
on the first/last stage, and optionally non-identical layers. All memory is a whole number of MiB, so a
planner whose memory axis has 1 MiB bins is exact on it.

``evaluate`` is written independently of the planner's aggregation (plain loops), so agreement between
the two is a real check of the contract.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from solvers.cost_model.base import CostModel, Estimate, LayerCosts, PipelineTraits, StageContext, StageFixed
from solvers.cost_model.galvatron import galvatron_pipeline_time
from solvers.cost_model.pipeline import step_time_s
from solvers.strategy import LayerStrategy, PlanStrategy

MIB = 2**20
RECOMPUTE_TIME = {"none": 1.0, "selective": 1.08, "full": 1.33}
RECOMPUTE_ACT = {"none": 1.0, "selective": 0.55, "full": 0.12}


@dataclass
class SyntheticCostModel(CostModel):
    num_layers: int
    num_gpus: int
    memory_limit_bytes: float
    global_batch: int
    layer_scale: Sequence[float] = ()  # per layer multiplier of time and memory; empty = all 1
    param_mib: float = 60.0  # one layer's parameters (bf16), MiB
    act_mib_per_sample: float = 8.0
    time_per_sample_s: float = 0.01
    tp_comm_s_per_sample: float = 0.0015
    dp_sync_s: float = 0.02
    gpus_per_node: int = 8
    embed_time_s: float = 0.004
    embed_mib: float = 40.0
    reserve_mib: float = 10.0
    handover_s: float = 0.0  # per micro-batch on every stage of a pipeline (pp > 1): its activations' hand-over
    # True: the analytic model's pipeline formula (the planner then uses its linear-pipeline bounds);
    # False: another monotone formula, (m - 1) max(t) + sum(t) / v + max(u), where only the generic paths apply
    linear_pipeline: bool = True
    # with linear_pipeline False: Galvatron's bounded formula instead (at least m x the slowest stage)
    galvatron_formula: bool = False
    # with neither: above 1, ranks that share a host's cores (the profile's ``host``): the step is
    # min(L, max(L / slowdown, W)), L the linear formula's step and W the stages' mean work m t + u
    host_slowdown: float = 1.0
    # an embedding/LM-head TP degree the model cannot price (infinite fixed terms on every stage, as Galvatron's
    # model marks a vocabulary split it has no profile for)
    unpriced_embedding_tp: int | None = None
    calls: dict[str, int] = field(default_factory=dict)

    @property
    def pipeline_traits(self) -> PipelineTraits:
        galvatron = not self.linear_pipeline and self.galvatron_formula
        return PipelineTraits(linear=self.linear_pipeline, at_least_slowest_stage=self.linear_pipeline or galvatron,
                              bounded_by_linear=self._host_bound, at_least_chain=galvatron,
                              adds_first_stage_sync=galvatron)

    @property
    def _host_bound(self) -> bool:  # (the host formula: the only one lifted from the linear one)
        return not self.linear_pipeline and not self.galvatron_formula and self.host_slowdown > 1.0

    def step_bound_from_linear(self, linear_s: float, mean_work_s: float) -> float:
        return min(linear_s, max(linear_s / self.host_slowdown, mean_work_s))

    def _scale(self, layer: int) -> float:
        return float(self.layer_scale[layer]) if self.layer_scale else 1.0

    # ------------------------------------------------------------------ protocol
    def layer_costs(self, layer: int, candidates: Sequence[LayerStrategy], ctx: StageContext) -> LayerCosts:
        self.calls["layer_costs"] = self.calls.get("layer_costs", 0) + 1
        rows = [self._one(layer, c, ctx) for c in candidates]
        arr = np.array(rows, dtype=float).reshape(len(candidates), 5)
        return LayerCosts(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4])

    def _one(self, layer: int, c: LayerStrategy, ctx: StageContext) -> tuple[float, float, float, float, float]:
        k = self._scale(layer)
        samples = ctx.micro_batch_samples / c.dp
        shard = c.tp * c.cp
        # TP loses efficiency as it grows; CP slightly less; Ulysses in between.
        eff = {None: 1.0, "megatron": 1.0, "ulysses": 0.97}[c.sp] * (1.0 - 0.04 * math.log2(c.tp)) * (
            1.0 - 0.03 * math.log2(c.cp))
        compute = k * self.time_per_sample_s * samples / shard / eff * RECOMPUTE_TIME[c.recompute]
        comm = 0.0
        if c.tp > 1:
            inter = 1.0 if c.tp <= self.gpus_per_node else 6.0
            comm += k * self.tp_comm_s_per_sample * samples * (c.tp - 1) / c.tp * inter / c.cp
        if c.cp > 1:
            comm += 0.3 * k * self.tp_comm_s_per_sample * samples / c.tp
        zero3_mb = 0.15 * compute if c.zero == 3 else 0.0  # re-gathering weights every micro-batch
        time_s = compute + comm + zero3_mb
        step_s = 0.0
        if c.dp > 1:
            step_s = k * self.dp_sync_s / c.tp * (c.dp - 1) / c.dp * (1.5 if c.zero >= 2 else 1.0)
        p = k * self.param_mib / c.tp  # this rank's parameter shard before ZeRO
        bytes_per = {0: 16.0, 1: 4.0 + 12.0 / c.dp, 2: 2.0 + 14.0 / c.dp, 3: 16.0 / c.dp}[c.zero]
        state = math.ceil(p * bytes_per / 2.0)
        sp_div = c.tp if c.sp in ("megatron", "ulysses") else max(1.0, c.tp / 2)
        act = math.ceil(k * self.act_mib_per_sample * samples / c.cp / sp_div * RECOMPUTE_ACT[c.recompute])
        extra = math.ceil(2 * p) if c.zero == 3 else math.ceil(0.1 * p)
        return time_s, step_s, state * MIB, act * MIB, extra * MIB

    def transition_s(self, prev: Sequence[LayerStrategy], nxt: Sequence[LayerStrategy],
                     ctx: StageContext) -> np.ndarray:
        def layout(xs: Sequence[LayerStrategy]) -> np.ndarray:
            sp = {None: 0, "megatron": 1, "ulysses": 2}
            return np.array([[x.tp, x.cp, x.dp, sp[x.sp]] for x in xs], dtype=float).reshape(len(xs), 4)

        a, b = layout(prev), layout(nxt)
        differs = np.any(a[:, None, :] != b[None, :, :], axis=2)
        dp_max = np.maximum(a[:, None, 2], b[None, :, 2])
        out = np.where(differs, 0.0004 * ctx.micro_batch_samples / dp_max, 0.0)
        return out

    def stage_fixed(self, ctx: StageContext) -> StageFixed:
        n_ends = int(ctx.stage == 0) + int(ctx.stage == ctx.pp - 1)
        if ctx.embedding is not None and ctx.embedding.tp == self.unpriced_embedding_tp:
            return StageFixed(time_s=math.inf, step_time_s=0.0, state_bytes=0.0, activation_bytes=0.0,
                              other_bytes=math.inf)
        return StageFixed(
            time_s=n_ends * self.embed_time_s * ctx.micro_batch_samples + (self.handover_s if ctx.pp > 1 else 0.0),
            step_time_s=n_ends * 0.002,
            state_bytes=n_ends * self.embed_mib * MIB,
            activation_bytes=n_ends * 2 * MIB,
            other_bytes=self.reserve_mib * MIB,
        )

    def in_flight_micro_batches(self, ctx: StageContext) -> float:
        if ctx.schedule == "gpipe":
            return float(ctx.micro_batches)
        inflight = min(ctx.micro_batches, ctx.pp - ctx.stage)
        if ctx.schedule == "interleaved":
            inflight = min(ctx.micro_batches, ctx.pp - ctx.stage + ctx.pp - 1)
        return float(inflight)

    def pipeline_step_time(self, stage_time_s: Sequence[float], stage_step_time_s: Sequence[float],
                           ctx: StageContext) -> float:
        v = ctx.virtual_stages if ctx.schedule == "interleaved" else 1
        if self.linear_pipeline:
            return step_time_s(stage_time_s, stage_step_time_s, ctx.micro_batches, v, ctx.schedule)
        if self.galvatron_formula:
            # as Galvatron's: B_s holds the layers' times with sync, without the embedding/head (C_s has it)
            fixed = [self.stage_fixed(replace(ctx, stage=s)).time_s for s in range(len(stage_time_s))]
            with_sync = [t + u - f for t, u, f in zip(stage_time_s, stage_step_time_s, fixed, strict=True)]
            return galvatron_pipeline_time(list(stage_time_s), with_sync, ctx.micro_batches, bounded=True)
        if self._host_bound:
            linear = step_time_s(stage_time_s, stage_step_time_s, ctx.micro_batches, v, ctx.schedule)
            work = sum(ctx.micro_batches * t + u for t, u in zip(stage_time_s, stage_step_time_s, strict=True))
            return self.step_bound_from_linear(linear, work / len(stage_time_s))
        fill = sum(stage_time_s) / v
        return (ctx.micro_batches - 1) * max(stage_time_s) + fill + max(stage_step_time_s)

    # ------------------------------------------------------------------ whole plan (independent loops)
    def device_layers(self, plan: PlanStrategy) -> list[list[int]]:
        out, start = [], 0
        for n in plan.stage_layers:
            out.append(list(range(start, start + n)))
            start += n
        return out

    def evaluate(self, plan: PlanStrategy) -> Estimate:
        mbs = self.global_batch / plan.micro_batches
        times, steps, mems = [], [], []
        for s, idx in enumerate(self.device_layers(plan)):
            ctx = StageContext(plan.pp, s, plan.micro_batches, mbs, plan.schedule, plan.virtual_stages)
            fx = self.stage_fixed(ctx)
            t, u, state, act, extra = fx.time_s, fx.step_time_s, fx.state_bytes, fx.activation_bytes, 0.0
            for pos, i in enumerate(idx):
                lc = self.layer_costs(i, [plan.layers[i]], ctx)
                t += float(lc.time_s[0])
                u += float(lc.step_time_s[0])
                state += float(lc.state_bytes[0])
                act += float(lc.activation_bytes[0])
                extra = max(extra, float(lc.peak_extra_bytes[0]))
                if pos:
                    t += float(self.transition_s([plan.layers[idx[pos - 1]]], [plan.layers[i]], ctx)[0, 0])
            times.append(t)
            steps.append(u)
            mems.append(fx.other_bytes + state + self.in_flight_micro_batches(ctx) * act + extra)
        ctx0 = StageContext(plan.pp, 0, plan.micro_batches, mbs, plan.schedule, plan.virtual_stages)
        step = self.pipeline_step_time(times, steps, ctx0)
        peak = max(mems)
        return Estimate(
            step_time_s=step, throughput_samples_per_s=self.global_batch / step, tokens_per_s=0.0, mfu=0.0,
            peak_memory_gib=peak / 2**30, memory_gib_per_stage=[m / 2**30 for m in mems],
            breakdown_s={}, stage_time_s=times, fits=peak <= self.memory_limit_bytes + 1e-6,
        )
