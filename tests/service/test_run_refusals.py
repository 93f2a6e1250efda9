"""A run is queued only for a plan the worker executes exactly: every plan the runtime would approximate (per-layer
mixes, cp with a sequence not in 2*cp chunks, ZeRO-1, ZeRO-0 with TP or PP, an uneven interleaved split, MoE, bf16
on CPU ranks), and every FlexSP or Spindle plan its runtime cannot follow is refused over HTTP with 422 naming the
plan's field, on both run endpoints; FlexSP and Spindle plans their runtimes run exactly are queued."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from service.db.engine import Database
from service.demo import DEMO_REQUESTS
from tests.contract_json import solve
from tests.service.helpers import store_plan
from tests.worker.plans import REFUSED, plan_doc
from tests.worker.spindle_plans import planned

pytestmark = pytest.mark.db


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_plan_the_worker_would_approximate_is_refused_naming_the_field(
        client: Any, db: Database, make_token: Callable[[str], str], name: str) -> None:
    doc, loc, reason = REFUSED[name]
    plan_id = store_plan(db, doc["request"], doc["result"])
    submit = {"Authorization": f"Bearer {make_token('submit')}"}
    for path, body in ((f"/v1/plans/{plan_id}/runs", {"steps": 3}), ("/v1/runs", {"plan_id": plan_id, "steps": 3})):
        r = client.post(path, json=body, headers=submit)
        assert r.status_code == 422, (name, path, r.text)
        problem = next((p for p in r.json()["detail"] if p["loc"] == ["plan", *loc]), None)
        assert problem is not None and reason in problem["msg"], (name, r.json())
    assert client.get("/v1/runs", params={"plan_id": plan_id}).json() == []  # nothing was queued


def test_a_spindle_plan_is_queued_where_the_runtime_runs_it(client: Any, db: Database) -> None:
    """The Spindle runtime runs module-shaped workloads (``solvers.run_spindle``): the demo's explicit-time plan has
    no model to run and is refused naming the metaop's field; a planned captioning workload is queued (one node,
    its four ranks), without a dataset or checkpoints (its runtime has neither)."""
    request = DEMO_REQUESTS["spindle"]
    plan_id = store_plan(db, request, solve(request), kind="spindle")
    r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3})
    assert r.status_code == 422
    assert [p["loc"] for p in r.json()["detail"]] == [["plan", "request", "workload", "metaops", i, "module"]
                                                      for i in range(len(request["workload"]["metaops"]))]
    doc = planned("captioning")
    plan_id = store_plan(db, doc["request"], doc["result"], kind="spindle")
    for extra, loc in (({"checkpoint_every_steps": 2}, ["body", "checkpoint_every_steps"]),
                       ({"dataset": {"path": "/data/tokens.bin", "dtype": "uint16"}}, ["body", "dataset"])):
        r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3, **extra})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, r.text
    r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3})
    assert r.status_code == 201, r.text
    assert r.json()["nodes_needed"] == 1
    assert r.json()["predicted"]["step_time_s"] == doc["result"]["estimate"]["iteration_time_s"]


def test_a_flexsp_plan_the_runtime_runs_is_queued_and_one_it_cannot_is_refused(client: Any, db: Database) -> None:
    """The FlexSP runtime runs the demo plan (one node, groups within the 32 heads); it takes no checkpoints (422
    naming the run's field), a dataset only with the token that ends its documents (its sequences are the file's
    documents), and CPU ranks compute in fp32 only (422 naming the plan's)."""
    request = DEMO_REQUESTS["flexsp"]
    plan_id = store_plan(db, request, solve(request), kind="flexsp")
    queued = client.post("/v1/runs", json={"plan_id": plan_id, "steps": 20})
    assert queued.status_code == 201, queued.text
    assert queued.json()["predicted"]["step_time_s"] > 0
    for extra, loc in (({"checkpoint_every_steps": 5}, ["body", "checkpoint_every_steps"]),
                       ({"dataset": {"path": "/data/tokens.bin"}}, ["body", "dataset", "document_separator"]),
                       ({"dataset": {"path": "/data/tokens.bin", "document_separator": 10**6}},
                        ["body", "dataset", "document_separator"])):
        r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3, **extra})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, r.text
    dataset = {"path": "/data/tokens.bin", "dtype": "uint32", "document_separator": 2}  # (Llama 2's </s>)
    r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3, "dataset": dataset})
    assert r.status_code == 201 and r.json()["dataset"] == dataset, r.text
    cpu = {"kind": "flexsp", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 4}, "precision": "bf16",
           "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128},
           "batch": {"sequence_lengths": [96, 40, 24, 16, 8]}}
    cpu_id = store_plan(db, cpu, solve(cpu), kind="flexsp")
    r = client.post(f"/v1/plans/{cpu_id}/runs", json={"steps": 3})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["plan", "request", "precision"], r.text


def test_an_exact_plan_is_queued_on_both_endpoints(client: Any, db: Database) -> None:
    doc = plan_doc(tp=2, dp=2, sp="megatron", zero=3, recompute="selective")
    plan_id = store_plan(db, doc["request"], doc["result"])
    a = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3})
    b = client.post("/v1/runs", json={"plan_id": plan_id, "steps": 4})
    assert (a.status_code, b.status_code) == (201, 201), (a.text, b.text)
    assert {r["steps"] for r in client.get("/v1/runs", params={"plan_id": plan_id}).json()} == {3, 4}
    missing = client.post("/v1/runs", json={"steps": 4})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "plan_id"]
    assert client.post("/v1/runs", json={"plan_id": "nope", "steps": 4}).status_code == 404
