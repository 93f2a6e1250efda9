"""What a plan on a cluster of groups (``cluster.groups``) reports beside the homogeneous result: where each stage
runs, and the two plans a user of a mixed fleet would otherwise run: the best plan on the fastest group alone
(leaving the slower GPUs idle) and the best uniform Megatron-style plan chosen blind to the types (as if every GPU
were the groups' GPU with the least memory, stages split evenly), priced on the real cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from solvers.cost_model.aggregate import GIB
from solvers.cost_model.factory import make_cost_model
from solvers.cost_model.hetero import HeteroCostModel
from solvers.cost_model.matmul import linear_gemm_flops
from solvers.documents.hybrid import HeteroDoc, HybridResult
from solvers.errors import SpecError
from solvers.hybrid import baselines
from solvers.hybrid.cached import CachedStages
from solvers.hybrid.space import build_space, expert_layers, layer_kinds, space_mode
from solvers.request import HybridRequest, parse
from solvers.specs import NodeGroup

Solve = Callable[[dict[str, Any]], HybridResult]


def homogeneous(request: dict[str, Any], gpu: dict[str, Any], nodes: int, gpus_per_node: int) -> dict[str, Any]:
    """``request`` on a cluster of one GPU type."""
    return {**request, "cluster": {"gpu": gpu, "nodes": nodes, "gpus_per_node": gpus_per_node}}


def fastest(groups: tuple[NodeGroup, ...], precision: Any) -> int:
    """The group whose GPUs the cost model prices fastest: the highest peak at the request's precision times the
    share of it their GEMMs reach (``matmul.linear_gemm_flops``; the larger group on a tie). By datasheet peak alone an
    MI300X (1307 TFLOP/s bf16, 51 % reached) would outrank an H100 (989, 80 % reached)."""
    return max(range(len(groups)), key=lambda i: (linear_gemm_flops(groups[i].gpu, precision), groups[i].num_gpus))


def report(result: HybridResult, req: HybridRequest, request: dict[str, Any], cm: HeteroCostModel,
           solve: Solve) -> HeteroDoc:
    """The result's ``hetero`` document (module docstring); ``solve`` plans a homogeneous request."""
    plan, thr = result.plan(), result.estimate.throughput_samples_per_s
    stages = cm.stages(plan.pp)
    assert req.cluster.groups is not None
    groups = req.cluster.groups
    placement = [{"stage": s, "groups": list(st.groups), "gpus": [groups[g].gpu.name for g in st.groups],
                  "layers": plan.stage_layers[s], "memory_limit_gib": cm.stage_limit_bytes(plan.pp, s) / GIB}
                 for s, st in enumerate(stages)]
    return HeteroDoc.model_validate({"placement": placement, "baselines": {
        "fastest_group": _fastest_group(req, request, thr, solve),
        "type_oblivious": _type_oblivious(req, request, cm, thr)}})


def _fastest_group(req: HybridRequest, request: dict[str, Any], thr: float, solve: Solve) -> dict[str, Any]:
    assert req.cluster.groups is not None
    g = req.cluster.groups[fastest(req.cluster.groups, req.training.precision)]
    alone = homogeneous(request, g.gpu.model_dump(), g.nodes, g.gpus_per_node)
    try:
        res = solve(alone)
    except SpecError as err:  # infeasible there (memory, or no split of the batch over its GPUs)
        return {"fits": False, "note": f"no plan on the {g.num_gpus} {g.gpu.name} alone: {err.problems[0].msg}"}
    other = res.estimate.throughput_samples_per_s
    return {"fits": res.estimate.fits, "note": f"the best plan on the {g.num_gpus} {g.gpu.name} GPUs alone",
            "strategy": res.strategy.model_dump(), "estimate": res.estimate.to_json(),
            "throughput_samples_per_s": other, "gain": thr / other - 1.0 if other > 0 else None}


def _type_oblivious(req: HybridRequest, request: dict[str, Any], cm: HeteroCostModel, thr: float
                    ) -> dict[str, Any]:
    c = req.cluster
    blind: HybridRequest = parse(HybridRequest, homogeneous(request, c.gpu.model_dump(), c.nodes, c.gpus_per_node))
    chosen = baselines.megatron(CachedStages(make_cost_model(blind)), build_space(blind, space_mode(blind)),
                                layer_kinds(blind.model), expert_layers(blind.model))
    if chosen is None:
        return {"fits": False, "note": f"no uniform plan fits {c.num_gpus} {c.gpu.name} GPUs"}
    est = cm.evaluate(chosen.plan)
    rep = baselines.report(chosen, est, thr, "", 0.0, req.constraints)
    return {**rep, "note": f"the best uniform plan for {c.num_gpus} {c.gpu.name} GPUs (blind to the types), "
                           "run on the real cluster"}
