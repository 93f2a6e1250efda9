"""Layer arrays -> stage totals -> Estimate: the one aggregation every cost model's ``evaluate`` uses.

The planners search over exactly these sums, so the rules are few and stated here once:
- a stage's per-micro-batch time is the sum of its layers' ``time_s``, the re-layout times between
  consecutive layers of the stage (``transition_s``) and ``stage_fixed(ctx).time_s``;
- its per-step time is the sum of the layers' ``step_time_s`` plus ``stage_fixed(ctx).step_time_s``;
- its memory is ``stage_memory_bytes``: resident states (summed), activations per in-flight micro-batch
  (summed) times the schedule's in-flight count, the largest transient working set of any one layer
  (transients are not live at the same time), and the fixed reserve;
- the step time is ``pipeline_step_time`` of the per-stage totals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from solvers.cost_model.base import CostModel, Estimate, StageContext
from solvers.strategy import LayerStrategy, PlanStrategy

GIB = float(2**30)


@dataclass
class StageTotals:
    """One pipeline stage, summed over its layers (seconds and bytes per GPU)."""

    time_s: float = 0.0  # per micro-batch
    step_time_s: float = 0.0  # once per step
    state_bytes: float = 0.0
    activation_bytes: float = 0.0  # per in-flight micro-batch
    peak_extra_bytes: float = 0.0  # the largest single-layer transient
    other_bytes: float = 0.0
    in_flight: float = 1.0
    parts_s: dict[str, float] = field(default_factory=dict)
    step_parts_s: dict[str, float] = field(default_factory=dict)
    memory_parts_bytes: dict[str, float] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> float:
        return stage_memory_bytes(self.state_bytes, self.activation_bytes, self.in_flight,
                                  self.peak_extra_bytes, self.other_bytes)


def stage_memory_bytes(state_bytes: float, activation_bytes: float, in_flight: float,
                       peak_extra_bytes: float, other_bytes: float) -> float:
    """Peak memory of a stage per GPU: what a planner must keep under the memory limit."""
    return state_bytes + activation_bytes * in_flight + peak_extra_bytes + other_bytes


def stage_context(plan: PlanStrategy, stage: int, global_batch_size: int) -> StageContext:
    """The context ``evaluate`` uses for ``stage``; a planner must build the same to get the same costs."""
    return StageContext(
        pp=plan.pp,
        stage=stage,
        micro_batches=plan.micro_batches,
        micro_batch_samples=global_batch_size / plan.micro_batches,
        schedule=plan.schedule,
        virtual_stages=plan.virtual_stages,
        embedding=plan.embedding,
    )


def _add(into: dict[str, float], parts: Mapping[str, object], index: int | None = None) -> None:
    for key, value in parts.items():
        v = float(value[index]) if index is not None else float(value)  # type: ignore[index, arg-type]
        into[key] = into.get(key, 0.0) + v


def aggregate_stage(model: CostModel, plan: PlanStrategy, stage: int, ctx: StageContext) -> StageTotals:
    """Sum the costs of the stage's layers (one candidate each) plus its fixed costs."""
    first = sum(plan.stage_layers[:stage])
    layers = plan.layers[first:first + plan.stage_layers[stage]]
    tot = StageTotals(in_flight=float(model.in_flight_micro_batches(ctx)))
    # a stage's layers mostly repeat one layout: each distinct boundary is priced once (a deep model's estimate
    # otherwise spent more time on its zero transitions than on its layers)
    transitions: dict[tuple[LayerStrategy, LayerStrategy], float] = {}
    for offset, strat in enumerate(layers):
        c = model.layer_costs(first + offset, [strat], ctx)
        tot.time_s += float(c.time_s[0])
        tot.step_time_s += float(c.step_time_s[0])
        tot.state_bytes += float(c.state_bytes[0])
        tot.activation_bytes += float(c.activation_bytes[0])
        tot.peak_extra_bytes = max(tot.peak_extra_bytes, float(c.peak_extra_bytes[0]))
        _add(tot.parts_s, c.parts_s, 0)
        _add(tot.step_parts_s, c.step_parts_s, 0)
        _add(tot.memory_parts_bytes, c.memory_parts_bytes, 0)
        if offset:
            pair = (layers[offset - 1], strat)
            if pair not in transitions:
                transitions[pair] = float(model.transition_s([pair[0]], [strat], ctx)[0, 0])
            t = transitions[pair]
            tot.time_s += t
            if t:
                _add(tot.parts_s, {"transition": t})
    fixed = model.stage_fixed(ctx)
    tot.time_s += fixed.time_s
    tot.step_time_s += fixed.step_time_s
    tot.state_bytes += fixed.state_bytes
    tot.activation_bytes += fixed.activation_bytes
    tot.other_bytes += fixed.other_bytes
    _add(tot.parts_s, fixed.parts_s)
    _add(tot.step_parts_s, fixed.step_parts_s)
    _add(tot.memory_parts_bytes, fixed.memory_parts_bytes)
    return tot


def _scaled(parts: Mapping[str, float], total: float) -> dict[str, float]:
    """``parts`` rescaled to sum to ``total`` (all of it goes to 'other' when no parts are known)."""
    s = sum(parts.values())
    if s <= 0:
        return {"other": total} if total else {}
    return {k: v * total / s for k, v in parts.items()}


def estimate_from_stages(
    model: CostModel,
    stages: Sequence[StageTotals],
    ctx: StageContext,
    *,
    global_batch_size: int,
    seq_length: int,
    model_flops_per_step: float,
    peak_flops_per_gpu: float,
) -> Estimate:
    """Step time, throughput, MFU, memory and breakdowns of a plan from its stage totals.

    The time breakdown sums to the step time: the slowest stage's per-micro-batch parts times the number
    of micro-batches, ``pp_bubble`` for the rest of the pipeline time, and the per-step parts of the stage
    with the longest per-step work for what the step adds on top of the pipeline.
    """
    times = [s.time_s for s in stages]
    steps = [s.step_time_s for s in stages]
    step = float(model.pipeline_step_time(times, steps, ctx))
    pipe = float(model.pipeline_step_time(times, [0.0] * len(stages), ctx))
    crit = max(range(len(stages)), key=lambda i: times[i])
    busy = ctx.micro_batches * times[crit]
    # a cost model may run the critical stage faster than its contended time (ranks sharing a host's cores
    # get an idle stage's cores: profile ``host``); its parts then shrink to the pipeline time it predicts
    breakdown = {k: v * ctx.micro_batches for k, v in _scaled(stages[crit].parts_s, min(times[crit], pipe /
                 ctx.micro_batches)).items()}
    breakdown["pp_bubble"] = breakdown.get("pp_bubble", 0.0) + max(0.0, pipe - busy)
    slow = max(range(len(stages)), key=lambda i: steps[i])
    for k, v in _scaled(stages[slow].step_parts_s, max(0.0, step - pipe)).items():
        breakdown[k] = breakdown.get(k, 0.0) + v

    mem = [s.memory_bytes for s in stages]
    mem_parts: list[dict[str, float]] = []
    for s in stages:
        parts = {k: v / GIB for k, v in s.memory_parts_bytes.items()}
        parts["activations"] = parts.get("activations", 0.0) + s.activation_bytes * s.in_flight / GIB
        if s.peak_extra_bytes:
            parts["transient"] = parts.get("transient", 0.0) + s.peak_extra_bytes / GIB
        known = sum(parts.values())
        rest = s.memory_bytes / GIB - known
        if abs(rest) > 1e-12:
            parts["other"] = parts.get("other", 0.0) + rest
        mem_parts.append(parts)

    num_gpus = model.num_gpus
    peak = max(mem)
    notes: list[str] = []
    fits = peak <= model.memory_limit_bytes * (1 + 1e-9)
    if not fits:
        worst = mem.index(peak)
        notes.append(f"stage {worst} needs {peak / GIB:.2f} GiB per GPU, over the "
                     f"{model.memory_limit_bytes / GIB:.2f} GiB limit")
    return Estimate(
        step_time_s=step,
        throughput_samples_per_s=global_batch_size / step if step > 0 else 0.0,
        tokens_per_s=global_batch_size * seq_length / step if step > 0 else 0.0,
        mfu=model_flops_per_step / (step * num_gpus * peak_flops_per_gpu) if step > 0 else 0.0,
        peak_memory_gib=peak / GIB,
        memory_gib_per_stage=[m / GIB for m in mem],
        breakdown_s=breakdown,
        memory_breakdown_gib_per_stage=mem_parts,
        stage_time_s=times,
        fits=fits,
        notes=notes,
    )


def aggregate(model: CostModel, plan: PlanStrategy, global_batch_size: int) -> tuple[list[StageTotals],
                                                                                      list[StageContext]]:
    ctxs = [stage_context(plan, s, global_batch_size) for s in range(plan.pp)]
    return [aggregate_stage(model, plan, s, ctx) for s, ctx in enumerate(ctxs)], ctxs


def evaluate_plan(
    model: CostModel,
    plan: PlanStrategy,
    *,
    global_batch_size: int,
    seq_length: int,
    model_flops_per_step: float,
    peak_flops_per_gpu: float,
) -> Estimate:
    """What ``CostModel.evaluate`` returns: the aggregation of the model's own per-layer costs."""
    stages, ctxs = aggregate(model, plan, global_batch_size)
    return estimate_from_stages(model, stages, ctxs[0], global_batch_size=global_batch_size,
                                seq_length=seq_length, model_flops_per_step=model_flops_per_step,
                                peak_flops_per_gpu=peak_flops_per_gpu)
