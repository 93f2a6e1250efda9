"""The optimality certificate of a hybrid plan: a step time no plan of the search space beats.

Against the plan found it is the gap the search's heuristics may leave (the DP's memory bins, the partition
climb, the capped embedding variants); against a baseline, the most any plan could gain over it. Only true
bounds count (``Planner``'s compute floor, joint, single-stage and chain bounds, and the relaxed bound where it
enumerates every partition), each over every embedding/LM-head strategy; a configuration with none of them
bounds at 0, and so does the whole space.
"""

from __future__ import annotations

import math
from dataclasses import replace

from solvers.hybrid import partition, stage_costs
from solvers.hybrid.planner import Planner


def certified_bound(planner: Planner, ceiling: float = math.inf) -> float:
    """The least, over every pipeline configuration, of its true lower bounds. ``ceiling``: configurations
    are not refined once their floor reaches it (pass the plan's step time: the answer is then
    min(ceiling, bound))."""
    space = planner.space
    best = ceiling
    for cfg in space.pipeline_configs():
        floor = planner.compute_floor(cfg)
        if floor >= best:
            continue
        variants = [replace(cfg, embedding=e) for e in space.embedding_options(space.num_gpus // cfg.pp)] or [cfg]
        cc = planner.embedding_relaxation(variants) if len(variants) > 1 else planner.config_costs(variants[0])
        if cc is None:
            continue  # no candidate fits this configuration: it holds no plan
        lb = config_bound(planner, cc, floor, best)
        if lb < best and len(variants) > 1:
            # the relaxation pairs one strategy's least fixed time with another's least memory: bound each
            # embedding strategy on its own (never lower, often tighter)
            lb = min((config_bound(planner, c, floor, best) for c in map(planner.config_costs, variants)
                      if c is not None), default=math.inf)
        best = min(best, lb)
    return best


def config_bound(planner: Planner, cc: stage_costs.ConfigCosts, floor: float, below: float = math.inf) -> float:
    """The largest of the configuration's true bounds (``floor``: its compute floor, already known). Where
    the cheap relaxation leaves it under ``below`` (it could still hold a better plan), it is bounded again
    with the stage's transient-memory levels told apart."""
    lb = _bounds(planner, cc, floor, 1)
    levels = planner.opt.bound_transient_levels
    return max(lb, _bounds(planner, cc, floor, levels)) if lb < below and levels > 1 else lb


def _bounds(planner: Planner, cc: stage_costs.ConfigCosts, floor: float, levels: int) -> float:
    lb = max(floor, planner.joint_bound(cc, levels), planner.single_stage_bound(cc, levels=levels),
             planner.chain_bound(cc, levels=levels))
    if partition.compositions(len(planner.kinds), cc.config.pp) <= planner.opt.exhaustive_partition_limit:
        lb = max(lb, planner.lower_bound(cc, levels))
    return lb
