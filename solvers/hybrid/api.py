"""``solve`` and ``estimate`` for ``kind = "hybrid"`` (the contract's hybrid result)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

from solvers.cost_model.api import estimate as _estimate
from solvers.cost_model.base import CostModel
from solvers.cost_model.factory import make_cost_model
from solvers.errors import FieldProblem, InfeasibleError
from solvers.hybrid import baselines
from solvers.hybrid.planner import Planner, PlannerOptions, PlanResult
from solvers.hybrid.space import SpaceMode, build_space
from solvers.request import HybridRequest, parse
from solvers.specs import ModelSpec

Progress = Callable[[float, str], None]
GIB = float(2**30)


def layer_kinds(model: ModelSpec) -> list[Hashable]:
    """Layers of one kind cost the same (embedding and head are the stages' fixed terms)."""
    return ["moe" if model.is_moe_layer(i) else "dense" for i in range(model.num_layers)]


def space_mode(req: HybridRequest) -> SpaceMode:
    return "galvatron" if req.cost_model.kind == "galvatron" else "full"


def plan(req: HybridRequest, cm: CostModel, progress: Progress | None = None,
         options: PlannerOptions | None = None) -> tuple[Planner, PlanResult]:
    """Run the planner; raises InfeasibleError (with the memory any plan needs) when nothing fits."""
    space = build_space(req, space_mode(req))
    opts = options or PlannerOptions(time_limit_s=req.constraints.time_limit_s)
    planner = Planner(cm, space, layer_kinds(req.model), opts)
    try:
        return planner, planner.search(progress)
    except LookupError:
        need = planner.min_memory_bytes()
        limit = cm.memory_limit_bytes / GIB
        msg = (f"no plan fits in {limit:.1f} GiB per GPU, even with ZeRO-3, full recompute and up to "
               f"pp={max(space.pp_options())}; any plan needs at least {need / GIB:.1f} GiB per GPU"
               if need < float("inf") else "no plan satisfies the constraints (no legal strategy for this model "
               "on this cluster)")
        err = InfeasibleError([FieldProblem(("constraints", "memory_limit_gib"), msg)])
        err.min_memory_gib = need / GIB  # type: ignore[attr-defined]
        raise err from None


def solve(request: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    req: HybridRequest = parse(HybridRequest, request)
    cm = make_cost_model(req)
    planner, res = plan(req, cm, progress)
    search_s = time.perf_counter() - t0
    est = cm.evaluate(res.plan)
    if progress:
        progress(0.95, "baselines")
    t1 = time.perf_counter()
    thr = est.throughput_samples_per_s
    kinds = layer_kinds(req.model)
    base = {
        "megatron": (baselines.megatron(cm, planner.space, kinds), "no uniform Megatron-style plan fits"),
        "zero3_dp": (baselines.zero3_dp(cm, planner.space, kinds), "ZeRO-3 data parallelism does not fit"),
        "pure_dp": (baselines.pure_dp(cm, planner.space, kinds), "plain data parallelism does not fit"),
    }
    out_base = {name: baselines.report(b, cm.evaluate(b.plan) if b else None, thr, why)
                for name, (b, why) in base.items()}
    if progress:
        progress(1.0, "done")
    return {
        "estimate": est.to_dict(),
        "strategy": res.plan.to_dict(),
        "search": {
            "time_s": search_s,
            "solver": "dp",
            "configs_total": res.configs_total,
            "configs_solved": res.configs_solved,
            "configs_pruned_by_bound": res.configs_pruned_by_bound,
            "dp_runs": res.dp_runs,
            "baselines_time_s": time.perf_counter() - t1,
            "cost_model": req.cost_model.kind,
            "planner_step_time_s": res.step_time_s,
        },
        "baselines": out_base,
    }


def estimate(request: dict[str, Any]) -> dict[str, Any]:
    """What-if estimate of a given strategy: the cost model's business."""
    return _estimate(request)
