"""The layout a framework that takes one strategy for all layers runs: the plan's dominant layer strategy, the
experts' layout on the MoE layers, and the splits of layers into stages or model parts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from solvers.cost_model.pipeline import front_loaded_split
from solvers.hybrid.baselines import without_experts
from solvers.strategy import LayerStrategy, PlanStrategy, Recompute

__all__ = ["dominant", "expert_layout", "front_loaded_split", "micro_batch_size", "run_expert_tp", "stage",
           "with_experts"]

# ties between equally common layouts go to the one needing the least memory
_ZERO_COST = {3: 0, 2: 1, 1: 2, 0: 3}
_RC_COST = {"full": 0, "selective": 1, "none": 2}


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


def with_experts(plan: PlanStrategy, base: LayerStrategy, expert_layers: Sequence[bool] | None,
                 recompute: Sequence[Recompute] | None = None) -> tuple[LayerStrategy, ...]:
    """``base`` on every layer, with the plan's dominant expert layout on the MoE layers (``expert_layers``,
    else those of the plan that shard experts) and, if given, each layer's recomputation."""
    ep, _ = expert_layout(plan)
    etp = run_expert_tp(plan, base)
    moe = expert_layers or [x.ep > 1 or x.etp is not None for x in plan.layers]
    return tuple(replace(base, ep=ep if m else 1, etp=etp if m else None,
                         recompute=recompute[i] if recompute else base.recompute) for i, m in enumerate(moe))


def stage(plan: PlanStrategy, index: int) -> tuple[LayerStrategy, ...]:
    """The layers of pipeline stage ``index``."""
    start = sum(plan.stage_layers[:index])
    return plan.layers[start:start + plan.stage_layers[index]]


def micro_batch_size(plan: PlanStrategy, batch: int) -> int:
    """Samples per micro-batch on each data-parallel rank of the dominant layout (at least one)."""
    return max(batch // plan.micro_batches // dominant(plan).dp, 1)
