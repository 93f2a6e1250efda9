"""Exports of a hybrid plan: every format from a per-layer (non-uniform) plan, approximations stated."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from typing import Any

import pytest

from solvers.api import estimate, solve
from solvers.errors import SpecError
from solvers.formats.galvatron import plan_from_galvatron_config
from solvers.hybrid.export import (
    deepspeed_run_plan,
    export,
    megatron_recompute,
    megatron_recompute_options,
    megatron_run_plan,
    torchtitan_run_plan,
)
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy

REQUEST: dict[str, Any] = {
    "kind": "hybrid", "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
    "training": {"global_batch_size": 64, "seq_length": 2048},
}
A = LayerStrategy(tp=2, dp=4, sp="megatron", zero=3, recompute="full")
B = LayerStrategy(tp=2, dp=4, sp="megatron", zero=2, recompute="none")
PLAN = PlanStrategy(pp=2, micro_batches=8, layers=(A,) * 10 + (B,) * 22, stage_layers=(14, 18),
                    embedding=EmbeddingStrategy(tp=2, dp=4, zero=3))
RESULT = {"strategy": PLAN.to_dict(),
          "estimate": {"step_time_s": 2.0, "throughput_samples_per_s": 32.0, "tokens_per_s": 65536.0}}


def test_megatron_arguments() -> None:
    text = export(RESULT, "megatron", REQUEST)
    assert "--tensor-model-parallel-size 2" in text and "--pipeline-model-parallel-size 2" in text
    assert "--sequence-parallel" in text and "--micro-batch-size 2" in text and "--global-batch-size 64" in text
    # with 26 GiB of 79 needed without recomputation, running none is the fastest setting that fits
    assert "--recompute" not in text
    # without a cost model the memory-safe setting: the 10 fully recomputed layers all sit in stage 0, so block
    # recompute of 10 layers per stage
    bare = export(RESULT, "megatron")
    assert "--recompute-method block" in bare and "--recompute-num-layers 10" in bare
    assert "--decoder-first-pipeline-num-layers 14" in text
    assert "per-layer strategy not expressible" in text and "10 of 32 layers" in text
    assert "--num-layers 32" in text and "--swiglu" in text


_C = replace(B, zero=1)
MIXED = PlanStrategy(pp=2, micro_batches=8, stage_layers=(16, 16), embedding=EmbeddingStrategy(tp=2, dp=4, zero=1),
                     layers=(replace(_C, recompute="full"),) * 4 + (replace(_C, recompute="selective"),) * 8
                     + (_C,) * 20)


def _megatron_refuses(text: str) -> bool:
    """Megatron-LM's own start-up check: selective granularity (--recompute-activations sets it) with a method."""
    return "--recompute-activations" in text and "--recompute-method" in text


@pytest.mark.parametrize("limit_gib", [79, 27, 21, 15])  # none, selective, block 12, the leanest
def test_megatron_recomputation_is_the_fastest_setting_it_accepts_that_fits(limit_gib: float) -> None:
    """A plan mixing full, selective and no recomputation cannot be written for Megatron-LM as it is (one
    granularity per run): the export writes the option that runs fastest within the memory limit by the
    plan's cost model (the leanest where none fits), and never the combination Megatron refuses."""
    req = {**REQUEST, "constraints": {"memory_limit_gib": limit_gib}}
    result = {**RESULT, "strategy": MIXED.to_dict()}
    text = export(result, "megatron", req)
    assert not _megatron_refuses(text) and not _megatron_refuses(export(result, "megatron"))
    scored = []
    for option in megatron_recompute_options(MIXED):
        est = estimate({**req, "strategy": megatron_run_plan(MIXED, None, option).to_dict()})
        scored.append(((not est["fits"], est["step_time_s"] if est["fits"] else est["peak_memory_gib"]), option))
    best = min(scored, key=lambda t: t[0])[1]
    assert megatron_recompute(MIXED, None, req) == best
    assert all(a in text for a in best.args(MIXED.stage_layers))
    assert "the plan's mix of full and selective layers runs as " + best.describe() in text


def test_deepspeed_config_is_consistent_json() -> None:
    cfg = json.loads(export(RESULT, "deepspeed", REQUEST))
    dp = 4
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp
    assert cfg["zero_optimization"]["stage"] == 2  # the dominant (22-layer) strategy
    assert cfg["pipeline"]["stages"] == 2 and "custom:14,18" in cfg["pipeline"]["partition_method"]
    assert any("not expressible" in n for n in cfg["_paraplan_notes"])


def test_torchtitan_toml_degrees_cover_the_cluster() -> None:
    doc = tomllib.loads(export(RESULT, "torchtitan", REQUEST))
    p = doc["parallelism"]
    world = (p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] * p["tensor_parallel_degree"]
             * p["context_parallel_degree"] * p["pipeline_parallel_degree"])
    assert world == 16
    assert p["pipeline_parallel_split_points"] == ["layers.14"]
    assert doc["training"]["global_batch_size"] == 64


def test_galvatron_config_round_trips() -> None:
    cfg = json.loads(export(RESULT, "galvatron", REQUEST))
    back = plan_from_galvatron_config(cfg, 16)
    assert back.pp == 2 and back.stage_layers == (14, 18) and back.micro_batches == 8
    assert [x.tp for x in back.layers] == [x.tp for x in PLAN.layers]
    assert [x.zero == 3 for x in back.layers] == [x.zero == 3 for x in PLAN.layers]
    assert [x.recompute for x in back.layers] == [x.recompute for x in PLAN.layers]


def test_batch_recovered_from_the_estimate_without_request() -> None:
    assert "--global-batch-size 64" in export(RESULT, "megatron")


def test_unknown_format_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as err:
        export(RESULT, "nemo", REQUEST)
    assert err.value.problems[0].loc == ("format",)


def test_megatron_runs_the_dominant_layout_with_its_own_approximations() -> None:
    run = megatron_run_plan(PLAN)
    base = {(x.tp, x.dp, x.sp, x.zero) for x in run.layers}
    assert base == {(2, 4, "megatron", 1)}  # ZeRO-2 (dominant) as the distributed optimizer
    # block recomputation: the first 10 layers of every stage (the most any stage of the plan recomputes)
    assert [x.recompute for x in run.layers] == ["full"] * 10 + ["none"] * 4 + ["full"] * 10 + ["none"] * 8
    assert run.stage_layers == PLAN.stage_layers and run.embedding.tp == 2
    titan = torchtitan_run_plan(PLAN)
    assert {(x.zero, x.recompute) for x in titan.layers} == {(3, "none")}  # FSDP, one mode for all layers


@pytest.mark.parametrize("fmt,run_plan", [("megatron", megatron_run_plan), ("torchtitan", torchtitan_run_plan),
                                          ("deepspeed", deepspeed_run_plan)])
def test_export_states_what_the_framework_would_run_at(fmt: str, run_plan: Any) -> None:
    """The export's first line is the plan's cost model on what the framework runs: its step against the
    plan's, its peak memory, and whether it fits (a per-layer plan exported to one layout may not)."""
    req = {"kind": "hybrid", "model": {"preset": "llama3-8b", "num_layers": 8},
           "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
           "training": {"global_batch_size": 64, "seq_length": 8192}, "constraints": {"memory_limit_gib": 40}}
    result = solve(req)
    text = export(result, fmt, req)
    first = json.loads(text)["_paraplan_notes"][0] if fmt == "deepspeed" else text.splitlines()[0]
    est = estimate({**req, "strategy": run_plan(PlanStrategy.from_dict(result["strategy"])).to_dict()})
    assert f"estimated step {est['step_time_s']:.4g} s" in first and f"peak {est['peak_memory_gib']:.1f} GiB" in first
    assert ("OVER THE MEMORY LIMIT" in first) == (not est["fits"])
    assert "runs it" not in export(result, fmt)  # without the request there is nothing to estimate with


def test_deepspeed_runs_context_parallelism_as_ulysses_and_cannot_run_tp_with_it() -> None:
    cp = LayerStrategy(tp=1, dp=4, cp=4, zero=2)
    run = deepspeed_run_plan(PlanStrategy(pp=1, micro_batches=4, layers=(cp,) * 4, stage_layers=(4,)))
    assert run is not None and {(x.tp, x.cp, x.sp, x.zero) for x in run.layers} == {(4, 1, "ulysses", 2)}
    assert run.embedding.tp == 1 and run.embedding.dp == 16
    both = LayerStrategy(tp=2, dp=2, cp=4, sp="megatron")
    assert deepspeed_run_plan(PlanStrategy(pp=1, micro_batches=4, layers=(both,) * 4, stage_layers=(4,))) is None


def test_moe_plan_exports_its_experts_and_expert_parallelism() -> None:
    """Expert fields ride on the MoE layers only; Megatron gets experts, routing, EP and, for MoE every
    other layer, the explicit layer pattern (its integer --moe-layer-freq N starts at layer 0, the spec's at
    N - 1); the framework run keeps dense layers dense."""
    req = {"kind": "hybrid", "model": {"preset": "mixtral-8x7b", "num_layers": 4,
                                       "moe": {"num_experts": 8, "top_k": 2, "moe_layer_frequency": 2}},
           "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
           "training": {"global_batch_size": 16, "seq_length": 4096}}
    attn = LayerStrategy(tp=2, dp=4, sp="megatron", zero=1)
    moe = LayerStrategy(tp=2, dp=4, sp="megatron", zero=1, ep=4, etp=1)
    plan = PlanStrategy(pp=1, micro_batches=4, layers=(attn, moe, attn, moe), stage_layers=(4,),
                        embedding=EmbeddingStrategy(tp=2, dp=4, zero=1))
    result = {"strategy": plan.to_dict(), "estimate": estimate({**req, "strategy": plan.to_dict()})}
    text = export(result, "megatron", req)
    for arg in ("--num-experts 8", "--moe-router-topk 2", "--expert-model-parallel-size 4",
                "--expert-tensor-parallel-size 1", "--moe-layer-freq '[0,1,0,1]'"):
        assert arg in text, arg
    assert "per-layer strategy not expressible" not in text  # the expert fields are not a second strategy
    run = megatron_run_plan(plan, [False, True, False, True])
    assert [(x.ep, x.etp) for x in run.layers] == [(1, None), (4, 1), (1, None), (4, 1)]
    assert "+0.0% against the plan" in text.splitlines()[0]  # Megatron runs exactly this plan
    assert "expert_parallel_degree = 4" in export(result, "torchtitan", req)
