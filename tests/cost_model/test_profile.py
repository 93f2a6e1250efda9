"""A measured profile overrides the analytic layer and collective times exactly where it has data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from solvers.api import estimate
from solvers.cost_model.aggregate import stage_context
from solvers.cost_model.base import StageContext
from solvers.cost_model.factory import make_cost_model
from solvers.cost_model.profile import CollectiveTime, Profile
from solvers.errors import SpecError
from solvers.request import HybridRequest, parse
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy

from .conftest import request

PROFILE = {
    "name": "test",
    "layer_times": [
        {"batch": 1, "seq": 2048, "tp": 1, "forward_ms": 10.0, "backward_ms": 21.0},
        {"batch": 3, "seq": 2048, "tp": 1, "forward_ms": 26.0, "backward_ms": 53.0},
        {"batch": 2, "seq": 2048, "tp": 2, "forward_ms": 9.0},
    ],
    "collectives": [
        {"op": "allreduce", "group_size": 2, "message_bytes": 1e6, "time_ms": 0.11},
        {"op": "allreduce", "group_size": 2, "message_bytes": 3e6, "time_ms": 0.31},
    ],
}


def _models(profile: Mapping[str, Any]) -> tuple[Any, Any]:
    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})
    plain = make_cost_model(parse(HybridRequest, {**base, "cost_model": {"calibration": {"tp_overlap": 0}}}))
    # no hiding of the backward all-reduce, so that the TP time is exactly four measured all-reduces
    prof = make_cost_model(parse(HybridRequest, {**base, "cost_model": {"kind": "profile", "profile": profile,
                                                                        "calibration": {"tp_overlap": 0}}}))
    return plain, prof


def _ctx(samples_per_mb: int) -> StageContext:
    plan = PlanStrategy(pp=1, micro_batches=64 // samples_per_mb, layers=(LayerStrategy(),) * 4, stage_layers=(4,))
    return stage_context(plan, 0, 64)


def test_profiled_layer_times_replace_the_analytic_compute() -> None:
    plain, prof = _models(PROFILE)
    ctx = _ctx(16)  # 16 samples per micro-batch
    cands = [LayerStrategy(tp=1, dp=8), LayerStrategy(tp=2, dp=4), LayerStrategy(tp=4, dp=2),
             LayerStrategy(tp=2, dp=4, sp="ulysses"), LayerStrategy(tp=1, dp=4, cp=2)]
    got = prof.layer_costs(0, cands, ctx)
    ref = plain.layer_costs(0, cands, ctx)
    # tp=1, 2 samples per rank: forward on the line through (1, 10 ms), (3, 26 ms) -> 18 ms; backward 37 ms
    assert got.parts_s["compute"][0] == pytest.approx(0.018 + 0.037)
    # tp=2, 4 samples per rank, one point at batch 2: proportional -> 18 ms forward, 36 ms backward
    assert got.parts_s["compute"][1] == pytest.approx(0.018 + 0.036)
    # tp=4 was not profiled: the analytic time, raised to the measured tp=1 layer's at the same 8 samples a rank
    # split 4 ways (forward 10 + 8 x 7 = 66 ms, backward 21 + 16 x 7 = 133 ms, / 4), which is above it here
    assert ref.parts_s["compute"][2] < 0.0165 + 0.03325
    assert got.parts_s["compute"][2] == pytest.approx(0.0165 + 0.03325)
    # Ulysses 2 and cp 2, 4 samples per rank: the work of the tp=1 layer at 2 samples (its 18 + 37 ms)
    for i in (3, 4):
        assert got.parts_s["compute"][i] == pytest.approx(0.018 + 0.037)
        assert got.parts_s["compute"][i] != pytest.approx(ref.parts_s["compute"][i])
    # TP all-reduce on 2 GPUs: 0.01 ms + 1e-7 ms/byte; 2 forward + 2 backward of a 4 x 2048 x 4096 x 2 B message
    msg = 4 * 2048 * 4096 * 2
    assert got.parts_s["tp_comm"][1] == pytest.approx(4 * (0.01 + 1e-7 * msg) / 1e3, rel=1e-6)
    assert got.parts_s["tp_comm"][2] == pytest.approx(ref.parts_s["tp_comm"][2])  # no 4-GPU samples
    np.testing.assert_allclose(got.state_bytes, ref.state_bytes)  # memory is not what a profile measures


def test_layer_times_are_interpolated_between_the_measured_batches() -> None:
    """A GPU layer's time is flat while the host issuing its kernels is the bottleneck and linear in the batch above
    (vTrain's A100 runs: 3.4, 5.0, 9.1, 16.7 ms per layer and micro-batch at 1, 2, 4, 8 samples); a profile that
    measured the batch a plan runs prices it at that measurement, not on one line through all the batches."""
    points = {1: 3.0, 2: 3.1, 4: 5.0, 8: 9.0}
    prof = Profile.model_validate({"layer_times": [{"batch": b, "seq": 2048, "tp": 1, "forward_ms": ms}
                                                   for b, ms in points.items()]})

    def at(batch: float, backward: bool = False) -> float:
        return 1e3 * float(prof.layer_s(np.array([batch]), 2048, np.array([1.0]), backward=backward)[0])

    for b, ms in points.items():
        assert at(b) == pytest.approx(ms) and at(b, backward=True) == pytest.approx(2 * ms)
    assert at(3) == pytest.approx((3.1 + 5.0) / 2)  # between two batches, on the line through them
    assert at(16) == pytest.approx(9.0 + 8 * (9.0 - 5.0) / 4)  # beyond: the last segment's line
    slope, intercept = np.polyfit(list(points), list(points.values()), 1)  # the negative control: the line it replaced
    assert abs(intercept + slope - 3.0) / 3.0 > 0.1

    # through the cost model: 8 samples a micro-batch over dp 8 / 4 / 2 / 1 ranks = 1 / 2 / 4 / 8 samples a rank
    _, model = _models({"layer_times": prof.model_dump()["layer_times"]})
    cands = [LayerStrategy(tp=1, dp=d) for d in (8, 4, 2, 1)]
    got = model.layer_costs(0, cands, _ctx(8)).parts_s["compute"]
    np.testing.assert_allclose(got, [3 * points[b] / 1e3 for b in (1, 2, 4, 8)])


def test_a_measured_layer_carries_its_own_host_time() -> None:
    """The profiler times a layer as it runs, the host's issuing of its kernels included: the analytic floor for
    the host (``kernel_overhead_s`` a pass) is not added to a measured layer again, only to one priced
    analytically."""
    base = request(model={"name": "small", "num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
                          "vocab_size": 32000},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
                   training={"global_batch_size": 8, "seq_length": 512})
    strategy = {"tp": 1, "dp": 8, "micro_batch_size": 1}
    profile = {"layer_times": [{"batch": 1, "seq": 512, "tp": 1, "forward_ms": 0.05}]}

    def launch(cost_model: dict[str, Any]) -> float:
        return float(estimate({**base, "strategy": strategy, "cost_model": cost_model}).to_json()["breakdown_s"]
                     .get("launch_overhead", 0.0))

    assert launch({"kind": "analytic"}) > 4 * 3 * 0.5e-3  # a layer this small waits for the host: the floor applies
    assert launch({"kind": "profile", "profile": profile}) == 0.0  # measured: the 0.15 ms a layer is what it took
    tp2 = estimate({**base, "strategy": {**strategy, "tp": 2, "dp": 4},
                    "cost_model": {"kind": "profile", "profile": profile}}).to_json()["breakdown_s"]
    assert tp2["launch_overhead"] > 0  # tp 2 was not measured: priced analytically, floor and all


def test_a_measured_head_replaces_the_formula_and_its_exchanges() -> None:
    """The LM head and loss as the runtime ran them (vocabulary-parallel, their exchanges included): the last
    stage's head costs its measured time a micro-batch, no all-reduce priced beside it; a head layout the profile
    lacks is priced by the formula and named."""
    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})

    def with_head(forward_ms: float, backward_ms: float) -> dict[str, Any]:
        return {**PROFILE, "head_times": [
            {"batch": 2, "seq": 2048, "tp": 2, "forward_ms": forward_ms, "backward_ms": backward_ms},
            {"batch": 4, "seq": 2048, "tp": 2, "forward_ms": 8.0}]}  # (backward: twice the forward)

    def stage(profile: Mapping[str, Any], mbs: int) -> dict[str, float]:
        """pp 1, tp 2 x dp 4: the one stage holds embedding and head, each rank ``mbs`` samples a micro-batch."""
        req = parse(HybridRequest, {**base, "cost_model": {"kind": "profile", "profile": profile}})
        plan = PlanStrategy(pp=1, micro_batches=64 // (4 * mbs), layers=(LayerStrategy(tp=2, dp=4),) * 4,
                            stage_layers=(4,), embedding=EmbeddingStrategy(tp=2))
        return make_cost_model(req).stage_fixed(stage_context(plan, 0, 64)).parts_s

    plain, fast, slow = stage(PROFILE, 2), stage(with_head(5.0, 10.0), 2), stage(with_head(15.0, 30.0), 2)
    assert slow["compute"] - fast["compute"] == pytest.approx(0.030)  # the measured 45 ms against 15 ms
    # the embedding's forward all-reduce stays; the head's input-gradient and loss all-reduces are in its time
    assert fast["tp_comm"] == pytest.approx(slow["tp_comm"]) and 0 < fast["tp_comm"] < plain["tp_comm"]
    lookup = fast["compute"] - 0.015  # the embedding's share, in proportion to the tokens
    assert stage(with_head(5.0, 10.0), 4)["compute"] == pytest.approx(2 * lookup + 0.024)  # the batch-4 point

    def head_notes(profile: Mapping[str, Any], tp: int) -> list[str]:
        notes = estimate({**base, "strategy": {"tp": tp, "dp": 8 // tp, "micro_batch_size": 2},
                          "cost_model": {"kind": "profile", "profile": profile}}).to_json()["notes"]
        return [n for n in notes if n.startswith("the LM head the profile did not measure")]

    assert head_notes(with_head(5.0, 10.0), 2) == []
    assert head_notes(with_head(5.0, 10.0), 4) == [
        "the LM head the profile did not measure (tp 4 at seq 2048): estimated by the formula"]
    assert head_notes(PROFILE, 4) == []  # a profile without head times: the formula, as before


@pytest.mark.parametrize("forward_ms", [-1, float("inf"), 1e308])  # 1e308 ms priced every plan at inf
def test_bad_profiles_name_the_field(forward_ms: float) -> None:
    bad = {**PROFILE, "layer_times": [{"batch": 1, "seq": 2048, "forward_ms": forward_ms}]}
    with pytest.raises(SpecError) as err:
        _models(bad)
    assert err.value.problems[0].loc == ("cost_model", "profile", "layer_times", 0, "forward_ms")
    with pytest.raises(SpecError) as err:
        make_cost_model(parse(HybridRequest, request(cost_model={"kind": "profile"})))
    assert err.value.problems[0].loc == ("cost_model", "profile")


@pytest.mark.parametrize(("content", "path", "why"), [
    (b"\xff\xfe{}", None, "not UTF-8 text"),
    (b"[" * 100_000 + b"]" * 100_000, None, "nested too deeply"),
    (None, "/dev/zero", "not a regular file"),
    (None, "a\0b", "must be the path"),
    (None, 3, "must be the path"),
])
def test_an_unreadable_profile_path_is_named(tmp_path: Any, content: bytes | None, path: Any, why: str) -> None:
    """A profile_path to a file that is not UTF-8 or nested too deeply raised UnicodeDecodeError / RecursionError,
    one with a NUL byte ValueError, and /dev/zero was read without end."""
    if content is not None:
        path = tmp_path / "profile.json"
        path.write_bytes(content)
        path = str(path)
    req = request(cost_model={"kind": "profile", "profile_path": path})
    with pytest.raises(SpecError) as err:
        make_cost_model(parse(HybridRequest, req))
    assert [p.loc for p in err.value.problems] == [("cost_model", "profile_path")]
    assert why in str(err.value)


@pytest.mark.parametrize(("section", "field"), [("layer_times", "batch"), ("collectives", "message_bytes")])
def test_a_size_too_small_to_fit_is_named(section: str, field: str) -> None:
    """Two layer times at batches 1e-300 and 2e-300 (or collectives at such message sizes) underflowed the
    least-squares fit, which raised numpy's LinAlgError."""
    entry = PROFILE[section][0]
    bad = {**PROFILE, section: [{**entry, field: 1e-300, "forward_ms" if section == "layer_times" else "time_ms": 1e9},
                                {**entry, field: 2e-300}]}
    with pytest.raises(SpecError) as err:
        _models(bad)
    assert err.value.problems[0].loc == ("cost_model", "profile", section, 0, field)


def test_collectives_are_interpolated_between_the_measured_sizes() -> None:
    """gloo's small all-reduces are latency-bound: one least-squares line through all sizes put the 2 MiB TP
    activation 28 % above its own measurement and the loss's 16 KiB exchanges 33 % below theirs."""
    kib = 1024.0
    sizes, ms = [16 * kib, 256 * kib, 2048 * kib, 8192 * kib, 32768 * kib], [6.21, 5.95, 6.97, 21.25, 81.32]
    profile = Profile(collectives=[CollectiveTime(op="allreduce", group_size=4, message_bytes=x, time_ms=t)
                                   for x, t in zip(sizes, ms, strict=True)])

    def at(nbytes: float) -> float:
        return 1e3 * float(profile.collective_s("allreduce", np.array(nbytes), np.array(4.0), np.array(4.0)))

    assert [at(x) for x in sizes] == pytest.approx(ms)  # each measured size gives its measurement back
    assert at(5120 * kib) == pytest.approx((6.97 + 21.25) / 2)  # between two sizes, on the line through them
    assert at(64 * 1024 * kib) == pytest.approx(81.32 + (81.32 - 21.25) * 32 / 24)  # beyond: the last segment's line
    assert at(4 * kib) == pytest.approx(6.21)  # below: the first segment falls (noise), so no cheaper than 16 KiB
    per_byte, latency = np.polyfit(sizes, ms, 1)  # the negative control: the single line this replaced
    assert latency + per_byte * 2048 * kib > 1.25 * at(2048 * kib)
    assert latency + per_byte * 16 * kib < 0.7 * at(16 * kib)
    assert np.isnan(profile.collective_s("allreduce", np.array(1e6), np.array(2.0), np.array(2.0)))  # not measured
    one = Profile(collectives=[CollectiveTime(op="allgather", group_size=2, message_bytes=1e6, time_ms=2.0)])
    assert float(one.collective_s("allgather", np.array(3e6), np.array(2.0), np.array(2.0))) == pytest.approx(6e-3)


def test_a_collective_across_nodes_is_looked_up_by_how_its_ranks_sit_on_the_nodes() -> None:
    """16 ranks over two nodes of 8 and 16 over sixteen nodes of 1 are different collectives: each is priced with
    its own measurement, and one the profile did not measure is NaN (the formula prices it, and the estimate's note
    says so); a point that does not state its nodes (an older profile's) stands for any layout across nodes that no
    point states."""
    def point(nodes: int | None, ms: float) -> CollectiveTime:
        return CollectiveTime(op="allreduce", group_size=16, across_nodes=True, nodes=nodes, message_bytes=1e6,
                              time_ms=ms)

    profile = Profile(collectives=[point(2, 1.0), point(16, 4.0)])
    sizes, per_node = np.array([16.0, 16.0, 16.0, 8.0]), np.array([8.0, 1.0, 4.0, 8.0])
    got = profile.collective_s("allreduce", np.array(1e6), sizes, per_node)
    assert got[:2] == pytest.approx([1e-3, 4e-3]) and np.isnan(got[2:]).all()
    older = Profile(collectives=[point(None, 2.0)])
    assert older.collective_s("allreduce", np.array(1e6), sizes[:3], per_node[:3]) == pytest.approx([2e-3] * 3)
    both = Profile(collectives=[point(2, 1.0), point(None, 2.0)])  # a point that states the layout wins
    assert both.collective_s("allreduce", np.array(1e6), sizes[:3], per_node[:3]) == pytest.approx(
        [1e-3, 2e-3, 2e-3])


def test_a_tensor_parallel_head_is_priced_with_the_exchanges_it_issues() -> None:
    """Every all-reduce costs 5 ms in this profile (latency-bound at every size): a tp = 2 step of L layers on one
    micro-batch pays 4 per layer, 1 for the vocabulary-parallel embedding, 1 for the head input's gradient and 3
    for the vocabulary-parallel cross-entropy (max, sum of exponentials, target logit) — all from the profile."""
    layers = 3
    flat = [{"op": "allreduce", "group_size": 2, "message_bytes": x, "time_ms": 5.0} for x in (1e3, 1e9)]
    req = request(model={"preset": "llama2-7b", "num_layers": layers},
                  cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 2},
                  training={"global_batch_size": 2, "seq_length": 2048},
                  strategy={"tp": 2, "micro_batches": 1},
                  cost_model={"kind": "profile", "profile": {"name": "flat", "collectives": flat},
                              "calibration": {"tp_overlap": 0}})
    breakdown = estimate(req).to_json()["breakdown_s"]
    assert breakdown["tp_comm"] == pytest.approx((4 * layers + 1 + 1 + 3) * 5e-3)


def test_a_layout_the_profile_did_not_measure_is_flagged_and_never_priced_below_perfect_scaling() -> None:
    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})

    def priced(strategy: dict[str, Any], profile: Mapping[str, Any]) -> dict[str, Any]:
        return estimate({**base, "strategy": strategy, "cost_model": {"kind": "profile", "profile": profile}}).to_json()

    def flagged(notes: list[str]) -> list[str]:
        return [n for n in notes if n.startswith("layer layouts the profile did not measure")]

    tp2, tp4 = {"tp": 2, "micro_batch_size": 2}, {"tp": 4, "micro_batch_size": 2}
    assert flagged(priced(tp2, PROFILE)["notes"]) == []  # measured
    got = priced(tp4, PROFILE)
    assert flagged(got["notes"]) == ["layer layouts the profile did not measure, estimated: dense tp 4: the analytic "
                                     "time, at least the profile's tp 1 layer split over the tp ranks"]
    # 16 micro-batches of 2 samples a rank (64 / (2 x dp 2)), 4 layers each at no less than the tp=1 line at 2
    # samples, 18 + 37 ms, split 4 ways (the analytic compute alone is 0.47 s)
    assert got["breakdown_s"]["compute"] >= 16 * 4 * (0.018 + 0.037) / 4
    no_tp1 = {**PROFILE, "layer_times": [r for r in PROFILE["layer_times"] if r["tp"] == 2]}
    assert flagged(priced(tp4, no_tp1)["notes"]) == [
        "layer layouts the profile did not measure, estimated: dense tp 4: the analytic time alone (no tp 1 layer "
        "at seq 2048 in the profile either)"]


def test_a_profile_timed_on_another_stack_says_so() -> None:
    """The worker's profiler times paraplan's runtime (eager elementwise ops, no TP overlap) and says so in the
    profile (``stack``); a request on another stack is priced with those layer times all the same, and says so."""
    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})
    tp2 = {"tp": 2, "micro_batch_size": 2}

    def priced(profile: Mapping[str, Any], stack: Mapping[str, Any] | None = None) -> dict[str, Any]:
        req = base if stack is None else {**base, "training": {**base["training"], "stack": stack}}
        return estimate({**req, "strategy": tp2, "cost_model": {"kind": "profile", "profile": profile}}).to_json()

    def said(notes: list[str]) -> list[str]:
        return [n for n in notes if n.startswith("the profile's layers were timed on another stack")]

    runtime = {**PROFILE, "stack": {"framework": "paraplan"}}
    other = priced(runtime)
    assert said(other["notes"]) == [
        "the profile's layers were timed on another stack (framework paraplan: elementwise eager (this request: "
        "fused), tp_comm_overlap none (this request: backward)): its measured layers are priced as that stack ran "
        "them, not as this request's would run them; ask for the profile's stack (training.stack.framework = "
        "\"paraplan\") or profile the stack you will run"]
    # the measured layers are the same times either way: only the note tells the stacks apart
    assert other["breakdown_s"]["compute"] == priced(PROFILE)["breakdown_s"]["compute"]
    assert said(priced(PROFILE)["notes"]) == []  # a profile that states no stack
    assert said(priced(runtime, {"framework": "paraplan"})["notes"]) == []  # the stack it timed
    # a field the layer does not depend on (the optimizer's sharding) is no difference
    assert said(priced(runtime, {"framework": "paraplan", "distributed_optimizer": False})["notes"]) == []
    with pytest.raises(SpecError) as err:
        priced({**PROFILE, "stack": {"framework": "jax"}})
    assert err.value.problems[0].loc[:4] == ("cost_model", "profile", "stack", "framework")


def test_the_collectives_a_plan_issues_that_the_profile_did_not_measure_are_named() -> None:
    base = request(model={"preset": "llama2-7b", "num_layers": 4},
                   cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})

    def named(strategy: dict[str, Any], profile: Mapping[str, Any]) -> list[str]:
        notes = estimate({**base, "strategy": strategy,
                          "cost_model": {"kind": "profile", "profile": profile}}).to_json()["notes"]
        return [n.split(": ", 1)[1] for n in notes if n.startswith("collectives the profile did not measure")]

    # PROFILE measured all-reduces over 2 GPUs only
    assert named({"tp": 2, "dp": 4, "micro_batch_size": 2, "zero": 0}, PROFILE) == ["all-reduce over 4 GPUs"]
    assert named({"tp": 1, "dp": 8, "micro_batch_size": 2, "zero": 3}, PROFILE) == [
        "all-gather over 8 GPUs, reduce-scatter over 8 GPUs"]  # ZeRO-3 issues no all-reduce of the layers
    more = {**PROFILE, "collectives": [*PROFILE["collectives"],
                                       {"op": "allreduce", "group_size": 4, "message_bytes": 1e6, "time_ms": 0.2}]}
    assert named({"tp": 2, "dp": 4, "micro_batch_size": 2, "zero": 0}, more) == []
    # on two nodes of 8: data parallelism over both nodes' 16 GPUs was measured (8 on each), over 2 GPUs with one on
    # each node (under tp 8) was not; a point that does not state its nodes stands for either
    base = {**base, "cluster": {**base["cluster"], "nodes": 2}}

    def across(size: int, nodes: int | None) -> dict[str, Any]:
        return {"op": "allreduce", "group_size": size, "across_nodes": True, "message_bytes": 1e6, "time_ms": 0.5,
                **({"nodes": nodes} if nodes else {})}

    two_nodes = {**PROFILE, "collectives": [
        *PROFILE["collectives"], *({"op": "allreduce", "group_size": 8, "message_bytes": b, "time_ms": 0.2}
                                   for b in (1e6, 1e8)), across(16, 2)]}
    assert named({"tp": 1, "dp": 16, "micro_batch_size": 1, "zero": 0}, two_nodes) == []
    assert named({"tp": 8, "dp": 2, "micro_batch_size": 1, "zero": 0}, two_nodes) == [
        "all-reduce over 2 GPUs across nodes (1 on each)"]
    older = {**two_nodes, "collectives": [*two_nodes["collectives"], across(2, None)]}
    assert named({"tp": 8, "dp": 2, "micro_batch_size": 1, "zero": 0}, older) == []


def test_a_copy_with_other_times_reads_its_own_not_the_originals_memo() -> None:
    """A profile reads each layout's points once and keeps them; a copy made with other lists (pydantic's
    model_copy shares private attributes) must read its own, and the original keep its."""
    profile = Profile.model_validate(PROFILE)
    batch, tp = np.array([2.0]), np.array([1.0])
    before = profile.layer_s(batch, 2048, tp)
    slower = [x.model_copy(update={"forward_ms": 2 * x.forward_ms}) for x in profile.layer_times]
    copy = profile.model_copy(update={"layer_times": slower,
                                      "collectives": [c.model_copy(update={"time_ms": 2 * c.time_ms})
                                                      for c in profile.collectives]})
    assert copy.layer_s(batch, 2048, tp) == pytest.approx(2 * before)  # (18 ms: between 10 and 26 at batches 1, 3)
    assert profile.layer_s(batch, 2048, tp) == pytest.approx(before) and before[0] == pytest.approx(0.018)
    one = (np.array([2e6]), np.array([2.0]), np.array([2.0]))
    assert copy.collective_s("allreduce", *one) == pytest.approx(2 * profile.collective_s("allreduce", *one))
    assert profile.model_copy().layer_s(batch, 2048, tp) == pytest.approx(before)
