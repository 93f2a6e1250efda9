"""The Galvatron-compatible cost model against hand-derived values, Galvatron's own outputs (cached from
the peer runner in bench/data/galvatron), the aggregation contract, and bad input."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from solvers.cost_model.aggregate import stage_context, stage_memory_bytes
from solvers.cost_model.factory import make_cost_model
from solvers.cost_model.galvatron import GalvatronCostModel
from solvers.errors import SpecError
from solvers.formats.galvatron import plan_from_galvatron_config, read_galvatron_config
from solvers.hybrid.api import layer_kinds
from solvers.hybrid.planner import Planner
from solvers.hybrid.space import build_space
from solvers.request import HybridRequest, parse
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, SpKind
from tests.contract_json import estimate
from tests.contract_json import solve_hybrid as solve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "bench", "data", "galvatron")
PROFILES, HARDWARE = os.path.join(DATA, "profiles"), os.path.join(DATA, "hardware")
REFERENCE = os.path.normpath(os.path.join(ROOT, "..", "shared", "reference", "galvatron"))
MB = 2.0**20


def request(nodes: int = 1, memory_gib: float = 36, batch: int = 64, seq: int = 2048, **cost: Any) -> dict[str, Any]:
    return {"kind": "hybrid", "model": {"preset": "llama2-7b"},
            "cluster": {"gpu": "A100-80GB", "nodes": nodes, "gpus_per_node": 8},
            "training": {"global_batch_size": batch, "seq_length": seq},
            "constraints": {"memory_limit_gib": memory_gib},
            "cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": HARDWARE, **cost}}


def model(**kw: Any) -> GalvatronCostModel:
    return GalvatronCostModel.from_request(parse(HybridRequest, request(**kw)))


def case_model(case: dict[str, Any], memory_gib: float | None = None, **extra: Any) -> GalvatronCostModel:
    """The model configured as Galvatron was for a cached runner case (time mode, SP space, SP flag)."""
    opts = dict(case["paraplan_cost_model"])
    inp = case["inputs"]
    return model(nodes=inp["nodes"], memory_gib=memory_gib or inp["memory_gb"],
                 profiles_dir=os.path.join(DATA, opts.pop("profiles")), **opts, **extra)


def case_plan(case: dict[str, Any]) -> PlanStrategy:
    inp = case["inputs"]
    return plan_from_galvatron_config(case["plan"]["galvatron_config"], inp["gpus"],
                                      sequence_parallel=inp["sequence_parallel"])


def uniform(layer: LayerStrategy, pp: int, micro_batches: int, embedding: EmbeddingStrategy,
            layers: int = 32) -> PlanStrategy:
    return PlanStrategy(pp=pp, micro_batches=micro_batches, layers=(layer,) * layers,
                        stage_layers=(layers // pp,) * pp, schedule="1f1b", embedding=embedding)


def load(path: str) -> dict[str, Any]:
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


# Numbers of the cached profile / hardware files, written out so the hand derivations below read them.
FWD_MS, OTHER_MS = 5.299896764755249, 3.065276908874509  # per sample, layer / embedding+head (bsz 8)
PARAM_MB = 773.0166015625  # one layer (SP profile)
ACT_MB = {1: 430.2666015625, 2: 223.13330078125}  # per sample by tp (SP profile); checkpoint: 16
OVERLAP = 1.125552573612729
BW = {"8": 154.203, "2_1": 138.156, "2_0": 151.344}  # all-reduce bus bandwidth, 1x8
P2P_2 = 163.671


def files_say_what_the_test_assumes() -> None:
    mem = load(os.path.join(PROFILES, "memory_profiling_bf16_hidden4096_head32_seqlen2048.json"))
    assert mem["layertype_0_sp"]["2048"]["parameter_size"] == PARAM_MB
    ar = load(os.path.join(HARDWARE, "allreduce_bandwidth_1nodes_8gpus_per_node.json"))
    assert ar["allreduce_size_2_consec_0"] == BW["2_0"]


def test_dp8_hand_derived() -> None:
    """pp1, tp1 x dp8, ZeRO-2, 8 micro-batches of 8 samples: one sample per GPU per micro-batch."""
    files_say_what_the_test_assumes()
    plan = uniform(LayerStrategy(tp=1, dp=8, zero=2), 1, 8, EmbeddingStrategy(tp=1, dp=8, zero=2))
    est = model(memory_gib=80).evaluate(plan)
    L = 32
    fct = FWD_MS * 1 * L  # ms, the dummy "whole model" Galvatron scales by the layer count
    bct = 2 * fct
    quiet_layer = (fct + bct) / L  # no gradient sync
    grad_mb = 2 * 7 / 8 * PARAM_MB * L / 2  # bf16 gradients, ring all-reduce volume
    sync = grad_mb / BW["8"]  # ms at the measured bus bandwidth
    # the overlapped part runs OVERLAP times slower: the backward is longer, so it absorbs the sync
    loud_layer = (fct + bct + sync * (OVERLAP - 1)) / L
    other = OTHER_MS * 1 * 3  # embedding + head, forward and backward, no vocabulary TP
    c0 = L * quiet_layer + other
    b0 = L * loud_layer
    expected = (8 * c0 + max(0.0, b0 - c0)) / 1000
    assert est.step_time_s == pytest.approx(expected, rel=1e-12)
    # memory: 4x params x ZeRO-2 ratio (several micro-batches, async reduce) + one sample of activations
    states = 4 * PARAM_MB * (6 / 8 * (1 / 8 + 0.003) + 2 / 8)
    layer_mb = math.ceil(states + ACT_MB[1])
    mem = load(os.path.join(PROFILES, "memory_profiling_bf16_hidden4096_head32_seqlen2048.json"))
    off = mem["other_memory_pp_off_sp"]["2048"]
    vocab = math.ceil(off["model_states"]["1"] * (6 / 8 * (1 / 8 + 0.003) + 2 / 8)
                      + off["activation"]["1"] * 64 / 8 / 8 + 1024)  # + PyTorch context
    buffer = int(1 * 1 * 4096 * 2048 * 4 / MB / 2)  # Megatron-SP buffer: micro-batch 1, max_tp 1
    cache = int(80 * 1024 * 0.2)
    assert est.memory_gib_per_stage[0] * 1024 == pytest.approx(32 * layer_mb + vocab + buffer + cache, abs=1e-6)
    assert est.fits  # 80 GB leave 65536 MB after the cache
    assert not model(memory_gib=36).evaluate(plan).fits  # 36 GB leave 29492 MB < 32 x 1501 MB of layers


def test_pp2_tp2_zero3_recompute_hand_derived() -> None:
    """pp2 x tp2 x dp2, ZeRO-3, full recomputation, 8 micro-batches, vocabulary TP 2 with ZeRO-2."""
    plan = uniform(LayerStrategy(tp=2, dp=2, sp="megatron", zero=3, recompute="full"), 2, 8,
                   EmbeddingStrategy(tp=2, dp=2, zero=2))
    est = model().evaluate(plan)
    L, b = 32, 64 / 8 / 2  # samples per data-parallel rank per micro-batch
    fct = FWD_MS * b / 2 * L
    bct = 3 * fct  # backward + recomputed forward
    tp_mb = 2 * (1 / 2) * (b * 2048 * 4096 * 4 * 4 / MB) * L * 1.5 / 2  # 4 all-reduces/layer, x1.5 recompute
    tp = tp_mb / BW["2_1"]  # TP groups are contiguous ranks
    gather = 2 * (1 / 2) * (PARAM_MB / 2) * L / 2 * 0.5 / BW["2_0"]  # ZeRO-3 all-gather over strided DP ranks
    p2p = 2 * 2 * b * 2048 * 4096 * 2 / MB / P2P_2
    quiet = fct + bct + tp + gather + p2p
    one_vocab = (1 / 2) * (2 * 2048 * 4096 / MB) * 2 / BW["2_0"]  # micro-batch of 2 per group, TP 2
    other = 3 * OTHER_MS * 2 / 2 + one_vocab  # half of the embedding+head work on each end stage
    c = 16 * quiet / L + other
    # dp == 2: the gradient sync overlaps half the backward, which is longer, so it only adds the slow-down
    grad_mb = 2 * (1 / 2) * (PARAM_MB / 2) * L / 2
    loud = quiet + grad_mb / BW["2_0"] * (OVERLAP - 1)
    with_sync = [16 * loud / L, 16 * loud / L]
    pipeline = max(2 * c + 7 * c, max(c / 3, c / 3) + max(2 * c / 3, 2 * c / 3) + 7 * c)
    reduce = max(with_sync[0] - c, with_sync[1] - 2 * c, 0.0)
    expected = (pipeline + reduce) / 1000
    assert est.step_time_s == pytest.approx(expected, rel=1e-12)

    zero3 = 7 / 8 * (1 / 2 + 0.003) + 1 / 8
    states = 4 * PARAM_MB / 2 * zero3
    first_layers = 16 * math.ceil(states + 16 * 8 / 2)  # 1F1B: stage 0 holds 2 micro-batches of 4 samples
    last_layers = 16 * math.ceil(states + 16 * 4 / 2)
    mem = load(os.path.join(PROFILES, "memory_profiling_bf16_hidden4096_head32_seqlen2048.json"))
    first, last = mem["other_memory_pp_on_first_sp"]["2048"], mem["other_memory_pp_on_last_sp"]["2048"]
    zero2 = 6 / 8 * (1 / 2 + 0.003) + 2 / 8
    vocab_samples = 64 * 2 / 4 / 8
    first_other = math.ceil(first["model_states"]["2"] * zero2 + first["activation"]["2"] * vocab_samples * 2 + 1024)
    last_other = math.ceil(last["model_states"]["2"] * zero2 + last["activation"]["2"] * vocab_samples + 1024)
    buffer = int(2 / 1 * 2 * 4096 * 2048 * 4 / MB / 2)  # Megatron-SP buffer for max_tp 2
    cache = int(36 * 1024 * 0.2)
    got = [g * 1024 for g in est.memory_gib_per_stage]
    assert got == pytest.approx([first_layers + first_other + buffer + cache,
                                 last_layers + last_other + buffer + cache], abs=1e-6)
    assert est.fits


CASES = sorted(f[:-5] for f in os.listdir(os.path.join(DATA, "cases")))


@pytest.mark.parametrize("name", CASES)
def test_galvatron_returned_plans_reproduced(name: str) -> None:
    """Our estimate of each plan Galvatron returned equals the time and per-stage memory it reported."""
    case = load(os.path.join(DATA, "cases", name + ".json"))
    est = case_model(case).evaluate(case_plan(case))
    assert est.step_time_s == pytest.approx(case["est_iter_s"], rel=1e-9)  # the goal is 1%
    formula = case_model(case, pipeline_formula="galvatron").evaluate(case_plan(case))
    assert formula.step_time_s == pytest.approx(est.step_time_s, rel=1e-12)  # the default bound never binds on them
    assert est.throughput_samples_per_s == pytest.approx(case["throughput"], rel=1e-9)
    assert [g * 1024 for g in est.memory_gib_per_stage] == pytest.approx(case["mem_cost_mb_per_stage"], abs=1e-6)
    assert est.fits
    assert f"min_tp={case['min_tp']}, max_tp={case['max_tp']}" in est.notes[-1]


@pytest.mark.parametrize("name", ["1x8_16GB_mb8", "2x8_36GB_mb8", "2x8_36GB_gpipe"])
def test_rejected_exactly_when_over_budget(name: str) -> None:
    """A plan that needs M MB fits the smallest budget leaving M MB after Galvatron's cache, not 1 MB less."""
    case = load(os.path.join(DATA, "cases", name + ".json"))
    inp = case["inputs"]
    plan = case_plan(case)
    def cache(budget: int) -> int:  # Galvatron keeps 20% of budgets above 20 GB for the allocator
        return int(budget * 0.2) if budget // 1024 > 20 else 0

    plan_mb = max(case["mem_cost_mb_per_stage"]) - cache(inp["memory_gb"] * 1024)
    budget = plan_mb
    while budget - cache(budget) < plan_mb:
        budget += 1
    fits = case_model(case, budget / 1024).evaluate(plan)
    tight = case_model(case, (budget - 1) / 1024).evaluate(plan)
    assert fits.fits
    assert not tight.fits


def _probe_rows() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    rows = []
    for f in sorted(os.listdir(os.path.join(DATA, "probe"))):
        probe = load(os.path.join(DATA, "probe", f))
        rows += [(f, probe, dict(zip(probe["columns"], r, strict=True))) for r in probe["rows"]]
    return rows


def test_every_uniform_strategy_matches_galvatrons_own_cost_model() -> None:
    """All uniform plans of Galvatron's search space (1x8 / 2x8 GPUs, 1-8 micro-batches, vocabulary TP or
    sequence-split vocabulary, embedding ZeRO-2 / 3): time and memory as Galvatron's classes compute them."""
    models: dict[str, GalvatronCostModel] = {}
    rows = _probe_rows()
    assert len(rows) == 736 + 1184 + 1184  # 1x8 TP space, 1x8 TP+Ulysses space, 2x8 TP space
    for fname, probe, r in rows:
        if fname not in models:
            models[fname] = model(nodes=probe["nodes"], memory_gib=probe["memory_gb"], max_tp=8,
                                  sp_space=probe["sp_space"])
        n = probe["nodes"] * 8
        sp: SpKind = "ulysses" if r["ulysses"] else ("megatron" if r["tp"] > 1 else None)
        layer = LayerStrategy(tp=r["tp"], dp=r["dp"], sp=sp,
                              zero=(3 if r["fsdp"] else 2) if r["dp"] > 1 else 0,
                              recompute="full" if r["ckpt"] else "none")
        plan = uniform(layer, r["pp"], r["chunks"],
                       EmbeddingStrategy(tp=r["vtp"], dp=n // r["pp"] // r["vtp"], zero=3 if r["embed_sdp"] else 2,
                                         sp="ulysses" if r["vsp"] else None))
        est = models[fname].evaluate(plan)
        assert est.step_time_s == pytest.approx(r["time_s"], rel=1e-9), r
        assert [round(g * 1024, 6) for g in est.memory_gib_per_stage] == r["mem_mb_per_stage"], r
        assert est.fits == (max(r["mem_mb_per_stage"]) <= probe["memory_gb"] * 1024)


def _mixed_plan(rng: random.Random, n: int, layers: int) -> PlanStrategy:
    pp = rng.choice([p for p in (1, 2, 4) if n % p == 0])
    per = n // pp
    options = [LayerStrategy(tp=t, dp=per // t, sp="megatron" if t > 1 else None, zero=z, recompute=r)
               for t in (2, 4) if per % t == 0 for z in (0, 2, 3) for r in ("none", "full")]
    cuts = sorted(rng.sample(range(1, layers), pp - 1))
    stage_layers = tuple(b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True))
    return PlanStrategy(pp=pp, micro_batches=rng.choice([4, 8]),
                        layers=tuple(rng.choice(options) for _ in range(layers)), stage_layers=stage_layers,
                        schedule=rng.choice(["1f1b", "gpipe"]),
                        embedding=EmbeddingStrategy(tp=rng.choice([2, 4]), dp=1, zero=rng.choice([0, 2, 3])))


def test_evaluate_equals_aggregation_of_layer_arrays() -> None:
    """evaluate(plan) == the planner's view: layer_costs over many candidates at once, picked per layer and
    summed per stage, + stage_fixed, through pipeline_step_time and stage memory (mixed per-layer plans,
    uneven stages, both schedules)."""
    rng = random.Random(7)
    models = [model(nodes=2, memory_gib=80, max_tp=4), model(nodes=2, memory_gib=80, max_tp=4, layer_transitions=True)]
    for trial in range(30):
        base = models[trial % 2]
        plan = _mixed_plan(rng, 16, 12)
        m = base.for_plan(plan)
        assert m is base  # max_tp fixed: evaluate aggregates this very model
        est = base.evaluate(plan)
        candidates = sorted(set(plan.layers), key=str)
        times, steps, mems = [], [], []
        first = 0
        for s in range(plan.pp):
            ctx = stage_context(plan, s, 64)
            idx = [candidates.index(x) for x in plan.layers[first:first + plan.stage_layers[s]]]
            costs = [m.layer_costs(first + i, candidates, ctx) for i in range(len(idx))]
            fixed = m.stage_fixed(ctx)
            t = sum(c.time_s[j] for c, j in zip(costs, idx, strict=True)) + fixed.time_s
            trans = m.transition_s(candidates, candidates, ctx)
            t += sum(trans[a, b] for a, b in itertools.pairwise(idx))
            times.append(t)
            steps.append(sum(c.step_time_s[j] for c, j in zip(costs, idx, strict=True)) + fixed.step_time_s)
            mems.append(stage_memory_bytes(
                sum(c.state_bytes[j] for c, j in zip(costs, idx, strict=True)) + fixed.state_bytes,
                sum(c.activation_bytes[j] for c, j in zip(costs, idx, strict=True)) + fixed.activation_bytes,
                m.in_flight_micro_batches(ctx), 0.0, fixed.other_bytes))
            first += plan.stage_layers[s]
        step = m.pipeline_step_time(times, steps, stage_context(plan, 0, 64))
        assert est.step_time_s == pytest.approx(step, rel=1e-12)
        assert sum(est.breakdown_s.values()) == pytest.approx(est.step_time_s, rel=1e-9)
        assert [g * 2**30 for g in est.memory_gib_per_stage] == pytest.approx(mems, rel=1e-12)
        # memory is Galvatron's whole-MB figure
        assert all(abs(x / MB - round(x / MB)) < 1e-6 for x in mems)


def test_pipeline_step_time_is_monotone() -> None:
    m = model(nodes=2)
    ctx = stage_context(uniform(LayerStrategy(tp=2, dp=2, sp="megatron"), 4, 8, EmbeddingStrategy(tp=2, dp=2)),
                        0, 64)
    rng = random.Random(3)
    for _ in range(200):
        t = [rng.uniform(0.1, 1) for _ in range(4)]
        s = [rng.uniform(0, 0.5) for _ in range(4)]
        base = m.pipeline_step_time(t, s, ctx)
        i = rng.randrange(4)
        more_t = [x + (0.05 if j == i else 0) for j, x in enumerate(t)]
        more_s = [x + (0.05 if j == i else 0) for j, x in enumerate(s)]
        assert m.pipeline_step_time(more_t, s, ctx) >= base - 1e-12
        assert m.pipeline_step_time(t, more_s, ctx) >= base - 1e-12


def test_planner_candidates_outside_galvatron_are_infinite() -> None:
    m = model(nodes=2)
    plan = uniform(LayerStrategy(tp=4, dp=4, sp="megatron"), 1, 8, EmbeddingStrategy(tp=8, dp=2))
    ctx = stage_context(plan, 0, 64)
    cands = [LayerStrategy(tp=4, dp=4, zero=2), LayerStrategy(tp=4, dp=4, zero=1),
             LayerStrategy(tp=4, dp=4, recompute="selective"), LayerStrategy(tp=2, dp=4, cp=2),
             LayerStrategy(tp=1, dp=16)]  # tp1: 4 samples per GPU cannot make 8 micro-batches (min_tp is 2)
    c = m.layer_costs(0, cands, ctx)
    assert math.isfinite(c.time_s[0]) and math.isfinite(c.state_bytes[0])
    assert all(math.isinf(x) for x in c.time_s[1:])


def test_shipped_config_evaluates() -> None:
    """Galvatron's shipped plan for llama2-7b on 1x8 at 36 GB, on the reference profiles, with its batch."""
    profiles = os.path.join(REFERENCE, "profiles")
    cfg = read_galvatron_config("galvatron_config_llama2-7b_1nodes_8gpus_per_node_36GB_bf16.json", [profiles])
    req = request(batch=cfg["global_bsz"])
    req["cost_model"].update(profiles_dir=profiles, hardware_dir=os.path.join(REFERENCE, "hardware"))
    m = GalvatronCostModel.from_request(parse(HybridRequest, req))
    est = m.evaluate(plan_from_galvatron_config(cfg, 8))
    assert est.step_time_s > 0 and est.fits
    assert sum(est.breakdown_s.values()) == pytest.approx(est.step_time_s, rel=1e-9)
    # the reference time file lists batch sizes 1..12; Galvatron (static mode) takes the first, bsz 1
    assert m.profile.layer_time.ms_per_sample == 4.396252679824831


@pytest.mark.parametrize(("change", "loc"), [
    ({"cost_model": {"kind": "galvatron", "hardware_dir": HARDWARE}}, ("cost_model", "profiles_dir")),
    ({"cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": HARDWARE, "tp_max": 4}},
     ("cost_model", "tp_max")),
    ({"cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": "/nonexistent"}},
     ("cost_model", "hardware_dir")),
    ({"cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": HARDWARE, "max_tp": 3}},
     ("cost_model", "max_tp")),
    ({"training": {"global_batch_size": 64, "seq_length": 4096}}, ("training", "seq_length")),
    ({"cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": HARDWARE,
                     "time_profile_mode": "batch"}}, ("cost_model", "time_profile_mode")),
    # a min_tp above the GPUs or a TP cap left no layer priced, and planning blamed the memory limit
    ({"cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": HARDWARE, "min_tp": 16}},
     ("cost_model", "min_tp")),
    ({"cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": HARDWARE, "min_tp": 8,
                     "max_tp": 4}}, ("cost_model", "min_tp")),
    ({"constraints": {"memory_limit_gib": 36, "max_tp": 2},
      "cost_model": {"kind": "galvatron", "profiles_dir": PROFILES, "hardware_dir": HARDWARE, "min_tp": 4}},
     ("cost_model", "min_tp")),
])
def test_bad_cost_model_specs_name_the_field(change: dict[str, Any], loc: tuple[str, ...]) -> None:
    req = request()
    req.update(change)
    with pytest.raises(SpecError) as err:
        GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert loc in [p.loc for p in err.value.problems]


def test_min_tp_across_nodes_says_what_is_missing() -> None:
    """On 2x8 GPUs min_tp 16 left every layer unpriced and planning said only "no plan satisfies the
    constraints": TP stays inside a node unless allowed, and the shipped profile stops at tp=8."""
    req = request(nodes=2, min_tp=16, max_tp=16)
    with pytest.raises(SpecError) as err:
        GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert [p.loc for p in err.value.problems] == [("cost_model", "min_tp")]
    assert "constraints.tp_across_nodes" in str(err.value)
    req["constraints"]["tp_across_nodes"] = True
    with pytest.raises(SpecError) as err:
        GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert [p.loc for p in err.value.problems] == [("cost_model", "min_tp")]
    assert "the memory profile covers (8)" in str(err.value)
    req["cost_model"]["min_tp"] = 8  # what the profile covers: priced across nodes
    assert GalvatronCostModel.from_request(parse(HybridRequest, req)).max_tp == 16


def test_plans_galvatron_cannot_express_name_the_field() -> None:
    m = model()
    emb = EmbeddingStrategy(tp=1, dp=8, zero=2)
    bad_layer = uniform(LayerStrategy(tp=1, dp=8, zero=1), 1, 8, emb)
    with pytest.raises(SpecError) as err:
        m.evaluate(bad_layer)
    assert ("strategy", "layers", 0) in [p.loc for p in err.value.problems]
    with pytest.raises(SpecError) as err:
        m.evaluate(uniform(LayerStrategy(tp=1, dp=8, zero=2), 1, 7, emb))
    assert [p.loc for p in err.value.problems] == [("strategy", "micro_batches")]
    with pytest.raises(SpecError) as err:
        m.evaluate(uniform(LayerStrategy(tp=1, dp=8, zero=2), 1, 16, emb))  # 8 per GPU: 16 cannot split
    assert [p.loc for p in err.value.problems] == [("strategy", "micro_batches")]


def test_bounded_pipeline_formula() -> None:
    """Galvatron's formula charges an uneven pipeline less than m x its slowest stage (less than that stage's
    own work); 'bounded' does not, and both agree where the first stage is the slowest."""
    layer = LayerStrategy(tp=2, dp=1, sp="megatron", recompute="full")
    emb = EmbeddingStrategy(tp=2, dp=1, zero=0)
    uneven = PlanStrategy(pp=4, micro_batches=8, layers=(layer,) * 32, stage_layers=(2, 14, 14, 2), embedding=emb)
    even = uniform(layer, 4, 8, emb)
    galv, bounded = model(memory_gib=80, pipeline_formula="galvatron"), model(memory_gib=80)
    g, b = galv.evaluate(uneven), bounded.evaluate(uneven)
    slowest = max(g.stage_time_s)
    assert g.step_time_s < 8 * slowest  # the formula's blind spot
    assert b.step_time_s >= 8 * slowest - 1e-12
    assert sum(g.breakdown_s.values()) == pytest.approx(g.step_time_s, rel=1e-9)
    assert galv.evaluate(even).step_time_s == pytest.approx(bounded.evaluate(even).step_time_s, rel=1e-12)


@pytest.mark.parametrize("nodes,memory_gib,tight", [(1, 36, 0.02), (1, 16, 0.02), (2, 36, 0.02), (2, 16, 0.03)])
def test_plans_under_galvatrons_formula_carry_a_tight_certificate(nodes: int, memory_gib: float,
                                                                   tight: float) -> None:
    """Bounded, the formula charges at least m x the slowest stage, so every configuration has a true bound
    (each embedding strategy on its own, one stage by its (time, step time) segment): the plan is certified
    within 2 % of the best plan of the space (on 2 nodes the pipeline's fill counts: the chain bound; at 16 GB
    the gradient sync that the formula adds past the pipeline too, of the first stage only: 2.2 %, a pp4
    configuration whose later stages' sync the bound leaves out; it read 0.1 % while the relaxation over embedding
    splits kept an unpriced split's infinite memory on the middle stages and so dropped that configuration).
    Galvatron's own formula charges at least every stage once plus the last one's other micro-batches, no
    more: a true certificate, only a looser one."""
    out = solve(request(nodes=nodes, memory_gib=memory_gib))
    gap, bound = out["search"]["optimality_gap"], out["search"]["lower_bound_step_time_s"]
    assert gap is not None and 0 <= gap < tight and bound <= out["estimate"]["step_time_s"]
    raw = solve(request(nodes=nodes, memory_gib=memory_gib, pipeline_formula="galvatron"))
    raw_bound = raw["search"]["lower_bound_step_time_s"]
    assert raw_bound is not None and 0 < raw_bound <= raw["estimate"]["step_time_s"]


def test_single_stage_bound_lies_between_the_relaxed_bound_and_the_solved_stage() -> None:
    """One stage under Galvatron's formula: relaxing time and step time together (the segment bound) is
    never looser than relaxing them apart, never above the solved configuration, and on 2 nodes, where the
    gradient sync weighs, much tighter (2.52 s against 2.25 s for a solved 2.53 s at 8 micro-batches)."""
    req = parse(HybridRequest, request(nodes=2, memory_gib=36))
    cm = make_cost_model(req)
    planner = Planner(cm, build_space(req, "galvatron"), layer_kinds(req.model))
    gains = []
    for cfg in planner.space.pipeline_configs():
        for var in planner.embedding_variants(cfg) if cfg.pp == 1 else []:
            cc = planner.config_costs(var)
            if cc is None:
                continue
            lower, single, solved = planner.lower_bound(cc), planner.single_stage_bound(cc), planner.solve_config(cc)[0]
            assert lower <= single * (1 + 1e-12) and single <= solved * (1 + 1e-12), (var, lower, single, solved)
            gains.append(single / lower - 1)
    assert len(gains) >= 8 and max(gains) > 0.1


def test_chain_bound_of_an_embedding_split_the_model_cannot_price_is_infinite_not_nan() -> None:
    """Some embedding splits Galvatron's model cannot price (an infinite fixed time): the bound with the first
    stage's gradient sync, which takes that time off again, says no plan (inf), never inf - inf."""
    req = parse(HybridRequest, request(nodes=1, memory_gib=16))
    planner = Planner(make_cost_model(req), build_space(req, "galvatron"), layer_kinds(req.model))
    unpriced = 0
    for cfg in planner.space.pipeline_configs():
        for e in planner.space.embedding_options(planner.space.num_gpus // cfg.pp) if cfg.pp > 1 else []:
            cc = planner.config_costs(replace(cfg, embedding=e))
            if cc is None:
                continue
            with np.errstate(invalid="raise"):  # no inf - inf anywhere in the tables
                bound = planner.chain_bound(cc)
            assert not math.isnan(bound)
            if not math.isfinite(cc.stages[0].fixed.time_s):
                unpriced += 1
                assert bound == math.inf
    assert unpriced > 0


def test_hardware_folders_are_searched_in_order() -> None:
    """4x8 GPUs: extrapolated bandwidths, the measured overlap coefficient from the second folder."""
    extrapolated, measured = os.path.join(REFERENCE, "hardware-extrapolated"), os.path.join(REFERENCE, "hardware")
    req = request(nodes=4, batch=256)
    req["cost_model"].update(profiles_dir=os.path.join(REFERENCE, "profiles"), hardware_dir=[extrapolated, measured])
    m = GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert m.hardware.comm_coe["32"] == 1 / load(os.path.join(
        extrapolated, "allreduce_bandwidth_4nodes_8gpus_per_node.json"))["allreduce_size_32_consec_1"]
    assert m.hardware.overlap_coe == load(os.path.join(measured, "overlap_coefficient.json"))["overlap_coe"]
    plan = uniform(LayerStrategy(tp=2, dp=8, sp="megatron", zero=3), 2, 8, EmbeddingStrategy(tp=2, dp=8, zero=2))
    assert m.evaluate(plan).step_time_s > 0
    req["cost_model"]["hardware_dir"] = extrapolated  # it has no overlap coefficient
    with pytest.raises(SpecError) as err:
        GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert err.value.problems[0].loc == ("cost_model", "hardware_dir")


def test_a_budget_above_the_gpus_memory_is_kept_and_named() -> None:
    """Galvatron plans to the budget it is told (its "80 GB" runs budget above the 79.10 GiB an A100-80GB gives
    CUDA): kept as given, but an estimate under a budget above the GPU's memory says so, and one within does not."""
    assert model(memory_gib=200).memory_limit_bytes == 200 * 2**30
    strategy = {"tp": 8, "pp": 1, "dp": 1, "micro_batch_size": 8}
    over = estimate({**request(memory_gib=200), "strategy": strategy})
    assert any("memory_limit_gib = 200 GiB is more than the A100-80GB's 79.10 GiB" in n for n in over["notes"])
    within = estimate({**request(memory_gib=36), "strategy": strategy})
    assert not any("memory_limit_gib" in n for n in within["notes"])



@pytest.mark.parametrize("value", [1e308, float("nan"), "fast", -1.0])
def test_a_profiled_number_that_is_no_measurement_is_named(tmp_path: Any, value: Any) -> None:
    """A profiled time of 1e308 ms priced every plan at inf, and planning answered "no legal strategy for this
    model on this cluster" (the estimate printed `Infinity`, which is not JSON); "fast" raised ValueError."""
    from tests.contract_json import estimate as api_estimate
    from tests.contract_json import solve as api_solve

    name = "computation_profiling_bf16_hidden4096_head32_seqlen2048.json"
    for f in os.listdir(PROFILES):
        doc = load(os.path.join(PROFILES, f))
        if f == name:
            doc["layertype_0_bsz8_seq2048"] = value
        (tmp_path / f).write_text(json.dumps(doc))
    req = request(batch=8)
    req["cost_model"]["profiles_dir"] = str(tmp_path)
    for call in (lambda: api_solve(req), lambda: api_estimate({**req, "strategy": {"tp": 2, "pp": 2}})):
        with pytest.raises(SpecError) as err:
            call()
        assert [p.loc for p in err.value.problems] == [("cost_model", "profiles_dir")]
        assert "'layertype_0_bsz8_seq2048'" in str(err.value), err.value


MEMORY_FILE = "memory_profiling_bf16_hidden4096_head32_seqlen2048.json"


@pytest.mark.parametrize(("folder", "name", "damage"), [
    (PROFILES, MEMORY_FILE, lambda d: d["other_memory_pp_off_sp"].update({"2048": None})),
    (PROFILES, MEMORY_FILE, lambda d: d["other_memory_pp_on_last_sp"]["2048"].pop("model_states")),
    (PROFILES, MEMORY_FILE, lambda d: d["other_memory_pp_on_first_sp"]["2048"].update({"activation": [1, 2]})),
    (PROFILES, MEMORY_FILE, lambda d: d["layertype_0_sp"]["2048"].pop("tp_activation_per_bsz_dict")),
    (PROFILES, MEMORY_FILE, lambda d: d["layertype_0_sp"]["2048"].update({"tp_activation_per_bsz_dict": 3})),
    (PROFILES, MEMORY_FILE, lambda d: d["layertype_0_sp"]["2048"].pop("parameter_size")),
    (HARDWARE, "p2p_bandwidth_1nodes_8gpus_per_node.json", lambda d: d.update({"pp_size_x": 100})),
    (HARDWARE, "sp_time_1nodes_8gpus_per_node.json", lambda d: d.update({"allreduce_size_8_xMB_time": 1})),
])
def test_a_damaged_galvatron_file_is_named(tmp_path: Any, folder: str, name: str, damage: Any) -> None:
    """A key of a profile or hardware file holding null, a list or a number where an object belongs, a missing
    key, or a key not in Galvatron's pattern raised TypeError / KeyError / AttributeError / ValueError."""
    for f in os.listdir(folder):
        doc = load(os.path.join(folder, f))
        if f == name:
            damage(doc)
        (tmp_path / f).write_text(json.dumps(doc))
    req = request(sp_space="tp+sp")
    req["cost_model"]["profiles_dir" if folder == PROFILES else "hardware_dir"] = str(tmp_path)
    with pytest.raises(SpecError) as err:
        GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert [p.loc for p in err.value.problems] == [("cost_model", "profiles_dir" if folder == PROFILES
                                                    else "hardware_dir")]


@pytest.mark.parametrize("name", [MEMORY_FILE, "allreduce_bandwidth_1nodes_8gpus_per_node.json",
                                  "p2p_bandwidth_1nodes_8gpus_per_node.json", "sp_time_1nodes_8gpus_per_node.json"])
@pytest.mark.parametrize("doc", [None, [], 3])
def test_a_galvatron_file_that_is_no_object_is_named(tmp_path: Any, name: str, doc: Any) -> None:
    """A profile or hardware file holding null, a list or a number raised TypeError / AttributeError."""
    folder = PROFILES if name == MEMORY_FILE else HARDWARE
    for f in os.listdir(folder):
        (tmp_path / f).write_text(json.dumps(doc if f == name else load(os.path.join(folder, f))))
    req = request(sp_space="tp+sp", profile_name="hidden4096_head32_seqlen2048")
    req["cost_model"]["profiles_dir" if folder == PROFILES else "hardware_dir"] = str(tmp_path)
    with pytest.raises(SpecError) as err:
        GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert "not a JSON object" in str(err.value) or "lacks" in str(err.value)


def test_zero1_on_unreplicated_weights_is_zero0_for_the_embedding_too() -> None:
    """ZeRO-1 on a single-replica embedding was refused while single-replica layers took it, so constraints.zero
    = 1 left no embedding and planning answered that the leanest plan was "within a memory bin" of the limit."""
    from tests.contract_json import estimate as api_estimate
    from tests.contract_json import solve as api_solve

    req = request(batch=8)
    req["constraints"]["zero"] = 1
    assert api_estimate({**req, "strategy": {"tp": 8, "zero": 1}})["fits"]
    with pytest.raises(SpecError) as err:  # replicated weights still have no ZeRO-1 in Galvatron
        api_estimate({**req, "strategy": {"tp": 2, "zero": 1}})
    assert ("strategy", "embedding") in [p.loc for p in err.value.problems]
    out = api_solve({**req, "constraints": {**req["constraints"], "max_pp": 1}})
    assert out["strategy"]["embedding"] == {"tp": 8, "dp": 1, "zero": 1}
    assert {layer["dp"] for layer in out["strategy"]["layers"]} == {1}


def test_an_interleaved_schedule_constraint_is_refused_at_its_field() -> None:
    """Galvatron's model prices no interleaved plan, so constraints.schedule = "interleaved" searched an empty space
    and was refused at constraints.memory_limit_gib ("no legal strategy for this model on this cluster")."""
    req = request(batch=8)
    req["constraints"]["schedule"] = "interleaved"
    with pytest.raises(SpecError) as err:
        solve(req)
    assert [p.loc for p in err.value.problems] == [("constraints", "schedule")]


def test_an_unreadable_galvatron_file_or_folder_is_named(tmp_path: Any) -> None:
    """A profile nested too deeply raised RecursionError, a profiles_dir with a NUL byte ValueError, and a FIFO in
    the hardware folder blocked the request for good."""
    for f in os.listdir(PROFILES):
        (tmp_path / f).write_text("[" * 100_000 + "]" * 100_000 if f == MEMORY_FILE else
                                  json.dumps(load(os.path.join(PROFILES, f))))
    hardware = tmp_path / "hardware"
    hardware.mkdir()
    for f in os.listdir(HARDWARE):
        if f != "overlap_coefficient.json":
            (hardware / f).write_text(json.dumps(load(os.path.join(HARDWARE, f))))
    os.mkfifo(hardware / "overlap_coefficient.json")
    for change, loc in (({"profiles_dir": str(tmp_path)}, "profiles_dir"), ({"profiles_dir": "a\0b"}, "profiles_dir"),
                        ({"hardware_dir": str(hardware)}, "hardware_dir")):
        req = request()
        req["cost_model"].update(change)
        with pytest.raises(SpecError) as err:
            GalvatronCostModel.from_request(parse(HybridRequest, req))
        assert [p.loc for p in err.value.problems] == [("cost_model", loc)]


@pytest.mark.parametrize(("times", "loc", "why"), [
    ({f"layertype_{t}_{c}_bsz0_seq2048": 5.0 for t in ("0", "other") for c in "abcdefgh"},
     ("cost_model", "profiles_dir"), "a batch of 0 samples"),
    ({f"layertype_{t}_{c}_bsz8_seq2048": 5.0 for t in ("0", "other") for c in "abcdefgh"},
     ("cost_model", "time_profile_mode"), "the profile has 1"),
])
def test_batch_mode_needs_distinct_nonzero_batch_sizes(tmp_path: Any, times: dict[str, float],
                                                       loc: tuple[str, ...], why: str) -> None:
    """Batch mode counted keys, not batch sizes: eight keys of one batch size passed and fitted an arbitrary line
    (four times the static estimate), eight of batch size 0 raised numpy's LinAlgError."""
    for f in os.listdir(PROFILES):
        (tmp_path / f).write_text(json.dumps(times if f.startswith("computation") else load(os.path.join(PROFILES, f))))
    req = request(profiles_dir=str(tmp_path), time_profile_mode="batch")
    with pytest.raises(SpecError) as err:
        GalvatronCostModel.from_request(parse(HybridRequest, req))
    assert [p.loc for p in err.value.problems] == [loc]
    assert why in str(err.value)


def test_a_batch_fit_below_zero_costs_nothing_rather_than_less(tmp_path: Any) -> None:
    """A batch-mode line fitted to times that fall with the batch went below zero for larger batches, and
    planning returned a negative step time."""
    times = {f"layertype_{t}_bsz{b}_seq2048": 100.0 / b**2 for t in ("0", "other") for b in range(1, 9)}
    for f in os.listdir(PROFILES):
        (tmp_path / f).write_text(json.dumps(times if f.startswith("computation") else load(os.path.join(PROFILES, f))))
    m = model(profiles_dir=str(tmp_path), time_profile_mode="batch")
    assert m.profile.layer_time.fit is not None and m.profile.layer_time.fit.slope < 0
    assert m.profile.layer_time.batch_ms(64) == 0.0
    plan = uniform(LayerStrategy(tp=1, dp=8, zero=2), 1, 1, EmbeddingStrategy(tp=1, dp=8, zero=2))
    assert model(profiles_dir=str(tmp_path), time_profile_mode="batch", memory_gib=1e4).evaluate(plan).step_time_s > 0


def test_an_sp_time_fit_below_zero_costs_nothing_rather_than_less(tmp_path: Any) -> None:
    """sp_time all-reduce times that fall with the message size fitted a line below zero for messages larger than
    any profiled (sp_space "tp+sp"), and estimates came out with negative step times."""
    for f in os.listdir(HARDWARE):
        doc = load(os.path.join(HARDWARE, f))
        if f == "sp_time_1nodes_8gpus_per_node.json":
            doc = {k: 1000.0 / int(k.split("_")[-2][:-2]) for k in doc}
        (tmp_path / f).write_text(json.dumps(doc))
    req = request(batch=1536, memory_gib=1e4, sp_space="tp+sp")
    req["cost_model"]["hardware_dir"] = str(tmp_path)
    est = estimate({**req, "strategy": {"tp": 8, "micro_batch_size": 512}})
    assert est["step_time_s"] > 0 and all(v >= 0 for v in est["breakdown_s"].values())


def test_no_legal_galvatron_strategy_is_not_blamed_on_the_memory_limit() -> None:
    """min_tp 16 on 16 GPUs leaves Galvatron's model no strategy it prices; the refusal was put at
    constraints.memory_limit_gib, though no memory limit would help (then at constraints, "no legal
    strategy"; now at min_tp, with what is missing)."""
    req = request(nodes=2, min_tp=16)
    with pytest.raises(SpecError) as err:
        solve(req)
    [problem] = err.value.problems
    assert problem.loc == ("cost_model", "min_tp") and "a node's 8 GPUs" in problem.msg, problem
