"""Properties of whole plans, the API's errors, estimates and determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers.errors import SpecError
from solvers.flexsp.workloads import gpt7b_request
from tests.contract_json import estimate, solve


def _check_result(result: dict, lengths: list[int], num_gpus: int, gpus_per_node: int, cap_per_gpu: int) -> None:
    placed = []
    for mb in result["micro_batches"]:
        ranks = []
        for g in mb["groups"]:
            first, last = g["ranks"]
            assert last - first + 1 == g["sp"]
            ranks += list(range(first, last + 1))
            # Node-aligned: a group within a node stays in one node; a larger one spans whole nodes.
            if g["sp"] <= gpus_per_node:
                assert first // gpus_per_node == last // gpus_per_node
            else:
                assert first % gpus_per_node == 0 and g["sp"] % gpus_per_node == 0
            assert sum(lengths[i] for i in g["sequences"]) <= g["sp"] * cap_per_gpu  # memory
            assert g["memory_gib"] <= result["estimate"]["memory_limit_gib"] + 1e-9
            placed += g["sequences"]
        assert sorted(ranks) == list(range(num_gpus))  # every GPU exactly once per micro-batch
        assert mb["time_s"] == pytest.approx(max(g["time_s"] for g in mb["groups"]))
    assert sorted(placed) == list(range(len(lengths)))  # every sequence exactly once
    est = result["estimate"]
    assert est["step_time_s"] == pytest.approx(sum(mb["time_s"] for mb in result["micro_batches"]))
    assert est["step_time_s"] == pytest.approx(sum(est["breakdown_s"].values()))
    assert est["step_time_s"] >= result["lower_bound_s"] - 1e-9
    if result["baselines"]["static_sp"]:
        assert est["step_time_s"] <= min(result["baselines"]["static_sp"].values()) + 1e-9


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 28_000), min_size=1, max_size=60),  # 8 GPUs hold 28,824
    shape=st.sampled_from([(1, 8), (2, 4), (2, 8), (4, 2)]),
)
def test_plans_respect_memory_tile_the_cluster_and_place_everything(lengths: list[int], shape: tuple) -> None:
    nodes, gpn = shape
    result = solve(gpt7b_request(lengths, nodes=nodes, gpus_per_node=gpn, memory_gib=30))
    cap = result["cost_model"]["token_capacity_per_gpu"]
    _check_result(result, lengths, nodes * gpn, gpn, cap)


def test_derived_constants_plan_for_another_model_and_cluster() -> None:
    rng = np.random.default_rng(5)
    lengths = [int(x) for x in np.minimum(rng.lognormal(np.log(3000), 1.3, 80), 60_000) + 1]
    req = {"kind": "flexsp", "model": {"preset": "llama3-8b"},
           "cluster": {"gpu": "H100-SXM", "nodes": 2, "gpus_per_node": 8},
           "batch": {"sequence_lengths": lengths}, "constraints": {"memory_limit_gib": 70}}
    result = solve(req)
    assert result["cost_model"]["source"] == "derived"
    _check_result(result, lengths, 16, 8, result["cost_model"]["token_capacity_per_gpu"])


def test_same_input_same_plan() -> None:
    rng = np.random.default_rng(9)
    lengths = [int(x) for x in np.clip(rng.lognormal(np.log(4096), 1.6, 160), 1, 150_000)]
    a, b = solve(gpt7b_request(lengths)), solve(gpt7b_request(lengths))
    assert a["micro_batches"] == b["micro_batches"]


def test_too_long_sequence_is_named() -> None:
    lengths = [1000, 500_000, 2000, 700_000]
    with pytest.raises(SpecError) as err:
        solve(gpt7b_request(lengths))
    locs = [p.loc for p in err.value.problems]
    assert locs == [("batch", "sequence_lengths", 1), ("batch", "sequence_lengths", 3)]
    assert "412736 tokens" in str(err.value)  # 64 GPUs × 6449 tokens


@pytest.mark.parametrize("patch,loc", [
    ({"batch": {"sequence_lengths": [100, -3]}}, ("batch", "sequence_lengths")),
    ({"cost_model": {"kind": "flexsp", "alpha1_ms_per_token2": 1e-6}}, ("cost_model", "alpha2_ms_per_token")),
    ({"constraints": {"memory_limit_gib": 1}}, ("constraints", "memory_limit_gib")),
    ({"solver": {"milp": "gurobi"}}, ("solver", "milp")),
])
def test_bad_input_names_the_field(patch: dict, loc: tuple) -> None:
    req = {**gpt7b_request([1000, 2000]), **patch}
    with pytest.raises(SpecError) as err:
        solve(req)
    assert any(tuple(p.loc[: len(loc)]) == loc for p in err.value.problems), err.value


def test_estimate_of_a_returned_plan_reproduces_its_time() -> None:
    rng = np.random.default_rng(2)
    lengths = [int(x) for x in np.clip(rng.lognormal(np.log(4096), 1.6, 100), 1, 190_000)]
    plan = solve(gpt7b_request(lengths))
    est = estimate({**gpt7b_request(lengths), "micro_batches": plan["micro_batches"]})
    assert est["step_time_s"] == pytest.approx(plan["estimate"]["step_time_s"])
    static = estimate({**gpt7b_request(lengths), "strategy": {"sp": 64}})
    assert static["step_time_s"] == pytest.approx(plan["baselines"]["static_sp"]["64"])
    broken = [dict(mb) for mb in plan["micro_batches"]]
    broken[0] = {"groups": broken[0]["groups"][1:] or [{"sp": 8, "sequences": []}]}
    with pytest.raises(SpecError) as err:
        estimate({**gpt7b_request(lengths), "micro_batches": broken})
    assert err.value.problems[0].loc == ("micro_batches",)
    with pytest.raises(SpecError) as err:  # no plan given: the message spells both forms as JSON, not Python
        estimate(gpt7b_request(lengths))
    assert '"strategy": {"sp": D}' in str(err.value) and "'" not in str(err.value)


def test_plan_says_when_sp_exceeds_the_head_count() -> None:
    wide = solve(gpt7b_request([300_000]))  # needs more than 32 GPUs' memory: SP64, GPT-7B has 32 heads
    assert wide["micro_batches"][0]["groups"][0]["sp"] == 64
    assert any("32 attention heads" in n for n in wide["notes"])
    capped = solve(gpt7b_request([4096, 8192, 100_000], solver={"max_sp": 32}))
    assert capped["notes"] == []
    assert max(g["sp"] for mb in capped["micro_batches"] for g in mb["groups"]) <= 32
    assert "64" not in capped["baselines"]["static_sp"]
    with pytest.raises(SpecError) as err:
        solve(gpt7b_request([300_000], solver={"max_sp": 32}))
    assert err.value.problems[0].loc == ("batch", "sequence_lengths", 0)


def test_non_power_of_two_nodes_tile_with_node_aligned_groups() -> None:
    """3 nodes of 6 GPUs: groups are 1, 2 (dividing a node) or 6, 12 (whole nodes), never straddling."""
    rng = np.random.default_rng(8)
    lengths = [int(x) for x in np.clip(rng.lognormal(np.log(6000), 1.2, 60), 128, 90_000)]
    req = {"kind": "flexsp", "model": {"preset": "llama2-7b"},
           "cluster": {"gpu": "A100-80GB", "nodes": 3, "gpus_per_node": 6},
           "batch": {"sequence_lengths": lengths}, "constraints": {"memory_limit_gib": 60}}
    result = solve(req)
    sizes = {g["sp"] for mb in result["micro_batches"] for g in mb["groups"]}
    assert sizes <= {1, 2, 6, 12}
    _check_result(result, lengths, 18, 6, result["cost_model"]["token_capacity_per_gpu"])


def test_a_memory_limit_above_the_gpus_memory_plans_within_the_gpu_and_says_so() -> None:
    """48 GiB asked of L4s (22 GiB each): the groups are sized for the 22 GiB the GPU has, the same plan as
    without a limit, and the result names the constraint it could not honour."""
    rng = np.random.default_rng(5)
    lengths = [int(x) for x in np.minimum(rng.lognormal(np.log(3000), 1.3, 40), 30_000) + 1]
    req = {"kind": "flexsp", "model": {"preset": "llama3-8b"}, "cluster": {"gpu": "L4", "nodes": 2, "gpus_per_node": 8},
           "batch": {"sequence_lengths": lengths}}
    asked, plain = solve({**req, "constraints": {"memory_limit_gib": 48}}), solve(req)
    assert asked["estimate"]["memory_limit_gib"] == plain["estimate"]["memory_limit_gib"] == 22.0
    assert asked["estimate"]["step_time_s"] == plain["estimate"]["step_time_s"]
    assert any("memory_limit_gib = 48 GiB is more than the L4's 22.00 GiB" in n for n in asked["notes"])
    assert not any("memory_limit_gib" in n for n in plain["notes"])


EXPLICIT = {"kind": "flexsp", "model": {"num_layers": 1, "hidden_size": 4096, "num_attention_heads": 1},
            "cluster": {"gpu": "H200", "nodes": 2, "gpus_per_node": 8},
            "batch": {"sequence_lengths": [2253, 2109, 2042, 3109, 4251, 3394, 1924]},
            "cost_model": {"kind": "flexsp", "alpha1_ms_per_token2": 5.128e-06, "alpha2_ms_per_token": 0.1839576,
                           "beta_ms": 629.3563, "activation_mb_per_token": 4.480441895, "params_billion": 7.117,
                           "alltoall_GBps_by_group_size": {"2": 119.54, "4": 104.07, "8": 96.5, "16": 10.33}}}


@pytest.mark.parametrize(("change", "loc"), [
    # constants near the float limits crashed the planner (a fuzz): OverflowError in the capacity and the cost
    # table, CP-SAT refusing its coefficients, NaN in the filling's lookahead, an empty micro-batch indexed
    ({"params_billion": 1e308}, ("cost_model", "params_billion")),
    ({"activation_mb_per_token": 1e-300}, ("cost_model", "activation_mb_per_token")),
    ({"alpha1_ms_per_token2": 1e300}, ("cost_model", "alpha1_ms_per_token2")),
    ({"alpha2_ms_per_token": 1e300}, ("cost_model", "alpha2_ms_per_token")),
    ({"beta_ms": float("inf")}, ("cost_model", "beta_ms")),
    ({"alltoall_GBps_by_group_size": {"2": 1e-300}}, ("cost_model", "alltoall_GBps_by_group_size")),
    # no work at all: "sequence of 100 tokens fits no SP group" (a ValueError)
    ({"alpha1_ms_per_token2": 0, "alpha2_ms_per_token": 0}, ("cost_model",)),
])
def test_explicit_constants_beyond_physical_ranges_name_the_field(change: dict[str, object],
                                                                  loc: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as err:
        solve({**EXPLICIT, "cost_model": {**EXPLICIT["cost_model"], **change}})
    assert [p.loc for p in err.value.problems] == [loc]


def test_a_sequence_longer_than_any_spec_allows_is_refused() -> None:
    with pytest.raises(SpecError) as err:  # (10^20 tokens overflowed the cost table)
        solve({**EXPLICIT, "batch": {"sequence_lengths": [10**20]}})
    assert [p.loc for p in err.value.problems] == [("batch", "sequence_lengths")]


def test_highs_stopped_at_its_node_limit_leaves_the_heuristic_plan() -> None:
    """PuLP has no status for HiGHS' solution limit: a KeyError escaped solve (an HTTP 500)."""
    out = solve({**EXPLICIT, "solver": {"milp": "highs", "max_nodes": 10, "max_deterministic_time_s": 1e-6}})
    placed = sorted(i for mb in out["micro_batches"] for g in mb["groups"] for i in g["sequences"])
    assert placed == list(range(len(EXPLICIT["batch"]["sequence_lengths"])))
    assert out["estimate"]["step_time_s"] >= out["lower_bound_s"] > 0


def test_a_micro_batch_the_rebalancing_empties_is_dropped() -> None:
    """Moving sequences off the slowest groups emptied a whole micro-batch, which the repacking then indexed
    (IndexError: HTTP 500; a fuzz). The plan keeps every sequence once and re-estimates as planned."""
    req = {**EXPLICIT, "model": {"num_layers": 4096, "hidden_size": 4096, "num_attention_heads": 1},
           "cluster": {"gpu": "H200", "nodes": 8, "gpus_per_node": 1},
           "batch": {"sequence_lengths": [4096, 1048576, 1, 1048576]},
           "cost_model": {**EXPLICIT["cost_model"], "alpha1_ms_per_token2": 1.0, "alpha2_ms_per_token": 0.18,
                          "beta_ms": 0, "activation_mb_per_token": 1e-06, "params_billion": 7.1,
                          "alltoall_GBps_by_group_size": {"4": 0.001, "32": 0.001, "64": 120.0, "8": 5.0}},
           "solver": {"milp": "cbc"}}
    out = solve(req)
    placed = sorted(i for mb in out["micro_batches"] for g in mb["groups"] for i in g["sequences"])
    assert placed == [0, 1, 2, 3] and all(any(g["sequences"] for g in mb["groups"]) for mb in out["micro_batches"])
    again = estimate({**req, "micro_batches": out["micro_batches"]})
    assert again["step_time_s"] == pytest.approx(out["estimate"]["step_time_s"], rel=1e-9)
