"""The optimality certificate of a hybrid plan: a step time no plan of the search space beats.

Against the plan found it is the gap the search's heuristics may leave (the DP's memory bins, the partition
climb, the capped embedding variants); against a baseline, the most any plan could gain over it. Only true
bounds count (``Planner``'s compute floor, joint, mean-stage, fill, single-stage and chain bounds, and the relaxed
bound where it enumerates every partition), each over every embedding/LM-head strategy; a configuration with none
of them bounds at 0, and so does the whole space.
"""

from __future__ import annotations

import math
from dataclasses import replace

from solvers.hybrid import partition, stage_costs
from solvers.hybrid.planner import Planner


def certified_bound(planner: Planner, ceiling: float = math.inf) -> float:
    """The least, over every pipeline configuration, of its true lower bounds. ``ceiling``: configurations
    are not refined once their floor reaches it (pass the plan's step time: the answer is then
    min(ceiling, bound)).

    Two passes: every configuration's cheap bounds, then, in their order, the refined ones (the stage's
    transient-memory levels told apart) of those still below the least refined bound so far: a cheap bound is
    never above its refined one, so the rest cannot lower the answer."""
    space = planner.space
    best = ceiling
    cheap: list[tuple[float, int, float, list[tuple[float, stage_costs.ConfigCosts]]]] = []
    for cfg in space.pipeline_configs():
        floor = planner.compute_floor(cfg)
        if floor >= best:
            continue
        variants = [replace(cfg, embedding=e) for e in space.embedding_options(space.num_gpus // cfg.pp)] or [cfg]
        cc = planner.embedding_relaxation(variants) if len(variants) > 1 else planner.config_costs(variants[0])
        if cc is None:
            continue  # no candidate fits this configuration: it holds no plan
        ccs = [(_bounds(planner, cc, floor, 1, best), cc)]
        if ccs[0][0] < best and len(variants) > 1:
            # the relaxation pairs one strategy's least fixed time with another's least memory: bound each
            # embedding strategy on its own (never lower, often tighter)
            ccs = [(_bounds(planner, c, floor, 1, best), c) for c in map(planner.config_costs, variants)
                   if c is not None]
        lb = min((b for b, _ in ccs), default=math.inf)
        if lb < best:
            cheap.append((lb, len(cheap), floor, ccs))
    levels = planner.opt.bound_transient_levels
    refined = best
    for lb, _, floor, ccs in sorted(cheap, key=lambda x: x[:2]):
        if lb >= refined:
            break
        if levels <= 1:
            refined = lb
            continue
        refined = min(refined, min(max(b, _bounds(planner, c, floor, levels, refined)) if b < refined else b
                                   for b, c in ccs))
    return refined


def _bounds(planner: Planner, cc: stage_costs.ConfigCosts, floor: float, levels: int, enough: float) -> float:
    """The configuration's best true bound; the costlier ones only while the bound is below ``enough`` (a
    configuration bounded at or above the least bound so far cannot lower it)."""
    single = levels if levels <= 1 else max(levels, planner.opt.bound_single_stage_levels)  # one cheap relaxation
    lb = max(floor, planner.joint_bound(cc, levels), planner.single_stage_bound(cc, levels=single),
             planner.chain_bound(cc, levels=levels))
    if lb < enough:
        lb = max(lb, planner.mean_stage_bound(cc, levels))
    if lb < enough and partition.compositions(len(planner.kinds), cc.config.pp) \
            <= planner.opt.exhaustive_partition_limit:
        lb = max(lb, planner.lower_bound(cc, levels))
    if lb < enough and levels > 1:  # the costliest (a min-sum partition per cap): refined configurations only
        lb = max(lb, planner.fill_bound(cc, levels))
    return lb
