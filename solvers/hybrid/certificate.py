"""The optimality certificate of a hybrid plan: a step time no plan of the search space beats.

Against the plan found it is the gap the search's heuristics may leave (the DP's memory bins, the partition
climb, the capped embedding variants); against a baseline, the most any plan could gain over it. Only true
bounds count (``Planner``'s compute floor, joint, mean-stage, fill, single-stage and chain bounds, and the relaxed
bound where it enumerates every partition), each over every embedding/LM-head strategy; a configuration with none
of them bounds at 0, and so does the whole space. The certificate also solves every configuration the search
passed by on a heuristic ordering bound that its true bounds cannot rule out (``certify``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from solvers.hybrid import partition, stage_costs
from solvers.hybrid.planner import Planner
from solvers.hybrid.space import PipelineConfig


@dataclass
class Certificate:
    bound_s: float  # no plan of the space is faster (at most the ceiling passed)
    # a plan faster than the ceiling, found by solving configurations the search left: (costs, partition, step
    # time), the arguments of ``Planner.finish``
    better: tuple[stage_costs.ConfigCosts, tuple[int, ...], float] | None = None
    repaired: int = 0  # configurations solved for it
    time_limited: bool = False  # the time limit stopped the repair before every such configuration was solved


def certified_bound(planner: Planner, ceiling: float = math.inf) -> float:
    """The least, over every pipeline configuration, of its true lower bounds. ``ceiling``: configurations
    are not refined once their floor reaches it (pass the plan's step time: the answer is then
    min(ceiling, bound))."""
    return certify(planner, ceiling, repair=False).bound_s


def certify(planner: Planner, ceiling: float = math.inf, repair: bool = True) -> Certificate:
    """The least true lower bound over the space and, with ``repair``, the plans the search missed.

    The search orders and stops on bounds that are heuristics for deep pipelines (the relaxation's best
    partition among a few, where there are too many to enumerate): a configuration it never solved may hold a
    faster plan. Here every configuration whose true bound lies below the best plan and that the search did
    not solve is solved, in bound order, so the gap left is the bounds' and the solver's, never the ordering's.

    Passes: every configuration's cheap bounds, then, in their order, the refined ones (the stage's
    transient-memory levels told apart) of those still below the least refined bound so far, or unsolved and
    below the best plan: a cheap bound is never above its refined one, so the rest can neither lower the
    answer nor hold a faster plan. Where the gap still exceeds ``deep_bound_gap``, a third pass (``_deep``)."""
    space = planner.space
    best = ceiling
    cheap: list[tuple[float, int, PipelineConfig, float, list[tuple[float, stage_costs.ConfigCosts]]]] = []
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
            cheap.append((lb, len(cheap), cfg, floor, ccs))
    levels = planner.opt.bound_transient_levels
    refined = best
    out = Certificate(best)
    cheap.sort(key=lambda x: x[:2])
    for lb, _, cfg, floor, ccs in cheap:
        if lb >= best:
            break
        unsolved = repair and not planner.solved.issuperset(planner.embedding_variants(cfg))
        if lb >= refined and not unsolved:
            continue
        enough = best if unsolved else refined  # (a configuration to solve needs its bound against the plan)
        r = lb if levels <= 1 else _refined(planner, ccs, floor, levels, enough)
        refined = min(refined, r)
        if unsolved and r < best:
            best = _repair(planner, cfg, floor, levels, best, out)
    out.bound_s = min(refined, best)
    if levels > 1 and out.bound_s * (1 + planner.opt.deep_bound_gap) < best and not planner.over_time():
        out.bound_s = max(out.bound_s, _deep(planner, cheap, best, levels))
    return out


def _deep(planner: Planner, cheap: list[tuple[float, int, PipelineConfig, float,
                                              list[tuple[float, stage_costs.ConfigCosts]]]],
          best: float, levels: int) -> float:
    """The refined pass again with stages of up to ``bound_whole_layers_deep`` layers by whole candidates (the
    LP's mix of two candidates per stage is what is left loose on the plans measured), a stage mixing layouts
    charged its least re-layout; costly, so only where the gap shows. Returns its bound (at most ``best``)."""
    if planner.opt.bound_whole_layers_deep <= planner.opt.bound_whole_layers:
        return 0.0
    opt, planner.opt = planner.opt, replace(planner.opt, bound_whole_layers=planner.opt.bound_whole_layers_deep,
                                           bound_layout_switch=True)
    try:
        again = best
        for lb, _, _, floor, ccs in cheap:
            if lb >= again:
                break
            again = min(again, _refined(planner, ccs, floor, levels, again))
    finally:
        planner.opt = opt
    return again


def _refined(planner: Planner, ccs: list[tuple[float, stage_costs.ConfigCosts]], floor: float, levels: int,
             enough: float) -> float:
    """A configuration's refined bound from its cheap ones (per embedding variant, or their relaxation)."""
    return min(max(b, _bounds(planner, c, floor, levels, enough)) if b < enough else b for b, c in ccs)


def _repair(planner: Planner, cfg: PipelineConfig, floor: float, levels: int, best: float, out: Certificate
            ) -> float:
    """Solve each of ``cfg``'s embedding variants the search left whose own bound is below ``best``; a faster
    plan goes to ``out.better``. Returns the best step time."""
    for var in planner.embedding_variants(cfg):
        cc = None if var in planner.solved else planner.config_costs(var)
        if cc is None or _bounds(planner, cc, floor, levels, best) >= best:
            continue
        if planner.over_time():
            out.time_limited = True
            break
        v, parts = planner.solve_config(cc)
        out.repaired += 1
        if v < best:
            best, out.better = v, (cc, parts, v)
    return best


def _bounds(planner: Planner, cc: stage_costs.ConfigCosts, floor: float, levels: int, enough: float) -> float:
    """The configuration's best true bound; the costlier ones only while the bound is below ``enough`` (a
    configuration bounded at or above the least bound so far cannot lower it)."""
    single = levels if levels <= 1 else max(levels, planner.opt.bound_single_stage_levels)  # one cheap relaxation
    lb = max(floor, planner.joint_bound(cc, levels), planner.single_stage_bound(cc, levels=single),
             planner.chain_bound(cc, levels=levels, enough=enough))
    if lb < enough:
        lb = max(lb, planner.mean_stage_bound(cc, levels))
    if lb < enough and partition.compositions(len(planner.kinds), cc.config.pp) \
            <= planner.opt.exhaustive_partition_limit:
        lb = max(lb, planner.lower_bound(cc, levels))
    if lb < enough and levels > 1:  # the costliest (a min-sum partition per cap): refined configurations only
        lb = max(lb, planner.fill_bound(cc, levels, enough=enough))
    return lb
