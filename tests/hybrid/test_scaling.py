"""Search time stays bounded as models get deep (a 128-layer request once planned for minutes).

CPU time of this process, not wall time: the test machine is shared. The limits are CPU budgets scaled to the
machine's speed (tests/cpu_budget.py): several times what the search takes (about 1-3 s each on the reference
VM), and far below the minutes the regressions took."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from solvers.cost_model.factory import make_cost_model
from solvers.errors import InfeasibleError
from solvers.hybrid.api import layer_kinds
from solvers.hybrid.planner import Planner, PlannerOptions
from solvers.hybrid.space import build_space
from solvers.hybrid.stage_costs import stage_context
from solvers.request import HybridRequest, parse
from tests.bench_module import load_bench
from tests.contract_json import solve_hybrid as solve
from tests.cpu_budget import cpu_budget

DEEP: dict[str, Any] = {  # the dashboard's big request (bench/screenshots.py)
    "kind": "hybrid", "model": {"preset": "llama2-70b", "num_layers": 128},
    "cluster": {"gpu": "H100-SXM", "nodes": 8, "gpus_per_node": 8},
    "training": {"global_batch_size": 256, "seq_length": 4096},
}
LIMIT_CPU_S = 8.0  # on the reference VM; cpu_budget scales it
# The 100,000-GPU plan with its certificate takes about 3.5 s there: a guard against a blow-up, not the issue's
# figure, which bench/hybrid.py --scale quotes
LIMIT_100K_CPU_S = 10.0
# bench/hybrid.py --sizing's 18-point request: about 6 s of CPU (its planning processes' included) on the
# reference VM; a guard against a blow-up, not the figure (its wall time, which the bench quotes)
LIMIT_SIZING_CPU_S = 25.0


def _cpu(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    c0 = time.process_time()
    out = fn(*args)
    return time.process_time() - c0, out


def test_128_layer_model_plans_in_bounded_time() -> None:
    cpu, out = _cpu(solve, DEEP)
    assert cpu < cpu_budget(LIMIT_CPU_S)
    assert len(out["strategy"]["layers"]) == 128 and out["estimate"]["fits"]
    assert out["baselines"]["megatron"]["gain"] >= -1e-9


def test_128_layer_infeasible_request_answers_in_bounded_time() -> None:
    """The minimum-memory message partitions every configuration: once O(pp x layers²) Python, 20 s CPU."""
    req = {**DEEP, "training": {"global_batch_size": 256, "seq_length": 8192}, "constraints": {"memory_limit_gib": 24}}
    c0 = time.process_time()
    with pytest.raises(InfeasibleError) as err:
        solve(req)
    assert time.process_time() - c0 < cpu_budget(LIMIT_CPU_S)
    assert err.value.min_memory_gib > 24  # type: ignore[attr-defined]


def test_mixed_layer_kinds_plan_without_hitting_the_time_limit() -> None:
    """MoE every other layer: one DP table per stage and phase (not per start layer), interchangeable
    layout classes merged (not one per expert-parallel degree), Lagrangian bounds for mixed kinds. At 32
    layers: was 41 s CPU, then 12 s and time-limited; at 64 layers 10-15 s before the bounds, now ~1 s."""
    req = {**DEEP, "model": {"preset": "mixtral-8x7b", "num_layers": 64,
                             "moe": {"num_experts": 8, "top_k": 2, "moe_layer_frequency": 2}},
           "training": {"global_batch_size": 64, "seq_length": 4096}}
    cpu, out = _cpu(solve, req)
    assert cpu < cpu_budget(LIMIT_CPU_S) and not out["search"]["time_limited"]
    assert out["search"]["plan_from"] == "dp" and out["baselines"]["megatron"]["gain"] >= -1e-9


def test_bounds_never_exceed_the_solved_configuration_with_mixed_kinds() -> None:
    """The analytic model, MoE every other layer (the Lagrangian bound per phase) on 8 GPUs: every pipeline
    configuration's bounds stay at or below what the DP finds for it."""
    req = parse(HybridRequest, {**DEEP, "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
                                "model": {"preset": "mixtral-8x7b", "num_layers": 8,
                                          "moe": {"num_experts": 8, "top_k": 2, "moe_layer_frequency": 2}},
                                "training": {"global_batch_size": 16, "seq_length": 4096}})
    planner = Planner(make_cost_model(req), build_space(req), layer_kinds(req.model))
    assert planner.linear and planner.period == 2
    checked = 0
    for cfg in build_space(req).pipeline_configs():
        cc = planner.config_costs(cfg)
        if cc is None:
            continue
        step, _ = planner.solve_config(cc)
        if math.isfinite(step):
            assert planner.lower_bound(cc) <= step * (1 + 1e-12)
            assert planner.joint_bound(cc) <= step * (1 + 1e-12)
            assert planner.mean_stage_bound(cc) <= step * (1 + 1e-12)
            assert planner.fill_bound(cc) <= step * (1 + 1e-12)
            assert planner.compute_floor(cfg) <= step * (1 + 1e-12)
            checked += 1
    assert checked >= 10


def test_polishing_the_chosen_configuration_with_finer_bins_only_helps() -> None:
    """Mixed kinds plan on the binned DP alone; re-solving the chosen stages with 4x finer bins recovers
    what rounding lost (at 32 layers: ~0.3 %), and the polished plan still fits (the cost model says so).
    With dropout and unfused attention's scores the layers' activations make the memory bind (dropout-free or fused,
    this case is not memory-bound); the space is the case's as found (cp up to seq / 2048)."""
    req = {**DEEP, "model": {"preset": "mixtral-8x7b", "num_layers": 32, "attention_dropout": 0.1,
                             "hidden_dropout": 0.1,
                             "moe": {"num_experts": 8, "top_k": 2, "moe_layer_frequency": 2}},
           "training": {"global_batch_size": 64, "seq_length": 4096, "stack": {"attention": "unfused"}},
           "constraints": {"max_cp": 2}}
    coarse = solve(req, options=PlannerOptions(time_limit_s=60, polish_factor=1))
    fine = solve(req, options=PlannerOptions(time_limit_s=60))
    assert fine["estimate"]["fits"]
    assert fine["estimate"]["step_time_s"] < coarse["estimate"]["step_time_s"]
    assert fine["estimate"]["step_time_s"] == pytest.approx(fine["search"]["planner_step_time_s"], rel=1e-9)


def test_embedding_variants_bounded_together_bound_each_and_the_solved_step() -> None:
    """A configuration's embedding variants are first bounded together (edge stages' fixed terms at their
    least over the variants); that bound must not exceed any variant's own bound or solved step time."""
    req = parse(HybridRequest, {"kind": "hybrid", "model": {"preset": "gpt3-175b", "num_layers": 8},
                                "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
                                "training": {"global_batch_size": 64, "seq_length": 2048}})
    planner = Planner(make_cost_model(req), build_space(req), layer_kinds(req.model))
    groups = 0
    for cfg in build_space(req).pipeline_configs():
        variants = planner.embedding_variants(cfg)
        group = planner.embedding_relaxation(variants) if len(variants) > 1 else None
        if group is None:
            continue
        together = planner.lower_bound(group)
        distinct = set()
        for var in variants:
            cc = planner.config_costs(var)
            assert cc is not None
            own = planner.lower_bound(cc)
            distinct.add(round(own, 9))
            assert together <= own * (1 + 1e-12)
            step, _ = planner.solve_config(cc)
            assert together <= step * (1 + 1e-12)
        groups += len(distinct) > 1
    assert groups >= 5  # variants that the bounds tell apart


_GALVATRON = Path(__file__).resolve().parents[2] / "bench" / "data" / "galvatron"


@pytest.mark.parametrize("request_doc", [
    {"model": {"preset": "gpt3-175b", "num_layers": 8}, "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
     "training": {"global_batch_size": 64, "seq_length": 2048}},
    {"model": {"preset": "mixtral-8x7b", "num_layers": 8}, "cluster": {"gpu": "H100-SXM", "nodes": 4},
     "training": {"global_batch_size": 64, "seq_length": 4096}},
    {"model": {"preset": "llama2-7b"}, "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
     "training": {"global_batch_size": 16, "seq_length": 2048}, "constraints": {"memory_limit_gib": 36},
     "cost_model": {"kind": "galvatron", "profiles_dir": str(_GALVATRON / "profiles"),
                    "hardware_dir": str(_GALVATRON / "hardware")}},
], ids=["analytic", "analytic-moe", "galvatron"])
def test_the_embedding_relaxation_is_every_variants_least_fixed_terms_on_every_stage(
        request_doc: dict[str, Any]) -> None:
    """The relaxation asks the cost model about the first and last stage of each variant alone, the stages the
    embedding lives on: every stage's terms must still be the least over the variants, each variant asked about
    every stage (a middle stage's terms that moved with the embedding would make the bound too high)."""
    req = parse(HybridRequest, {"kind": "hybrid", **request_doc})
    space = build_space(req)
    cm = make_cost_model(req)
    planner = Planner(cm, space, layer_kinds(req.model))
    gbs, checked = space.global_batch_size, 0
    for cfg in space.pipeline_configs():
        variants = planner.embedding_variants(cfg)
        group = planner.embedding_relaxation(variants) if len(variants) > 1 else None
        if group is None:
            continue
        for s, st in enumerate(group.stages):
            every = [cm.stage_fixed(stage_context(v, s, gbs)) for v in variants]
            for term in ("time_s", "step_time_s", "state_bytes", "activation_bytes", "other_bytes"):
                assert getattr(st.fixed, term) == min(getattr(f, term) for f in every), (cfg, s, term)
        checked += cfg.pp > 2
    assert checked >= 3  # configurations with middle stages


def test_a_sizing_front_over_56_clusters_stays_within_its_cpu_guard() -> None:
    """The sizing request of bench/hybrid.py --sizing (llama3-70b on 28 node counts of H100 and H200, a front of
    18 points): every size is planned, pruned or beaten, and the CPU time of the sizing, its planning
    processes included, stays within a guard (see LIMIT_SIZING_CPU_S)."""
    bench = load_bench("hybrid.py")
    request = bench.sizing_request(bench.SIZING_CASES[0][1])
    sized = solve(request)["sizing"]
    assert sized["clusters_tried"] == 56 and not sized["clusters_without_plan"]
    assert sized["cpu_s"] < cpu_budget(LIMIT_SIZING_CPU_S), sized


def test_a_100000_gpu_plan_is_certified_within_one_percent() -> None:
    """llama3-405b on 12,500 x 8 H100s (100,000 GPUs, no power of two): the plan mixes tp4 cp4 layers with a tp8
    cp2 one on its tightest stage, and the certificate charges such a stage its re-layout (without it the gap
    read 2.14 %). Its CPU time stays within a guard (see LIMIT_100K_CPU_S)."""
    request = {"kind": "hybrid", "model": {"preset": "llama3-405b"}, "cluster": {"gpu": "H100-SXM", "nodes": 12_500},
               "training": {"global_batch_size": 50_000, "seq_length": 8192}}
    cpu, out = _cpu(solve, request)
    assert out["search"]["optimality_gap"] <= 0.01, out["search"]
    assert cpu < cpu_budget(LIMIT_100K_CPU_S)
