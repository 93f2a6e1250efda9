"""The estimate API: the three strategy forms, and bad input raising SpecError that names the field."""

from __future__ import annotations

from typing import Any

import pytest

from solvers.errors import SpecError
from tests.contract_json import estimate

from .conftest import request

SHORT = {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "recompute": "selective", "sp": "megatron", "micro_batch_size": 2}


def _locs(req: dict[str, Any]) -> list[tuple[str | int, ...]]:
    with pytest.raises(SpecError) as err:
        estimate(req)
    return [p.loc for p in err.value.problems]


def test_shorthand_and_equivalent_full_strategy_agree() -> None:
    short = estimate(request(strategy=SHORT))
    assert short["step_time_s"] > 0 and short["fits"] is True
    assert set(short["breakdown_s"]) >= {"compute", "tp_comm", "dp_comm_exposed", "pp_bubble", "recompute",
                                         "optimizer"}
    assert set(short["memory_breakdown_gib_per_stage"][0]) >= {"parameters", "gradients", "optimizer",
                                                               "activations", "reserve"}
    full = estimate(request(strategy=short["strategy"]))
    assert full["step_time_s"] == pytest.approx(short["step_time_s"], rel=1e-12)
    assert full["memory_gib_per_stage"] == pytest.approx(short["memory_gib_per_stage"], rel=1e-12)
    assert short["throughput_samples_per_s"] * short["step_time_s"] == pytest.approx(64)


def test_heads_not_divisible_by_tp() -> None:
    req = request(cluster={"gpu": "A100-80GB", "nodes": 3, "gpus_per_node": 8},
                  strategy={"tp": 3, "pp": 1, "dp": 8, "micro_batch_size": 1})
    req["training"]["global_batch_size"] = 48
    assert ("strategy", "tp") in _locs(req)


def test_strategy_gpu_count_must_match_cluster() -> None:
    assert _locs(request(strategy={**SHORT, "dp": 8})) == [("strategy",)]


def test_unknown_preset_and_unknown_fields() -> None:
    assert _locs(request(model={"preset": "gpt-5-mega"}, strategy=SHORT))[0][0] == "model"
    assert ("strategy", "tpp") in _locs(request(strategy={**SHORT, "tpp": 2}))
    assert ("strategy", "micro_batch_size") in _locs(request(strategy={**SHORT, "micro_batch_size": 3}))
    assert _locs(request(strategy=None)) == [("strategy",)]
    # expert fields on a dense model would be ignored without a word
    assert _locs(request(strategy={**SHORT, "ep": 2, "etp": 2})) == [("strategy", "ep"), ("strategy", "etp")]


def test_full_strategy_problems_name_the_layer() -> None:
    good = estimate(request(strategy=SHORT))["strategy"]
    bad = {**good, "layers": [dict(x) for x in good["layers"]]}
    bad["layers"][5]["tp"] = 3
    bad["layers"][7]["recompute"] = "sometimes"
    locs = _locs(request(strategy=bad))
    assert ("strategy", "layers", 5, "tp") in locs
    assert ("strategy", "layers", 7, "recompute") in locs
    assert _locs(request(strategy={**good, "stage_layers": [10, 10]}))[0][0] == "strategy"
    typo = {**good, "layers": [dict(x) for x in good["layers"]]}
    typo["layers"][2]["recompue"] = "full"
    assert _locs(request(strategy=typo)) == [("strategy", "layers", 2, "recompue")]


def test_interleaving_one_stage_is_refused_as_the_planner_refuses_it() -> None:
    """(A one-stage interleaved plan was estimated, and exported as arguments Megatron-LM refuses.)"""
    good = estimate(request(strategy={**SHORT, "pp": 1, "dp": 8}))["strategy"]
    one_stage = {**good, "micro_batches": 4, "schedule": "interleaved", "virtual_stages": 2}
    assert _locs(request(strategy=one_stage)) == [("strategy", "virtual_stages")]
    estimate(request(strategy={**one_stage, "virtual_stages": 1}))  # one chunk: plain 1F1B, as before


def test_calibration_overrides_are_checked_and_used() -> None:
    base = estimate(request(strategy=SHORT))
    slower = estimate(request(strategy=SHORT, cost_model={"kind": "analytic", "calibration": {"gemm_eta_max": 0.4}}))
    assert slower["step_time_s"] > base["step_time_s"] * 1.3
    assert _locs(request(strategy=SHORT, cost_model={"calibration": {"gemm_speed": 1}})) == [
        ("cost_model", "calibration", "gemm_speed")]


def test_over_memory_plan_is_estimated_and_flagged() -> None:
    req = request(strategy={"tp": 1, "pp": 1, "zero": 0, "micro_batch_size": 4},
                  constraints={"memory_limit_gib": 40})
    out = estimate(req)
    assert out["fits"] is False and out["peak_memory_gib"] > 40 and "limit" in out["notes"][0]


def test_non_power_of_two_cluster() -> None:
    model = {"name": "gpt-1.7b", "num_layers": 24, "hidden_size": 2304, "num_attention_heads": 24, "vocab_size": 51200}
    cluster = {"gpu": "H100-SXM", "nodes": 3, "gpus_per_node": 6}
    base = estimate(request(model=model, cluster=cluster, training={"global_batch_size": 36, "seq_length": 2048},
                            strategy={"tp": 3, "pp": 1, "dp": 6, "micro_batch_size": 1}))
    piped = estimate(request(model=model, cluster=cluster, training={"global_batch_size": 36, "seq_length": 2048},
                             strategy={"tp": 3, "pp": 3, "dp": 2, "micro_batch_size": 1}))
    assert base["fits"] and piped["fits"]
    assert piped["strategy"]["stage_layers"] == [8, 8, 8]
    assert piped["breakdown_s"]["pp_bubble"] > 0 == base["breakdown_s"]["pp_bubble"]


def test_unfused_attention_is_named_where_its_scores_dominate_a_layer() -> None:
    """gpt3-1.3b (h 2048, 16 heads, dropout) at seq 4096, tp 2 without SP, one sample per rank (Korthikanti):
    the attention core keeps 5 a s² b / t = 5 x 16 x 4096² / 2 bytes = 0.625 GiB per layer, the rest
    (10 + 24 / t) s b h = 22 x 4096 x 2048 bytes = 0.172 GiB: 78 % of what the layer keeps. Full recompute
    keeps no scores, and flash attention none at all."""
    req = request(model={"preset": "gpt3-1.3b"},
                  training={"global_batch_size": 8, "seq_length": 4096, "stack": {"attention": "unfused"}},
                  strategy={"tp": 2, "pp": 1, "dp": 8, "micro_batch_size": 1, "recompute": "none"})
    note = [n for n in estimate(req)["notes"] if n.startswith("unfused attention")]
    assert len(note) == 1 and "keep 0.62 GiB per layer" in note[0] and "78%" in note[0]
    full = estimate({**req, "strategy": {**req["strategy"], "recompute": "full"}})
    flash = estimate({**req, "training": {**req["training"], "stack": {"attention": "fused"}}})
    assert not any(n.startswith("unfused attention") for n in full["notes"] + flash["notes"])


def test_context_parallel_with_unfused_attention_is_named() -> None:
    """Ring attention ships on fused kernels only: a plan with cp > 1 on an unfused stack says so."""
    req = request(training={"global_batch_size": 16, "seq_length": 4096, "stack": {"attention": "unfused"}},
                  strategy={"tp": 1, "cp": 2, "pp": 1, "dp": 8, "micro_batch_size": 1, "recompute": "full"})
    notes = estimate(req)["notes"]
    assert any(n.startswith("context parallelism priced with unfused") for n in notes)
    flash = estimate({**req, "training": {**req["training"], "stack": {"attention": "fused"}}})
    no_cp = estimate({**req, "strategy": {**req["strategy"], "cp": 1, "dp": 16}})
    assert not any(n.startswith("context parallelism") for n in flash["notes"] + no_cp["notes"])


@pytest.mark.parametrize("key", ["tp", "pp", "dp", "cp", "zero", "virtual_stages", "micro_batch_size",
                                 "micro_batches", "recompute", "lsh", "ep", "etp", "schedule"])
def test_shorthand_field_given_as_null_takes_its_default(key: str) -> None:
    """A JSON null is an absent field (it crashed the shorthand's parser: an HTTP 500)."""
    given = {"tp": 2, "pp": 2, "micro_batch_size": 2}
    expected = estimate(request(strategy={k: v for k, v in given.items() if k != key}))
    assert estimate(request(strategy={**given, key: None})) == expected


FULL = {"pp": 2, "micro_batches": 8, "stage_layers": [16, 16], "layers": [{"tp": 2, "dp": 4}] * 32,
        "embedding": {"tp": 2, "dp": 4, "zero": 1}}


@pytest.mark.parametrize(("strategy", "loc"), [
    ({**FULL, "micro_batches": 8.5}, ("strategy", "micro_batches")),  # was run as 8
    ({**FULL, "pp": "2"}, ("strategy", "pp")),
    ({**FULL, "virtual_stages": "x"}, ("strategy", "virtual_stages")),
    ({**FULL, "stage_layers": [16.5, 15.5]}, ("strategy", "stage_layers")),  # was run as [16, 15]
    ({**FULL, "stage_layers": "16,16"}, ("strategy", "stage_layers")),
    ({**FULL, "embedding": "tp2"}, ("strategy", "embedding")),
    ({**FULL, "embedding": {"tp": 2, "dp": 4, "zero": "x"}}, ("strategy", "embedding", "zero")),  # a ValueError
    ({**FULL, "embedding": {"tp": 2, "dp": 4, "zero": 9}}, ("strategy", "embedding", "zero")),  # was accepted
    ({**FULL, "embedding": {"tp": 2, "dp": 4, "sp": "ring"}}, ("strategy", "embedding", "sp")),  # was accepted
    ({**FULL, "embedding": {"tp": 2, "dp": 4, "zro": 1}}, ("strategy", "embedding", "zro")),
    ({**SHORT, "stage_layers": 5}, ("strategy", "stage_layers")),
    ({**SHORT, "embedding": {"tp": 2, "bogus": 1}}, ("strategy", "embedding", "bogus")),  # was blamed on stage_layers
    ({**SHORT, "embedding": {"tp": 2, "dp": 4, "zero": -1}}, ("strategy", "embedding", "zero")),
    # a layer's lsh was never checked: "y" and [1] crashed the cost model's candidate arrays (an HTTP 500)
    ({**FULL, "layers": [{"tp": 2, "dp": 4, "lsh": "y"}] + [{"tp": 2, "dp": 4}] * 31},
     ("strategy", "layers", 0, "lsh")),
    ({**FULL, "layers": [{"tp": 2, "dp": 4}] * 31 + [{"tp": 2, "dp": 4, "lsh": [1]}]},
     ("strategy", "layers", 31, "lsh")),
])
def test_malformed_strategy_parts_name_their_field(strategy: dict[str, Any], loc: tuple[str, ...]) -> None:
    with pytest.raises(SpecError) as err:
        estimate(request(strategy=strategy))
    assert [p.loc for p in err.value.problems] == [loc]
    assert not any(python in str(err.value) for python in ("int()", "__init__", "argument", "iterable"))


def test_null_parts_of_a_full_strategy_take_their_defaults() -> None:
    est = estimate(request(strategy={**FULL, "embedding": None, "schedule": None, "virtual_stages": None}))
    assert est["strategy"]["embedding"] == {"tp": 1, "dp": 1, "zero": 0} and est["strategy"]["schedule"] == "1f1b"


@pytest.mark.parametrize(("key", "value"), [
    ("gemm_eta_max", 0), ("hbm_efficiency", 0), ("intra_efficiency", 0), ("inter_efficiency", 0),  # divisors
    ("gemm_d_half", float("nan")), ("reserve_gib", float("inf")), ("dp_overlap", 50), ("cp_overlap", 1.5),
    ("flash_attention", True),  # moved to training.stack.attention: named there, not silently ignored
    ("kernel_overhead_s", 1e308), ("step_overhead_s", 1e300),  # finite, but the step time overflowed to inf
])
def test_calibration_overrides_that_would_make_estimates_infinite_or_wrong(key: str, value: Any) -> None:
    """(Each gave inf or NaN times or memory: a response that is not JSON, an HTTP 500.)"""
    assert _locs(request(strategy=SHORT, cost_model={"calibration": {key: value}})) == [
        ("cost_model", "calibration", key)]


@pytest.mark.parametrize(("layer", "shown"), [
    ({"tp": 2, "dp": 4, "zero": 1, "recompute": None}, "got null"),  # was Python's None
    ({"tp": 2, "dp": 4, "zero": 1, "recompute": True}, "got true"),
    ({"tp": 2, "dp": 4, "zero": 1, "recompute": "most"}, 'got "most"'),
])
def test_bad_values_are_shown_as_the_json_that_was_sent(layer: dict[str, Any], shown: str) -> None:
    with pytest.raises(SpecError) as err:
        estimate(request(strategy={**FULL, "layers": [layer] * len(FULL["layers"])}))
    assert shown in str(err.value), str(err.value)
