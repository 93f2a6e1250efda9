"""Odd requests found by fuzzing the estimate and plan endpoints: each gets its result or a 422 naming the
field, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.service.requests import REQUESTS

pytestmark = pytest.mark.db
HYBRID = REQUESTS["hybrid"]


def test_estimate_shorthand_with_null_fields(client: Any) -> None:
    """A null field is an absent one (it crashed the shorthand's parser)."""
    given = {"tp": 2, "pp": 2, "micro_batch_size": 2}
    for key in ("tp", "dp", "zero", "virtual_stages", "micro_batches", "ep"):
        absent = {k: v for k, v in given.items() if k != key}
        expected = client.post("/v1/estimate", json={**HYBRID, "strategy": absent})
        r = client.post("/v1/estimate", json={**HYBRID, "strategy": {**given, key: None}})
        assert r.status_code == expected.status_code == 200, (key, r.text)
        assert r.json()["step_time_s"] == expected.json()["step_time_s"]


def test_hf_config_value_of_the_wrong_type(client: Any) -> None:
    t5 = {"model_type": "t5", "num_layers": [2], "d_model": 512, "num_heads": 8}
    req = {**HYBRID, "model": {"hf_config": t5}}
    for path in ("/v1/plans", "/v1/estimate"):
        r = client.post(path, json={**req, "strategy": {"tp": 1}} if path == "/v1/estimate" else req)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "model"] and "hf_config.num_layers" in r.text


def test_estimate_of_a_strategy_with_a_malformed_embedding(client: Any) -> None:
    """(The embedding's zero was never checked: "x" raised ValueError deep in the cost model.)"""
    short = {"tp": 2, "pp": 2, "micro_batch_size": 2}
    for bad, field in (({"tp": 2, "dp": 2, "zero": "x"}, "zero"), ({"tp": 2, "dp": 2, "zero": 7}, "zero"),
                       ({"tp": 2, "dp": 2, "sp": 1}, "sp")):
        r = client.post("/v1/estimate", json={**HYBRID, "strategy": {**short, "embedding": bad}})
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [["body", "strategy", "embedding", field]]


def test_calibration_override_that_would_make_the_estimate_infinite(client: Any) -> None:
    req = {**HYBRID, "cost_model": {"kind": "analytic", "calibration": {"intra_efficiency": 0}}}
    r = client.post("/v1/estimate", json={**req, "strategy": {"tp": 2}})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "cost_model", "calibration", "intra_efficiency"]


def test_a_measured_matmul_above_the_gpus_peak_is_422_naming_the_field(client: Any) -> None:
    """Over HTTP, both endpoints: the GPU field and the reason; the same GPU with a plausible figure is priced and
    the estimate says the share was measured."""
    gpu = {"name": "lab-h100", "peak_tflops": 989, "memory_gib": 79.1}
    for path in ("/v1/plans", "/v1/estimate"):
        req = {**HYBRID, "cluster": {**HYBRID["cluster"], "gpu": {**gpu, "matmul_tflops": 1200}}}
        r = client.post(path, json={**req, "strategy": {"tp": 1}} if path == "/v1/estimate" else req)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"][:3] == ["body", "cluster", "gpu"]
        assert "matmul_tflops 1200 is a measured matmul throughput and cannot exceed peak_tflops 989" in r.text
    ok = {**HYBRID, "cluster": {**HYBRID["cluster"], "gpu": {**gpu, "matmul_tflops": 700}}, "strategy": {"tp": 1}}
    r = client.post("/v1/estimate", json=ok)
    assert r.status_code == 200, r.text
    [used] = r.json()["matmul"]
    assert used["measured"] and used["share_of_peak"] == pytest.approx(700 / 989)


def test_a_profile_path_outside_the_data_roots_is_not_read(client: Any, tmp_path: Any) -> None:
    """(cost_model.profile_path escaped the data-root check: the server read any path and said whether it
    existed and was JSON.)"""
    outside = {**HYBRID, "cost_model": {"kind": "profile", "profile_path": "/etc/passwd"}}
    for path, body in (("/v1/estimate", {**outside, "strategy": {"tp": 2}}), ("/v1/plans", outside)):
        r = client.post(path, json=body)
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [["body", "cost_model", "profile_path"]]
        assert "PARAPLAN_DATA_ROOTS" in r.text and "JSON" not in r.text
    client.app.state.settings.data_roots.append(str(tmp_path))
    inside = {**HYBRID, "cost_model": {"kind": "profile", "profile_path": str(tmp_path / "missing.json")},
              "strategy": {"tp": 2}}
    r = client.post("/v1/estimate", json=inside)  # read (and found missing) by the cost model
    assert r.status_code == 422 and "cannot read" in r.text


def test_a_hardware_dir_list_is_held_to_the_data_roots(client: Any, tmp_path: Any) -> None:
    """(Galvatron's hardware_dir may be a list of directories; a list skipped the data-root check.)"""
    client.app.state.settings.data_roots.append(str(tmp_path))
    cost = {"kind": "galvatron", "profiles_dir": str(tmp_path), "hardware_dir": [str(tmp_path), "/etc"]}
    for path, body in (("/v1/estimate", {**HYBRID, "cost_model": cost, "strategy": {"tp": 2}}),
                       ("/v1/plans", {**HYBRID, "cost_model": cost})):
        r = client.post(path, json=body)
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [["body", "cost_model", "hardware_dir", 1]]
        assert "PARAPLAN_DATA_ROOTS" in r.text


def test_the_layer_limit_counts_the_layers_of_a_hugging_face_config(client: Any) -> None:
    """(A model imported from an HF config.json was not counted: max_layers did not apply to it.)"""
    deep = {"model_type": "llama", "num_hidden_layers": 2000, "hidden_size": 256, "num_attention_heads": 4}
    for path in ("/v1/plans", "/v1/estimate"):
        r = client.post(path, json={**HYBRID, "model": {"hf_config": deep}, "strategy": {"tp": 1}})
        assert r.status_code == 413 and "max_layers" in r.json()["detail"], r.text


@pytest.mark.parametrize(("change", "loc"), [
    ({"constraints": {"micro_batches": 7}}, ["body", "constraints", "micro_batches"]),
    ({"cost_model": {"kind": "flexsp"}}, ["body", "cost_model", "kind"]),
    ({"cost_model": {"kind": "profile"}}, ["body", "cost_model", "profile"]),
    ({"cost_model": {"kind": "analytic", "calibration": {"gemm_eta": 0.5}}},
     ["body", "cost_model", "calibration", "gemm_eta"]),
    # an A100 has no FP8 tensor cores (fp8 was priced at twice its bf16 peak)
    ({"training": {**HYBRID["training"], "precision": "fp8"}}, ["body", "training", "precision"]),
])
def test_a_plan_request_the_solver_would_refuse_is_422_not_a_queued_job(client: Any, change: dict[str, Any],
                                                                      loc: list[Any]) -> None:
    """(Each was queued, 202, and failed in the solver: the error came back only on polling the plan.)"""
    r = client.post("/v1/plans", json={**HYBRID, **change})
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [loc]


@pytest.mark.parametrize("kind", [["hybrid"], {"hybrid": 1}])
def test_a_kind_that_is_not_a_string(client: Any, kind: Any) -> None:
    """(A list or object raised TypeError looking it up in the table of kinds: HTTP 500.)"""
    for path in ("/v1/plans", "/v1/estimate"):
        r = client.post(path, json={**HYBRID, "kind": kind, "strategy": {"tp": 2}})
        assert r.status_code == 422, r.text
        assert [d["loc"] for d in r.json()["detail"]] == [["body", "kind"]]


def test_a_global_batch_of_2_to_the_63_is_refused_not_queued(client: Any) -> None:
    """(It was queued, and its solve ran until the job's time limit.)"""
    r = client.post("/v1/plans", json={**HYBRID, "training": {"global_batch_size": 2**63}})
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", "training", "global_batch_size"]]


def test_an_estimate_array_over_the_limit_is_413_not_cut_short(client: Any) -> None:
    """(Past 1,000 elements the answer silently held the first 1,000 results.)"""
    one = {**HYBRID, "model": {"preset": "gpt3-1.3b", "num_layers": 2}, "strategy": {"tp": 2}}
    client.app.state.settings.max_estimates = 3
    assert len(client.post("/v1/estimate", json=[one] * 3).json()) == 3
    r = client.post("/v1/estimate", json=[one] * 4)
    assert r.status_code == 413 and "max_estimates" in r.json()["detail"], r.text


def test_one_estimate_over_a_limit_costs_the_others_nothing(client: Any) -> None:
    """(One element over max_gpus made the whole array a 413.)"""
    one = {**HYBRID, "model": {"preset": "gpt3-1.3b", "num_layers": 2}, "strategy": {"tp": 2}}
    big = {**one, "cluster": {**one["cluster"], "nodes": 64}}
    client.app.state.settings.max_gpus = 64
    invalid = {**one, "strategy": {"tp": 3}}
    r = client.post("/v1/estimate", json=[one, big, invalid, one])
    assert r.status_code == 200, r.text
    got = r.json()
    assert got[0] == got[3] and got[0]["step_time_s"] > 0
    assert got[1]["status"] == 413 and "max_gpus" in got[1]["error"]
    assert got[2]["status"] == 422 and got[2]["detail"][0]["loc"][0] == "strategy"


def test_a_plan_file_is_not_read_from_the_working_directory_past_the_data_roots(
        client: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """A relative strategy.path was checked as profiles_dir/path, but where that file did not exist the cost model
    read the same name from the server's working directory, outside the data roots, and echoed its content."""
    root, outside = tmp_path / "data", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps({"pp_deg": "TOP-SECRET", "tp_sizes_enc": "1"}))
    monkeypatch.chdir(outside)
    client.app.state.settings.data_roots.append(str(root))
    req = {**HYBRID, "strategy": {"format": "galvatron", "path": "secret.json"},
           "cost_model": {"kind": "galvatron", "profiles_dir": str(root)}}
    r = client.post("/v1/estimate", json=req)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", "strategy", "path"]]
    assert "PARAPLAN_DATA_ROOTS" in r.text and "TOP-SECRET" not in r.text


def test_the_stacks_elementwise_ops_over_http(client: Any) -> None:
    """training.stack.elementwise over HTTP, both endpoints: "eager" is priced (longer compute than fused) and
    stated, a value it does not know is 422 naming the field and the values it takes."""
    def with_elementwise(value: str) -> dict[str, Any]:
        return {**HYBRID, "training": {**HYBRID["training"], "stack": {"elementwise": value}}}

    fused = client.post("/v1/estimate", json={**with_elementwise("fused"), "strategy": {"tp": 2}})
    eager = client.post("/v1/estimate", json={**with_elementwise("eager"), "strategy": {"tp": 2}})
    assert fused.status_code == eager.status_code == 200, eager.text
    assert (fused.json()["stack"]["elementwise"], eager.json()["stack"]["elementwise"]) == ("fused", "eager")
    assert eager.json()["breakdown_s"]["compute"] > fused.json()["breakdown_s"]["compute"]
    for path in ("/v1/plans", "/v1/estimate"):
        req = with_elementwise("compiled")
        r = client.post(path, json={**req, "strategy": {"tp": 2}} if path == "/v1/estimate" else req)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "training", "stack", "elementwise"]
        assert "should be 'fused' or 'eager'" in r.text, r.text
