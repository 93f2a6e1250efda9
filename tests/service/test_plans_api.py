"""POST/GET /v1/plans, cancel, export, estimate: validation naming the field, limits, deduplication by
content hash (also under concurrency), Idempotency-Key, pagination."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from service import plans
from service.canonical import canonical_json, content_hash
from service.db.engine import Database
from service.db.models import Job, Plan, PlanRequest
from tests.service.helpers import SPINDLE_RESULT, store_plan
from tests.service.requests import REQUESTS

pytestmark = pytest.mark.db
HYBRID = REQUESTS["hybrid"]


def _locs(response: Any) -> list[list[Any]]:
    assert response.status_code == 422, response.text
    return [d["loc"] for d in response.json()["detail"]]


def test_canonical_json_ignores_key_order_and_whitespace() -> None:
    a = {"b": [1, {"y": 2, "x": 1}], "a": "é"}
    b = {"a": "é", "b": [1, {"x": 1, "y": 2}]}
    assert canonical_json(a) == canonical_json(b) == '{"a":"é","b":[1,{"x":1,"y":2}]}'
    assert content_hash(a) == content_hash(b) != content_hash({**a, "a": "e"})


def test_bad_input_is_422_naming_the_field(client: Any) -> None:
    bad_json = client.post("/v1/plans", content=b'{"kind": ', headers={"content-type": "application/json"})
    assert _locs(bad_json)[0][0] == "body"
    assert _locs(client.post("/v1/plans", json=[HYBRID])) == [["body"]]
    assert _locs(client.post("/v1/plans", json={**HYBRID, "kind": "magic"})) == [["body", "kind"]]
    wrong_type = {**HYBRID, "training": {"global_batch_size": "lots", "seq_length": 2048}}
    assert ["body", "training", "global_batch_size"] in _locs(client.post("/v1/plans", json=wrong_type))
    impossible = {**HYBRID, "model": {"preset": "llama2-7b", "num_kv_heads": 5}}
    r = client.post("/v1/plans", json=impossible)
    assert any(loc[:2] == ["body", "model"] for loc in _locs(r)) and "num_kv_heads" in r.text
    typo = {**HYBRID, "cluster": {**HYBRID["cluster"], "gpus_per_nod": 8}}
    assert any("gpus_per_nod" in loc for loc in _locs(client.post("/v1/plans", json=typo)))
    flexsp = {**REQUESTS["flexsp"], "batch": {"sequence_lengths": [-5]}}
    assert any(loc[:2] == ["body", "batch"] for loc in _locs(client.post("/v1/plans", json=flexsp)))
    no_chunks = {**HYBRID, "constraints": {"schedule": "interleaved", "max_virtual_stages": 1}}
    assert ["body", "constraints", "max_virtual_stages"] in _locs(client.post("/v1/plans", json=no_chunks))
    latent = {**HYBRID, "model": {"hf_config": {"model_type": "deepseek_v3", "num_hidden_layers": 2,
                                                "hidden_size": 64, "num_attention_heads": 4, "kv_lora_rank": 16}}}
    r = client.post("/v1/plans", json=latent)
    assert any(loc[:2] == ["body", "model"] for loc in _locs(r)) and "kv_lora_rank" in r.text
    spindle = {**REQUESTS["spindle"], "workload": {"metaops": []}}
    assert any(loc[:2] == ["body", "workload"] for loc in _locs(client.post("/v1/plans", json=spindle)))
    with client.app.state.ctx.db.reading() as s:
        assert plans.count_plans(s) == 0  # nothing invalid was stored


def test_size_limits_are_413_naming_the_limit(client: Any) -> None:
    huge = {**HYBRID, "cluster": {**HYBRID["cluster"], "nodes": 20_000}}
    r = client.post("/v1/plans", json=huge)
    assert r.status_code == 413 and "max_gpus" in r.json()["detail"]
    deep = {**HYBRID, "model": {"preset": "llama2-7b", "num_layers": 4000}}
    assert "max_layers" in client.post("/v1/plans", json=deep).json()["detail"]
    many = {**REQUESTS["flexsp"], "batch": {"sequence_lengths": [128] * 200_001}}
    r = client.post("/v1/plans", json=many)
    assert r.status_code == 413 and "max_sequences" in r.json()["detail"]
    limit = client.app.state.settings.max_body_bytes
    r = client.post("/v1/plans", content=b"[" + b"1," * limit + b"1]", headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_body_bytes" in r.json()["detail"]

    def chunks() -> Any:  # no Content-Length: counted as it streams
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    r = client.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_identical_requests_share_one_plan(client: Any) -> None:
    first = client.post("/v1/plans", json=HYBRID)
    assert first.status_code == 202 and first.json()["status"] == "queued"
    reordered = dict(reversed(list(HYBRID.items())))
    second = client.post("/v1/plans", json=reordered)
    assert second.status_code == 202 and second.json()["id"] == first.json()["id"]
    assert second.headers["location"] == f"/v1/plans/{first.json()['id']}"
    other = client.post("/v1/plans", json={**HYBRID, "training": {"global_batch_size": 16, "seq_length": 2048}})
    assert other.json()["id"] != first.json()["id"]


def test_stored_plan_is_200(client: Any, db: Database) -> None:
    plan_id = store_plan(db, HYBRID)
    r = client.post("/v1/plans", json=HYBRID)
    assert r.status_code == 200 and r.json()["id"] == plan_id and r.json()["status"] == "succeeded"
    got = client.get(f"/v1/plans/{plan_id}").json()
    assert got["request"] == HYBRID and got["result"]["estimate"]["step_time_s"] == 4.2
    assert client.get("/v1/plans/0123").status_code == 404


def test_concurrent_identical_submissions_store_one_plan(db: Database) -> None:
    results: list[tuple[str, bool]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def submit() -> None:
        try:
            barrier.wait()
            view, created = plans.submit_plan(db, HYBRID, "hybrid", 3)
            results.append((view["id"], created))
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({pid for pid, _ in results}) == 1 and sum(created for _, created in results) == 1
    with db.reading() as s:
        counts = [s.execute(select(func.count()).select_from(t)).scalar_one() for t in (Plan, Job, PlanRequest)]
    assert counts == [1, 1, 1]


def test_idempotency_key(client: Any) -> None:
    key = {"Idempotency-Key": "retry-42"}
    a = client.post("/v1/plans", json=HYBRID, headers=key)
    b = client.post("/v1/plans", json=HYBRID, headers=key)
    assert a.json()["id"] == b.json()["id"]
    other = {**HYBRID, "training": {"global_batch_size": 16, "seq_length": 2048}}
    r = client.post("/v1/plans", json=other, headers=key)
    assert r.status_code == 409 and "Idempotency-Key" in r.json()["detail"]


def test_list_filter_and_paginate(client: Any, db: Database) -> None:
    done = store_plan(db, {**HYBRID, "training": {"global_batch_size": 8, "seq_length": 2048}})
    for i in range(4):
        client.post("/v1/plans", json={**HYBRID, "training": {"global_batch_size": 16 * (i + 1), "seq_length": 512}})
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        page = client.get("/v1/plans", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
        seen += [p["id"] for p in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 5 and seen[-1] == done  # newest first
    succeeded = client.get("/v1/plans", params={"status": "succeeded"}).json()["items"]
    assert [p["id"] for p in succeeded] == [done] and succeeded[0]["estimate"]["step_time_s"] == 4.2
    assert client.get("/v1/plans", params={"status": "bogus"}).status_code == 422
    assert client.get("/v1/plans", params={"kind": "flexsp"}).json()["items"] == []


def test_cancel(client: Any, db: Database) -> None:
    plan_id = client.post("/v1/plans", json=HYBRID).json()["id"]
    r = client.post(f"/v1/plans/{plan_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert client.post(f"/v1/plans/{plan_id}/cancel").status_code == 409  # terminal states are final
    assert client.post("/v1/plans/nope/cancel").status_code == 404
    fresh = client.post("/v1/plans", json=HYBRID).json()
    assert fresh["id"] != plan_id and fresh["status"] == "queued"  # a cancelled plan is not reused


def test_wait_returns_202_when_still_queued(client: Any) -> None:
    t0 = time.monotonic()
    r = client.post("/v1/plans", params={"wait": 0.5}, json=HYBRID)
    assert r.status_code == 202 and r.json()["status"] == "queued" and time.monotonic() - t0 >= 0.45


def test_export_rules(client: Any, db: Database) -> None:
    queued = client.post("/v1/plans", json=HYBRID).json()["id"]
    assert client.get(f"/v1/plans/{queued}/export", params={"format": "deepspeed"}).status_code == 409
    spindle = store_plan(db, REQUESTS["spindle"], SPINDLE_RESULT, kind="spindle")
    assert client.get(f"/v1/plans/{spindle}/export", params={"format": "megatron"}).status_code == 409
    assert _locs(client.get(f"/v1/plans/{queued}/export", params={"format": "tf"})) == [["query", "format"]]
    solved = store_plan(db, {**HYBRID, "model": {"preset": "llama2-7b"}})  # the helper's 32-layer tp2 x dp4 plan
    galvatron = client.get(f"/v1/plans/{solved}/export", params={"format": "galvatron"})
    assert galvatron.status_code == 200 and galvatron.json()["pp_deg"] == 1
    assert galvatron.json()["tp_sizes_enc"] == ",".join(["2"] * 32)
    megatron = client.get(f"/v1/plans/{solved}/export", params={"format": "megatron"})
    assert "--tensor-model-parallel-size 2" in megatron.text and megatron.headers["content-type"].startswith("text/")
    assert _locs(client.get(f"/v1/plans/{solved}/export", params={"format": "megatron", "of": "x"})) == [
        ["query", "of"]]
    # a baseline the stored result lacks is a field error, not a server error
    r = client.get(f"/v1/plans/{solved}/export", params={"format": "megatron", "of": "zero3_dp"})
    assert r.status_code == 422 and "zero3_dp" in r.text


def test_export_of_the_megatron_baseline(client: Any, db: Database) -> None:
    """A solved plan's best uniform Megatron-style baseline exports as it is, named in the file name."""
    from tests.contract_json import solve

    result = solve(HYBRID)
    plan_id = store_plan(db, HYBRID, result)
    base = result["baselines"]["megatron"]["strategy"]
    out = client.get(f"/v1/plans/{plan_id}/export", params={"format": "megatron", "of": "megatron"})
    assert out.status_code == 200, out.text
    assert f"--pipeline-model-parallel-size {base['pp']}" in out.text
    assert f"--tensor-model-parallel-size {base['layers'][0]['tp']}" in out.text
    assert "-megatron-megatron." in out.headers["content-disposition"]


def test_estimate(client: Any) -> None:
    req = {**HYBRID, "strategy": {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "recompute": "none", "micro_batch_size": 2}}
    r = client.post("/v1/estimate", json=req)
    assert r.status_code == 200, r.text
    assert r.json()["step_time_s"] > 0 and r.json()["peak_memory_gib"] > 0
    bad = {**req, "strategy": {**req["strategy"], "tp": 3}}
    r = client.post("/v1/estimate", json=bad)
    assert r.status_code == 422 and any("strategy" in loc for loc in _locs(r))
    single = client.post("/v1/estimate", json=req).json()
    both = client.post("/v1/estimate", json=[req, bad]).json()
    assert both[0] == single and "strategy" in both[1]["error"]


def test_server_side_files_only_under_data_roots(client: Any, tmp_path: Any) -> None:
    req = {**HYBRID, "strategy": {"format": "galvatron", "path": "/etc/passwd"}}
    r = client.post("/v1/estimate", json=req)
    assert _locs(r) == [["body", "strategy", "path"]] and "PARAPLAN_DATA_ROOTS" in r.text
    sneaky = {**HYBRID, "cost_model": {"kind": "galvatron", "profiles_dir": str(tmp_path / ".." / "..")}}
    assert _locs(client.post("/v1/plans", json=sneaky)) == [["body", "cost_model", "profiles_dir"]]
    client.app.state.settings.data_roots.append(str(tmp_path))
    inside = {**HYBRID, "strategy": {"format": "galvatron", "path": "missing.json"},
              "cost_model": {"kind": "galvatron", "profiles_dir": str(tmp_path)}}
    r = client.post("/v1/estimate", json=inside)  # allowed through to the cost model, which finds no file
    assert r.status_code == 422 and "PARAPLAN_DATA_ROOTS" not in r.text
