"""Exports of a hybrid plan: every format from a per-layer (non-uniform) plan, approximations stated."""

from __future__ import annotations

import json
import random
import shlex
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from solvers.cost_model import pipeline
from solvers.documents import HybridResult, load_result
from solvers.documents.hybrid import StrategyDoc
from solvers.errors import SpecError
from solvers.exports import EXPORTERS, export
from solvers.exports.deepspeed import deepspeed_run_plan, deepspeed_setting
from solvers.exports.differences import differences
from solvers.exports.layout import front_loaded_split
from solvers.exports.megatron import (
    MegatronLayout,
    megatron_layout,
    megatron_recompute_options,
    megatron_run_plan,
    nearest_megatron_splits,
)
from solvers.exports.torchtitan import TORCHTITAN_RECOMPUTE, torchtitan_recompute, torchtitan_run_plan
from solvers.formats.galvatron import plan_from_galvatron_config
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy
from tests.contract_json import estimate, solve
from tests.documents import hybrid_result

REQUEST: dict[str, Any] = {
    "kind": "hybrid", "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
    "training": {"global_batch_size": 64, "seq_length": 2048},
}
A = LayerStrategy(tp=2, dp=4, sp="megatron", zero=3, recompute="full")
B = LayerStrategy(tp=2, dp=4, sp="megatron", zero=2, recompute="none")
PLAN = PlanStrategy(pp=2, micro_batches=8, layers=(A,) * 10 + (B,) * 22, stage_layers=(14, 18),
                    embedding=EmbeddingStrategy(tp=2, dp=4, zero=3))


def _with(result: HybridResult, plan: PlanStrategy) -> HybridResult:
    """``result`` with ``plan`` as its strategy."""
    return result.model_copy(update={"strategy": StrategyDoc.of(plan)})


RESULT = hybrid_result(PLAN, {"step_time_s": 2.0, "throughput_samples_per_s": 32.0, "tokens_per_s": 65536.0})


def test_megatron_arguments() -> None:
    text = export(RESULT, "megatron", REQUEST)
    assert "--tensor-model-parallel-size 2" in text and "--pipeline-model-parallel-size 2" in text
    assert "--sequence-parallel" in text and "--micro-batch-size 2" in text and "--global-batch-size 64" in text
    # with 30 GiB of 79 needed without recomputation, running none is the fastest setting that fits
    assert "--recompute" not in text
    # without a cost model the memory-safe setting: the 10 fully recomputed layers all sit in stage 0, so block
    # recompute of 10 layers per stage
    bare = export(RESULT, "megatron")
    assert "--recompute-method block" in bare and "--recompute-num-layers 10" in bare
    # of the splits Megatron accepts, the even one runs fastest here; the bare export keeps the plan's 14 + 18
    assert "stages [14, 18] run as [16, 16]" in text and "--decoder-first-pipeline-num-layers" not in text
    assert "--decoder-first-pipeline-num-layers 14" in bare
    assert "per-layer strategy not expressible" in text and "10 of 32 layers" in text
    assert "--num-layers 32" in text and "--swiglu" in text
    # Megatron refuses to start without the position-embedding size; llama2's output layer is its own matrix
    assert "--max-position-embeddings 2048" in text and "--untie-embeddings-and-output-weights" in text


_C = replace(B, zero=1)
MIXED = PlanStrategy(pp=2, micro_batches=8, stage_layers=(16, 16), embedding=EmbeddingStrategy(tp=2, dp=4, zero=1),
                     layers=(replace(_C, recompute="full"),) * 4 + (replace(_C, recompute="selective"),) * 8
                     + (_C,) * 20)


def _megatron_refuses(text: str) -> bool:
    """Megatron-LM's own start-up check: selective granularity (--recompute-activations sets it) with a method."""
    return "--recompute-activations" in text and "--recompute-method" in text


@pytest.mark.parametrize("limit_gib", [79, 27, 21, 15])  # none; selective; selective on 15 + 17; the leanest
def test_megatron_recomputation_is_the_fastest_setting_it_accepts_that_fits(limit_gib: float) -> None:
    """A plan mixing full, selective and no recomputation cannot be written for Megatron-LM as it is (one
    granularity per run): the export writes the option that runs fastest within the memory limit by the
    plan's cost model (the leanest where none fits), and never the combination Megatron refuses."""
    req = {**REQUEST, "constraints": {"memory_limit_gib": limit_gib}}
    result = _with(RESULT, MIXED)
    text = export(result, "megatron", req)
    assert not _megatron_refuses(text) and not _megatron_refuses(export(result, "megatron"))
    scored = []
    for split in nearest_megatron_splits(MIXED):
        for option in megatron_recompute_options(MIXED):
            layout = MegatronLayout(split, option, by_cost_model=True)
            est = estimate({**req, "strategy": megatron_run_plan(MIXED, None, layout).to_dict()})
            scored.append(((not est["fits"], est["step_time_s"] if est["fits"] else est["peak_memory_gib"]), layout))
    best = min(scored, key=lambda t: t[0])[1]
    assert megatron_layout(MIXED, None, req) == best
    assert all(a in text for a in best.recompute.args(best.split or MIXED.stage_layers))
    assert "the plan's mix of full and selective layers runs as " + best.recompute.describe() in text


def test_megatron_export_warns_where_tensor_parallel_exceeds_the_query_groups() -> None:
    """qwen2-7b has 4 KV heads: at tp 8 the plan replicates them, which older Megatron-Core refuses."""
    req = {**REQUEST, "model": {"preset": "qwen2-7b"}}
    layers = (replace(B, tp=8, dp=1),) * 28
    plan = PlanStrategy(pp=2, micro_batches=8, layers=layers, stage_layers=(14, 14),
                        embedding=EmbeddingStrategy(tp=8, dp=1, zero=0))
    text = export(_with(RESULT, plan), "megatron", req)
    assert "--num-query-groups 4" in text and "4 query groups under tensor parallel 8" in text
    assert "query groups under" not in export(RESULT, "megatron", REQUEST)  # llama2-7b: no GQA

def test_a_baseline_exports_as_it_is_and_a_missing_one_is_named() -> None:
    """``of="megatron"`` exports the best uniform Megatron-style plan, which Megatron-LM runs unchanged (its
    as-run estimate is its own step); a baseline without a plan, or an unknown name, is a field error."""
    req = {"kind": "hybrid", "model": {"preset": "llama3-8b", "num_layers": 8},
           "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
           "training": {"global_batch_size": 64, "seq_length": 8192}, "constraints": {"memory_limit_gib": 40}}
    result = solve(req)
    doc = load_result("hybrid", result)
    base = result["baselines"]["megatron"]
    x = base["strategy"]["layers"][0]
    text = export(doc, "megatron", req, of="megatron")
    assert f"--tensor-model-parallel-size {x['tp']}" in text
    assert f"--pipeline-model-parallel-size {base['strategy']['pp']}" in text
    assert f"estimated step {base['estimate']['step_time_s']:.4g} s (+0.0% against" in text
    assert "per-layer strategy not expressible" not in text
    with pytest.raises(SpecError) as err:
        export(doc, "megatron", req, of="nope")
    assert err.value.problems[0].loc == ("of",) and "megatron" in err.value.problems[0].msg
    assert not result["baselines"]["pure_dp"]["fits"]
    with pytest.raises(SpecError) as err:
        export(doc, "megatron", req, of="pure_dp")
    assert "the pure_dp baseline has no plan to export" in err.value.problems[0].msg


@pytest.mark.parametrize(("damage", "loc"), [
    ({"micro_batches": 0}, ("result", "strategy", "micro_batches")),  # ZeroDivisionError
    ({"layers": [{"tp": 1, "dp": 8, "zero": 7}] * 8}, ("result", "strategy", "layers", 0, "zero")),  # KeyError
    ({"stage_layers": [4, 3]}, ("result", "strategy")),  # (these two were refused already)
    ({"pp": 0}, ("result", "strategy")),
])
def test_a_damaged_stored_result_is_a_field_error_not_a_crash(damage: dict[str, Any], loc: tuple) -> None:
    """A stored result may be damaged or written by another version; its export raised ZeroDivisionError,
    KeyError or AttributeError in the writers (an HTTP 500)."""
    req = {"kind": "hybrid", "model": {"preset": "llama2-7b", "num_layers": 8},
           "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8}, "training": {"global_batch_size": 32}}
    result = solve(req)
    bad = load_result("hybrid", {**result, "strategy": {**result["strategy"], **damage}})
    for fmt in ("megatron", "deepspeed", "torchtitan", "galvatron"):
        with pytest.raises(SpecError) as err:
            export(bad, fmt, req)
        assert loc in [p.loc for p in err.value.problems], (fmt, err.value)
    with pytest.raises(SpecError) as err:  # a baseline stored as null: AttributeError
        export(load_result("hybrid", {**result, "baselines": {**result["baselines"], "megatron": None}}), "megatron",
               req, of="megatron")
    assert err.value.problems[0].loc == ("of",)


def test_deepspeed_config_is_consistent_json() -> None:
    cfg = json.loads(export(RESULT, "deepspeed", REQUEST))
    dp = 4
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp
    # the dominant (22-layer) strategy is ZeRO-2, which DeepSpeed's pipeline engine refuses: ZeRO-1, said so
    assert cfg["zero_optimization"]["stage"] == 1
    assert any("ZeRO-2 written as ZeRO-1: DeepSpeed's pipeline engine refuses" in n for n in cfg["_paraplan_notes"])
    assert {x.zero for x in deepspeed_run_plan(PLAN).layers} == {1}  # type: ignore[union-attr]
    flat = json.loads(export(_with(RESULT, replace(PLAN, pp=1, stage_layers=(32,))), "deepspeed", REQUEST))
    assert flat["zero_optimization"]["stage"] == 2  # without pipelining the plan's ZeRO stage stands
    # DeepSpeed's partition methods are uniform / parameters / type:regex: a 14 + 18 split is none of them, and the
    # as-run estimate is of what uniform runs
    assert cfg["pipeline"] == {"stages": 2}
    assert any("partition_method='uniform') runs stages [16, 16]; the plan's [14, 18] is none" in n
               for n in cfg["_paraplan_notes"])
    assert deepspeed_run_plan(PLAN).stage_layers == (16, 16)  # type: ignore[union-attr]
    assert front_loaded_split(126, 8) == (16, 16, 16, 16, 16, 16, 15, 15)  # the remainder goes first
    assert any("not expressible" in n for n in cfg["_paraplan_notes"])


def _torchtitan_args(text: str) -> dict[str, str]:
    """The torchtitan command's ``--key value`` overrides (the last word of a multi-word value) and its
    ``activation-checkpoint:MODE`` subcommand."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    args = {w: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else ""
            for i, w in enumerate(words) if w.startswith("--")}
    for w in words:
        if w.startswith("activation-checkpoint:"):
            args["activation-checkpoint"] = w.split(":", 1)[1]
    return args


def _model_parts(text: str) -> list[list[str]]:
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    i = words.index("--parallelism.module_fqns_per_model_part") + 1
    parts = []
    while not words[i].startswith("-"):
        parts.append(words[i].split(","))
        i += 1
    return parts


def test_torchtitan_command_degrees_cover_the_cluster() -> None:
    """torchtitan 0.3.0 reads no TOML: the export is its launch command (was a TOML job file)."""
    text = export(RESULT, "torchtitan", REQUEST)
    p = _torchtitan_args(text)
    world = 1
    for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                "context_parallel_degree", "pipeline_parallel_degree"):
        world *= int(p[f"--parallelism.{key}"])
    assert world == 16
    parts = _model_parts(text)
    assert [sum(m.startswith("layers.") for m in part) for part in parts] == [14, 18]
    assert parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[1][-2:] == ["norm", "lm_head"]
    assert p["--training.global_batch_size"] == "64"
    # the plan's 8 micro-batches of 2 samples on each of 4 data-parallel ranks, pipelined in one step
    assert p["--training.local_batch_size"] == "16" and p["--parallelism.pipeline_parallel_microbatch_size"] == "2"


def test_torchtitan_interleaved_plan_gets_a_model_part_per_virtual_stage() -> None:
    """Interleaved over 2 stages with 2 chunks each: 4 model parts, rank 0 holding parts 0 and 2 (torchtitan's
    looped order), so the 14 + 18 layers split as 7, 9, 7, 9; with one part per rank the schedule would
    not interleave at all."""
    plan = replace(PLAN, schedule="interleaved", virtual_stages=2)
    text = export(_with(RESULT, plan), "torchtitan", REQUEST)
    assert _torchtitan_args(text)["--parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert [sum(m.startswith("layers.") for m in part) for part in _model_parts(text)] == [7, 9, 7, 9]


@pytest.mark.parametrize("limit_gib,fused", [(79, False), (24, False), (20, False), (8, False),
                                             (20, True), (19, True), (18, True)])
def test_torchtitan_checkpointing_is_the_fastest_setting_it_takes_that_fits(limit_gib: float, fused: bool) -> None:
    """torchtitan 0.3.0 takes one activation-checkpoint setting: none, op-selective or full (it dropped full on
    every N-th block). The export writes the one that runs fastest within the memory limit by the plan's cost
    model (the leanest where none fits), as the subcommand torchtitan reads, and says how the plan's own mix
    runs."""
    req: dict[str, Any] = {**REQUEST, "constraints": {"memory_limit_gib": limit_gib},
                           "training": {**REQUEST["training"], "stack": {"attention": "fused" if fused else "unfused"}}}
    result = _with(RESULT, MIXED)
    scored = []
    for rc in TORCHTITAN_RECOMPUTE:
        est = estimate({**req, "strategy": torchtitan_run_plan(MIXED, None, rc).to_dict()})
        scored.append(((not est["fits"], est["step_time_s"] if est["fits"] else est["peak_memory_gib"]), rc))
    best = min(scored, key=lambda t: t[0])[1]
    assert torchtitan_recompute(MIXED, None, req) == best
    text = export(result, "torchtitan", req)
    assert _torchtitan_args(text)["activation-checkpoint"] == best.mode
    assert f"runs as {best.describe()}" in text

def test_galvatron_config_round_trips() -> None:
    cfg = json.loads(export(RESULT, "galvatron", REQUEST))
    back = plan_from_galvatron_config(cfg, 16)
    assert back.pp == 2 and back.stage_layers == (14, 18) and back.micro_batches == 8
    assert [x.tp for x in back.layers] == [x.tp for x in PLAN.layers]
    assert [x.zero == 3 for x in back.layers] == [x.zero == 3 for x in PLAN.layers]
    assert [x.recompute for x in back.layers] == [x.recompute for x in PLAN.layers]


def test_galvatron_config_says_what_galvatron_runs_differently() -> None:
    """The Galvatron file silently wrote selective recomputation as full, ZeRO-1 as ZeRO-2 and one SP switch for
    all TP layers (a plan exported this way ran 23% slower when re-imported); now ``_paraplan_notes`` names each
    change and, with the request, estimates the file as Galvatron runs it, as the other exports do."""
    sel = replace(A, zero=1, recompute="selective")
    plan = replace(PLAN, layers=(sel,) * 10 + (replace(B, sp=None),) * 22)
    result = _with(RESULT, plan)
    notes = json.loads(export(result, "galvatron", REQUEST))["_paraplan_notes"]
    assert notes[0].startswith("as Galvatron runs it, estimated step")
    assert "10 of 32 layers: recompute selective written as full (Galvatron checkpoints whole layers)" in notes
    assert any(n.startswith("10 of 32 layers: ZeRO-1 written as ZeRO-2") for n in notes)
    assert any(n.startswith("22 of 32 layers: sp None written as megatron") for n in notes)
    lossless = replace(PLAN, layers=(replace(A, recompute="none"),) * 32,
                       embedding=EmbeddingStrategy(tp=2, dp=4, zero=3))
    quiet = json.loads(export(_with(RESULT, lossless), "galvatron"))
    # the one note: the embedding's ZeRO-3 under both versions' key (HEAD ignores 2.4.0's embed_sdp)
    assert quiet["embed_sdp"] == quiet["vocab_sdp"] == 1
    assert quiet["_paraplan_notes"] == ["the embedding's ZeRO-3 is written as both embed_sdp (hetu-galvatron 2.4.0) "
                                        "and vocab_sdp (Galvatron HEAD): each version reads one and ignores the other"]


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
    # FSDP with one recomputation mode for all layers: pipelined, it syncs once a step (ZeRO-1's memory and
    # traffic); without pipelining it reshards after every forward (ZeRO-3)
    titan = torchtitan_run_plan(PLAN)
    assert {(x.zero, x.recompute) for x in titan.layers} == {(1, "none")}
    flat = replace(PLAN, pp=1, stage_layers=(32,))
    assert {x.zero for x in torchtitan_run_plan(flat).layers} == {3}
    assert "ZeRO-2 runs as ZeRO-1 in torchtitan: pipelined" in export(RESULT, "torchtitan", REQUEST)


@pytest.mark.parametrize("fmt,run_plan", [
    ("megatron", lambda p, req: megatron_run_plan(p, None, megatron_layout(p, None, req))),
    ("torchtitan", lambda p, req: torchtitan_run_plan(p, None, torchtitan_recompute(p, None, req))),
    # the setting the export chooses by cost (as planned where that fits, else ZeRO-3 / checkpointing)
    ("deepspeed", lambda p, req: deepspeed_run_plan(p, None, deepspeed_setting(p, None, req)))])
def test_export_states_what_the_framework_would_run_at(fmt: str, run_plan: Any) -> None:
    """The export's first line is the plan's cost model on what the framework runs: its step against the
    plan's, its peak memory, and whether it fits (a per-layer plan exported to one layout may not)."""
    req = {"kind": "hybrid", "model": {"preset": "llama3-8b", "num_layers": 8},
           "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
           "training": {"global_batch_size": 64, "seq_length": 8192}, "constraints": {"memory_limit_gib": 40}}
    result = load_result("hybrid", solve(req))
    text = export(result, fmt, req)
    first = json.loads(text)["_paraplan_notes"][0] if fmt == "deepspeed" else text.splitlines()[0]
    est = estimate({**req, "strategy": run_plan(result.plan(), req).to_dict()})
    assert f"estimated step {est['step_time_s']:.4g} s" in first and f"peak {est['peak_memory_gib']:.1f} GiB" in first
    assert ("OVER THE MEMORY LIMIT" in first) == (not est["fits"])
    assert "runs it" not in export(result, fmt)  # without the request there is nothing to estimate with


def test_deepspeed_runs_context_parallelism_as_ulysses_and_tp_with_it_as_one_group() -> None:
    cp = LayerStrategy(tp=1, dp=4, cp=4, zero=2)
    run = deepspeed_run_plan(PlanStrategy(pp=1, micro_batches=4, layers=(cp,) * 4, stage_layers=(4,)))
    assert run is not None and {(x.tp, x.cp, x.sp, x.zero) for x in run.layers} == {(4, 1, "ulysses", 2)}
    assert run.embedding.tp == 1 and run.embedding.dp == 16
    # DeepSpeed has one axis for the ranks sharing a layer: Ulysses on its mesh, AutoTP in a pipeline's grid
    both = LayerStrategy(tp=2, dp=2, cp=4, sp="megatron")
    flat = deepspeed_run_plan(PlanStrategy(pp=1, micro_batches=4, layers=(both,) * 4, stage_layers=(4,)))
    assert {(x.tp, x.cp, x.sp, x.dp) for x in flat.layers} == {(8, 1, "ulysses", 2)}
    piped = deepspeed_run_plan(PlanStrategy(pp=2, micro_batches=4, layers=(both,) * 4, stage_layers=(2, 2)))
    assert {(x.tp, x.cp, x.sp, x.dp, x.zero) for x in piped.layers} == {(8, 1, None, 2, 0)}


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
    result = hybrid_result(plan, estimate({**req, "strategy": plan.to_dict()}))
    text = export(result, "megatron", req)
    for arg in ("--num-experts 8", "--moe-router-topk 2", "--expert-model-parallel-size 4",
                "--expert-tensor-parallel-size 1", "--moe-layer-freq '[0,1,0,1]'"):
        assert arg in text, arg
    assert "per-layer strategy not expressible" not in text  # the expert fields are not a second strategy
    run = megatron_run_plan(plan, [False, True, False, True])
    assert [(x.ep, x.etp) for x in run.layers] == [(1, None), (4, 1), (1, None), (4, 1)]
    assert "+0.0% against the plan" in text.splitlines()[0]  # Megatron runs exactly this plan
    assert "--parallelism.expert_parallel_degree 4" in export(result, "torchtitan", req)


def test_experts_keep_the_plans_expert_tp_where_the_framework_changes_the_layers_tp() -> None:
    """The plan's Ulysses layers keep the experts whole (expert TP 1); written as Megatron TP 2 the experts
    were split over it too, so ep 2 x etp 2 did not divide the stage's 6 ranks: Megatron-LM would refuse the
    arguments and every framework's as-run note said the export could not be estimated."""
    req = {"kind": "hybrid", "model": {"preset": "mixtral-8x7b", "num_layers": 4},
           "cluster": {"gpu": "A100-80GB", "nodes": 3, "gpus_per_node": 4},
           "training": {"global_batch_size": 48, "seq_length": 1024}}
    uly = LayerStrategy(tp=2, dp=3, sp="ulysses", zero=1)
    plan = PlanStrategy(pp=2, micro_batches=8, layers=(uly, uly, replace(uly, zero=3, ep=2), uly),
                        stage_layers=(2, 2), embedding=EmbeddingStrategy(tp=1, dp=6, zero=3))
    result = hybrid_result(plan, estimate({**req, "strategy": plan.to_dict()}))
    text = export(result, "megatron", req)
    assert "--expert-model-parallel-size 2" in text and "--expert-tensor-parallel-size 1" in text
    assert {(x.ep, x.etp) for x in megatron_run_plan(plan, [True] * 4).layers} == {(2, 1)}
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        assert "cannot run it as exported" not in export(result, fmt, req), fmt


def test_megatron_arguments_and_their_as_run_estimate_agree_on_sequence_parallelism() -> None:
    """The as-run estimate gave every TP layer Megatron SP while the arguments wrote --sequence-parallel only
    for the plan's Megatron-SP layers: a plain-TP plan (tp 3 on a 2048-token sequence, which SP cannot split)
    could not be estimated, and a Ulysses plan's arguments lacked the SP the note priced."""
    req = {"kind": "hybrid", "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 6},
           "model": {"name": "t", "num_layers": 4, "hidden_size": 384, "num_attention_heads": 12},
           "training": {"global_batch_size": 8, "seq_length": 2048}}
    plain = LayerStrategy(tp=3, dp=2, zero=1)
    plan = PlanStrategy(pp=1, micro_batches=4, layers=(plain,) * 4, stage_layers=(4,),
                        embedding=EmbeddingStrategy(tp=3, dp=2, zero=1))
    result = hybrid_result(plan, estimate({**req, "strategy": plan.to_dict()}))
    text = export(result, "megatron", req)
    assert "--sequence-parallel" not in text and "+0.0% against the plan" in text.splitlines()[0]
    assert {x.sp for x in megatron_run_plan(plan).layers} == {None}
    uly = replace(plan, layers=(LayerStrategy(tp=2, dp=3, sp="ulysses", zero=1),) * 4,
                  embedding=EmbeddingStrategy(tp=2, dp=3, zero=1))
    text = export(_with(result, uly), "megatron", req)
    assert "--sequence-parallel" in text and {x.sp for x in megatron_run_plan(uly).layers} == {"megatron"}


def test_a_framework_that_cannot_run_the_export_says_so_once() -> None:
    """torchtitan shards every TP layer's sequence; plain TP 6 over 1,021 tokens cannot be. The note read "the
    export could not be estimated", with the same reason once per layer."""
    req = {"kind": "hybrid", "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 6},
           "model": {"name": "t", "num_layers": 4, "hidden_size": 768, "num_attention_heads": 12},
           "training": {"global_batch_size": 6, "seq_length": 1021}}
    est = estimate({**req, "strategy": {"tp": 6, "sp": None}})
    note = export(hybrid_result(est["strategy"], est), "torchtitan", req).splitlines()[0]
    assert note == ("# torchtitan cannot run it as exported: seq_length (1021) is not divisible by the sequence "
                    "split (6)"), note


def megatron_refusal(text: str, num_layers: int) -> str | None:
    """Megatron-LM's start-up checks of the pipeline and recomputation arguments (validate_args and
    TransformerConfig): the reason it would refuse ``text``, or None."""
    flags: dict[str, int | None] = {}
    for line in text.splitlines():
        if line.startswith("--"):
            name, *value = line.rstrip(" \\").split()
            flags[name] = int(value[0]) if value and value[0].lstrip("-").isdigit() else None
    pp = flags.get("--pipeline-model-parallel-size") or 1
    first, last = flags.get("--decoder-first-pipeline-num-layers"), flags.get("--decoder-last-pipeline-num-layers")
    per_vstage, v_rank = flags.get("--num-layers-per-virtual-pipeline-stage"), flags.get(
        "--num-virtual-stages-per-pipeline-rank")
    if "--recompute-activations" in flags and "--recompute-method" in flags:
        return "selective granularity with a recompute method"
    if per_vstage is not None and v_rank is not None:
        return "both virtual-stage flags"
    v = 1
    if per_vstage is not None or v_rank is not None:
        if pp <= (2 if "--no-overlap-p2p-communication" in flags else 1):  # core_r0.19 overlaps by default
            return "interleaving on too few stages"
        if v_rank is None:
            if first is not None or last is not None:
                return "uneven stages need --num-virtual-stages-per-pipeline-rank"
            if num_layers % pp or (num_layers // pp) % (per_vstage or 1):
                return "layers do not divide into stages of whole virtual stages"
            v = num_layers // pp // (per_vstage or 1)
        else:
            v = v_rank
    if first is None and last is None:
        return "layers do not divide over the stages" if num_layers % pp else None
    middle, stages = num_layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
    if (middle != 0 if stages == 0 else middle <= 0 or middle % stages):
        return "middle stages uneven"
    if any(n % v for n in (first or 0, last or 0, middle // stages if stages else 0)):
        return "a stage is not whole model chunks"
    return None


def _random_plan(rng: random.Random) -> PlanStrategy:
    pp = rng.choice([1, 2, 3, 4, 8])
    v = rng.choice([1, 2]) if pp > 1 else 1
    layers = rng.randrange(max(pp * v, 4), 40)
    cuts = sorted(rng.sample(range(1, layers), pp - 1))
    parts = tuple(b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True))
    mode = [rng.choice(["none", "selective", "full"]) for _ in range(layers)]
    return PlanStrategy(pp=pp, micro_batches=pp * 4, stage_layers=parts,
                        schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                        layers=tuple(replace(_C, recompute=m) for m in mode))  # type: ignore[arg-type]


def test_megatron_exports_pass_megatrons_own_start_up_checks() -> None:
    """Over random plans (uneven stages, interleaving, mixed recomputation): the written arguments are ones
    Megatron-LM starts with, or the export says it will refuse them (no split into whole chunks exists), and
    the as-run plan the note estimates has the stage sizes the arguments give."""
    rng = random.Random(7)
    for _ in range(300):
        plan = _random_plan(rng)
        text = export(_with(RESULT, plan), "megatron")
        reason = megatron_refusal(text, len(plan.layers))
        splits = nearest_megatron_splits(plan)
        assert (reason is None) == bool(splits), (plan.stage_layers, plan.virtual_stages, reason, text)
        if splits:
            assert megatron_run_plan(plan).stage_layers == splits[0]
            # searching only around the plan's first stage per middle size misses no nearer split
            every = pipeline.megatron_splits(len(plan.layers), plan.pp, pipeline.chunks(plan.schedule,
                                                                                        plan.virtual_stages))
            want = plan.stage_layers
            devs = [sum((a - b) ** 2 for a, b in zip(p, want, strict=True)) for p in [splits[0], *every]]
            assert devs[0] == min(devs)
        else:
            assert "it will refuse these arguments" in text


def _aspects(s: LayerStrategy) -> dict[str, Any]:
    """A layer's fields by the aspects an export's differences are stated in."""
    return {"layout": (s.tp, s.cp, s.dp, s.sp), "zero": s.zero, "recompute": s.recompute,
            "experts": (s.ep, s.etp, s.lsh)}


def _plan_level(p: PlanStrategy) -> tuple[Any, ...]:
    return p.pp, p.stage_layers, p.schedule, p.virtual_stages, p.micro_batches


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed", "galvatron"])
def test_each_difference_changes_one_aspect_and_together_they_cover_the_run(fmt: str) -> None:
    """Over random plans and each framework's run of them: every difference is the plan with one aspect of some
    layers (or the pipeline, or the embedding) set to the run's, and each layer aspect in which the run differs is
    changed by exactly one difference; a run equal to the plan has none."""
    rng = random.Random(11)
    seen = 0
    for _ in range(60):
        plan = _random_plan(rng)
        plan = plan.with_layers(tuple(replace(x, zero=rng.choice([0, 1, 2, 3])) for x in plan.layers))
        run = EXPORTERS[fmt].run_plan(plan)
        if run is None:
            continue
        diffs = differences(plan, run)
        assert (diffs == []) == (run == plan)
        covered: Counter[tuple[int, str]] = Counter()
        for d in diffs:
            pipeline_changed = _plan_level(d.changed) != _plan_level(plan)
            assert pipeline_changed == d.what.startswith("pipeline")
            assert (d.changed.embedding != plan.embedding) == d.what.startswith("embedding")
            for i, (a, b, r) in enumerate(zip(plan.layers, d.changed.layers, run.layers, strict=True)):
                for key, value in _aspects(b).items():
                    if value != _aspects(a)[key]:
                        assert value == _aspects(r)[key]
                        covered[(i, key)] += 1
        # ZeRO is no difference on a run's layer with no data- or context-parallel ranks to shard over
        wanted = {(i, k) for i, (a, r) in enumerate(zip(plan.layers, run.layers, strict=True))
                  for k in _aspects(a) if _aspects(a)[k] != _aspects(r)[k] and not (k == "zero" and r.dp * r.cp == 1)}
        assert set(covered) == wanted and set(covered.values()) <= {1}
        seen += bool(diffs)
    assert seen >= 10  # the check ran on runs that differ


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed", "galvatron"])
def test_the_header_prices_each_difference_alone(fmt: str) -> None:
    """Every difference between the plan and the framework's run is in the export's header with the step and
    peak memory of the plan with only that change, by the public estimate, against the plan's."""
    req = {"kind": "hybrid", "model": {"preset": "llama3-8b", "num_layers": 8},
           "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
           "training": {"global_batch_size": 64, "seq_length": 32768}, "constraints": {"memory_limit_gib": 40}}
    result = load_result("hybrid", solve(req))
    plan = result.plan()
    run = EXPORTERS[fmt].run_plan(plan, None, req)
    assert run is not None
    text = export(result, fmt, req)
    said = json.loads(text)["_paraplan_notes"] if fmt in ("deepspeed", "galvatron") else \
        [n[2:] for n in text.splitlines() if n.startswith("# ")]
    base = estimate({**req, "strategy": plan.to_dict()})
    diffs = differences(plan, run)
    assert diffs, "the case must differ from the plan in each framework"
    assert f"{len(diffs)} difference(s) from the plan, each estimated alone" in " ".join(said)
    for d in diffs:
        est = estimate({**req, "strategy": d.changed.to_dict()})
        line = (f"- {d.what}: step {est['step_time_s'] / base['step_time_s'] - 1:+.1%}, "
                f"peak {est['peak_memory_gib'] - base['peak_memory_gib']:+.1f} GiB")
        assert any(n.startswith(line) for n in said), (line, said)


def test_a_torchtitan_stack_prices_the_export_as_torchtitan_runs_it() -> None:
    """The export prices torchtitan's run on the request's stack. On the default stack (megatron-core) its
    "selective" is Megatron's, which on fused attention keeps as much as none (21.2 GiB here): at 19 GiB only full
    checkpointing fits, and the export says the run is priced on another framework's stack. Asked on a torchtitan
    stack, selective is torchtitan's per-op policy (18.4 GiB): it fits and runs faster than full, and is written."""
    result = _with(RESULT, MIXED)
    req: dict[str, Any] = {**REQUEST, "constraints": {"memory_limit_gib": 19}}
    titan: dict[str, Any] = {**req, "training": {**req["training"], "stack": {"framework": "torchtitan"}}}
    default, ours = export(result, "torchtitan", req), export(result, "torchtitan", titan)
    assert _torchtitan_args(default)["activation-checkpoint"] == "full"
    assert _torchtitan_args(ours)["activation-checkpoint"] == "selective"
    assert "priced on the request's stack (megatron-core)" in default
    assert "priced on the request's stack" not in ours
    steps = {rc.mode: estimate({**titan, "strategy": torchtitan_run_plan(MIXED, None, rc).to_dict()})
             for rc in TORCHTITAN_RECOMPUTE}
    assert steps["selective"]["fits"] and steps["selective"]["step_time_s"] < steps["full"]["step_time_s"]
    assert not steps["none"]["fits"]
