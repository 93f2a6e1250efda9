"""Plans for the framework the user runs (``constraints.target``): of the uniform plans that framework expresses,
the fastest that fits and that it runs exactly as planned.

A framework takes one layer layout for every layer, its own ZeRO stages, sequence-parallel kinds, schedules and
pipeline split rule; ``EXPORTERS[target].run_plan`` says what it runs from a plan's export. The grid here is
the request's space narrowed to what the framework's ``run_plan`` keeps unchanged (``_expressible``), split
and embedded as the framework does. Its plans are walked fastest first; the first whose run settles on a plan
the framework runs unchanged (a fixed point of ``run_plan``, reached by letting the framework make its own
choices, each at least as fast as the last) and that fits is the answer. Every plan of the grid is a fixed
point by construction, so the answer is never slower than the grid's best: the best the target runs in this
space, its own lower bound (no claim about the whole space).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, get_args

from solvers.cost_model.base import CostModel
from solvers.exports import EXPORTERS
from solvers.exports.layout import front_loaded_split
from solvers.hybrid.baselines import Baseline, megatron_embedding, megatron_split, uniform_plans
from solvers.hybrid.space import PipelineConfig, SearchSpace
from solvers.specs import Target
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy

TARGETS: tuple[Target, ...] = get_args(Target)
FRAMEWORK_TARGETS: tuple[Target, ...] = TARGETS[1:]
# a run that does not settle within this many of the framework's choices is left for the next plan of the grid
_MAX_CHOICES = 8


@dataclass(frozen=True)
class TargetPlan:
    plan: PlanStrategy
    step_time_s: float  # the grid's (vectorised) step; the result re-estimates the plan
    grid_plans: int  # fitting plans of the grid looked at
    grid_best_s: float  # the fastest fitting plan of the grid


def _expressible(target: Target, x: LayerStrategy, pp: int) -> bool:
    """Whether ``target``'s run keeps layout ``x`` as it is (``run_plan`` of each export module)."""
    sharded = x.dp * x.cp > 1
    if target == "megatron":  # Ulysses runs as Megatron SP, ZeRO-2/3 as the distributed optimizer
        return x.sp != "ulysses" and (x.zero <= 1 or not sharded)
    if target == "torchtitan":  # TP always with SP; FSDP is ZeRO-3 alone, ZeRO-1 pipelined
        return x.sp == ("megatron" if x.tp > 1 else None) and (
            not sharded or x.zero in (0, 1 if pp > 1 else 3))
    # deepspeed: AutoTP without SP or Ulysses, no ring CP; its pipeline engine takes ZeRO-0/1, and its pipeline
    # topology (PipeDataParallelTopology: pipe x data [x AutoTP]) has no sequence-parallel axis, so with pipeline
    # stages DeepSpeed counts a Ulysses group as data parallel and refuses the batch sizes
    if pp > 1 and (x.sp == "ulysses" or (x.zero > 1 and sharded)):
        return False
    # ... and without pipeline stages, no mpu: DeepSpeed counts AutoTP ranks as data-parallel replicas, so its
    # export runs unpipelined TP as Ulysses of the same degree (not this layout)
    if pp == 1 and x.sp is None and x.tp > 1:
        return False
    # its activation checkpointing is of whole layers: selective recomputation runs as full
    return x.cp == 1 and x.sp != "megatron" and x.recompute != "selective"


def _schedules(target: Target) -> tuple[str, ...]:
    return {"megatron": ("1f1b", "interleaved"), "torchtitan": ("gpipe", "1f1b", "interleaved"),
            "deepspeed": ("gpipe", "1f1b")}[target]


def why_none(target: Target, space: SearchSpace, cm: CostModel) -> str:
    """Why ``solve_target`` found no plan: the schedules asked for, else memory under the constraints."""
    if not set(space.schedules) & set(_schedules(target)):
        return (f"{target} runs no {' or '.join(space.schedules)} schedule (it runs {', '.join(_schedules(target))}):"
                " choose another constraints.schedule or target")
    if not _grid(target, space)[1]:
        return (f"the constraints leave {target} no layer layout it runs (its ZeRO stages, sequence-parallel kinds "
                "and parallelisms under constraints.zero, sp, max_tp, max_cp)")
    gib = cm.memory_limit_bytes / 2**30
    return (f"no uniform plan {target} runs fits in {gib:.1f} GiB per GPU under the constraints; target "
            '"paraplan" searches per-layer plans too')


def _deepspeed_split(n_layers: int, cfg: PipelineConfig) -> tuple[int, ...]:
    """DeepSpeed's partition_method='uniform', as its export writes it."""
    return front_loaded_split(n_layers, cfg.pp)


def _deepspeed_embedding(x: LayerStrategy) -> EmbeddingStrategy:
    """Replicated over the Ulysses group, split over AutoTP's."""
    uly = x.sp == "ulysses"
    return EmbeddingStrategy(tp=1 if uly else x.tp, dp=x.dp * (x.tp if uly else 1), zero=x.zero)


def _grid(target: Target, space: SearchSpace) -> tuple[list[PipelineConfig], list[LayerStrategy]]:
    configs = [c for c in space.pipeline_configs() if c.schedule in _schedules(target)]
    strategies: list[LayerStrategy] = []
    for pp in space.pp_options():
        g = space.num_gpus // pp
        strategies += [x for x in space.layer_candidates(g, space.global_batch_size) if _expressible(target, x, pp)]
    return configs, list(dict.fromkeys(strategies))


def _settled(run_plan: Callable[[PlanStrategy], PlanStrategy | None], plan: PlanStrategy) -> PlanStrategy | None:
    """The plan the framework's run of ``plan`` settles on (``run_plan`` of it is itself); None if none soon."""
    for _ in range(_MAX_CHOICES):
        run = run_plan(plan)
        if run is None:
            return None
        if run == plan:
            return plan
        plan = run
    return None


def solve_target(target: Target, cm: CostModel, space: SearchSpace, kinds: Sequence[Hashable],
                 expert_layers: Sequence[bool], request: dict[str, Any]) -> TargetPlan | None:
    """The fastest plan ``target`` runs exactly as planned, of its grid in ``space``; None where none fits."""
    exporter = EXPORTERS[target]
    configs, strategies = _grid(target, space)
    split = _deepspeed_split if target == "deepspeed" else megatron_split
    embedding = _deepspeed_embedding if target == "deepspeed" else megatron_embedding
    moe = expert_layers if any(expert_layers) else None
    found = sorted(uniform_plans(cm, space, kinds, configs, strategies, f"uniform-grid:{target}", moe,
                                 split=split, embedding=embedding), key=lambda b: b.step_time_s)
    if not found:
        return None
    best: Baseline | None = None
    looked = 0
    for b in found:
        if best is not None and b.step_time_s >= best.step_time_s:
            break  # the framework's choices only make a run faster: no later plan settles below the best
        looked += 1
        plan = _settled(lambda p: exporter.run_plan(p, expert_layers, request), b.plan)
        if plan is None:
            continue
        est = cm.evaluate(plan)
        if est.fits and math.isfinite(est.step_time_s) and (best is None or est.step_time_s < best.step_time_s):
            best = Baseline(b.name, plan, est.step_time_s)
    if best is None:
        return None
    return TargetPlan(best.plan, best.step_time_s, looked, found[0].step_time_s)


__all__ = ["FRAMEWORK_TARGETS", "TARGETS", "Target", "TargetPlan", "solve_target", "why_none"]
