"""The worker/run API exactly as agreed with the worker: register, claim with lease, heartbeat, metrics,
complete exactly once, retryable failures, lease expiry, and worker tokens seeing only their runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from service.db.engine import Database
from service.db.models import Run, utcnow
from solvers.api import estimate
from solvers.documents.hybrid import HybridEstimate
from solvers.run_layout import runtime_request
from tests.service.helpers import HYBRID, RESULT, store_plan, variant

pytestmark = pytest.mark.db
WORKER = {"name": "w", "host": "node-1", "gpus": 8, "gpu_name": "A100-80GB", "memory_gib": 80,
          "torch_version": "2.13", "cuda_version": "12.4", "capabilities": {"nccl": True}}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _register(client: Any, token: str) -> str:
    r = client.post("/v1/workers/register", json=WORKER, headers=_auth(token))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["lease_s"] > 0 and 0 < body["heartbeat_interval_s"] < body["lease_s"]
    return str(body["id"])


def test_run_lifecycle(client: Any, db: Database, make_token: Callable[[str], str]) -> None:
    submit, worker_token = make_token("submit"), make_token("worker")
    plan_id = store_plan(db)
    r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 5}, headers=_auth(submit))
    assert r.status_code == 201 and r.json()["status"] == "queued"
    run_id = r.json()["id"]
    # predicted for what runs it: the plan's strategy on the runtime's stack (eager elementwise ops, the gradient
    # sync after the backward), which costs more than the default stack the plan's request was priced for
    strategy = RESULT["strategy"]
    runtime = estimate({**runtime_request(HYBRID), "strategy": strategy})
    default = estimate({**HYBRID, "strategy": strategy})
    assert isinstance(runtime, HybridEstimate) and isinstance(default, HybridEstimate)
    predicted = r.json()["predicted"]
    assert predicted["step_time_s"] == runtime.step_time_s > default.step_time_s
    assert predicted["peak_memory_gib"] == runtime.peak_memory_gib
    assert predicted["plan_step_time_s"] == 4.2  # the stored plan's own figure, for its own stack
    assert predicted["calibration_set"] == {"name": None, "version": None, "chosen_by": "shipped"}
    assert {k: predicted["stack"][k] for k in ("framework", "elementwise", "dp_overlap", "tp_comm_overlap")} == {
        "framework": "paraplan", "elementwise": "eager", "dp_overlap": False, "tp_comm_overlap": "none"}

    wid = _register(client, worker_token)
    assert client.post(f"/v1/workers/{wid}/heartbeat", headers=_auth(worker_token)).json() == {"ok": True}
    claim = client.post("/v1/runs/claim", json={"worker_id": wid, "wait_s": 0}, headers=_auth(worker_token))
    assert claim.status_code == 200, claim.text
    run = claim.json()["run"]
    assert run["id"] == run_id and run["attempt"] == 1 and run["steps"] == 5
    assert run["plan"]["request"] == HYBRID and run["plan"]["result"]["estimate"]["step_time_s"] == 4.2
    assert client.post("/v1/runs/claim", json={"worker_id": wid}, headers=_auth(worker_token)).status_code == 204

    hb = client.post(f"/v1/runs/{run_id}/heartbeat", json={"worker_id": wid}, headers=_auth(worker_token))
    assert hb.status_code == 200 and "lease_expires_at" in hb.json()
    for step in range(2):
        m = client.post(f"/v1/runs/{run_id}/metrics", headers=_auth(worker_token),
                        json={"worker_id": wid, "step": step, "loss": 3.0 - step, "step_time_s": 4.0})
        assert m.status_code == 200, m.text
    metrics = {"step_time_s": 4.1, "tokens_per_s": 32000.0, "mfu": 0.4, "peak_memory_gib_per_rank": [30.0] * 8,
               "loss": [3.0, 2.0]}
    done = client.post(f"/v1/runs/{run_id}/complete", json={"worker_id": wid, "metrics": metrics},
                       headers=_auth(worker_token))
    assert done.status_code == 200 and done.json()["status"] == "succeeded"
    again = client.post(f"/v1/runs/{run_id}/complete", json={"worker_id": wid, "metrics": metrics},
                        headers=_auth(worker_token))
    assert again.status_code == 409  # completes exactly once
    view = client.get(f"/v1/runs/{run_id}").json()
    assert view["metrics"] == metrics and view["worker"] == wid and view["attempts"] == 1
    assert [p["step"] for p in view["progress"]] == [0, 1]
    assert [r["id"] for r in client.get("/v1/runs", params={"plan_id": plan_id}).json()] == [run_id]


def test_a_run_the_runtime_cannot_price_keeps_the_plans_prediction_and_says_so(
        client: Any, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    import solvers.api
    from solvers.errors import SpecError

    def refuse(request: dict[str, Any]) -> Any:
        raise SpecError.at(("training", "stack"), "cannot be priced")

    monkeypatch.setattr(solvers.api, "estimate", refuse)
    plan_id = store_plan(db)
    r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 5})
    assert r.status_code == 201, r.text
    predicted = r.json()["predicted"]
    assert predicted["step_time_s"] == 4.2 and "stack" not in predicted
    assert predicted["note"].startswith("priced for the plan's stack") and "cannot be priced" in predicted["note"]
    page = client.get(f"/runs/{r.json()['id']}")
    assert page.status_code == 200 and "priced for the plan&#39;s stack" in page.text


def test_run_needs_a_succeeded_plan(client: Any, db: Database) -> None:
    from service import plans

    queued = plans.submit_plan(db, variant(3), "hybrid", 3)[0]["id"]
    assert client.post(f"/v1/plans/{queued}/runs", json={"steps": 2}).status_code == 409
    assert client.post("/v1/plans/nope/runs", json={"steps": 2}).status_code == 404
    r = client.post(f"/v1/plans/{queued}/runs", json={"steps": "many"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "steps"]


def test_lease_rules_retry_and_expiry(client: Any, db: Database, make_token: Callable[[str], str]) -> None:
    tok_a, tok_b = make_token("worker"), make_token("worker")
    a, b = _register(client, tok_a), _register(client, tok_b)
    plan_id = store_plan(db)
    submit = _auth(make_token("submit"))
    run_id = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 1}, headers=submit).json()["id"]
    assert client.post("/v1/runs/claim", json={"worker_id": a}, headers=_auth(tok_a)).status_code == 200
    # another worker cannot act on it, nor impersonate the holder
    assert client.post(f"/v1/runs/{run_id}/heartbeat", json={"worker_id": b}, headers=_auth(tok_b)).status_code == 409
    assert client.post(f"/v1/runs/{run_id}/heartbeat", json={"worker_id": a}, headers=_auth(tok_b)).status_code == 403
    assert client.get(f"/v1/runs/{run_id}", headers=_auth(tok_b)).status_code == 403
    assert client.get(f"/v1/runs/{run_id}", headers=_auth(tok_a)).status_code == 200
    assert client.get("/v1/runs", headers=_auth(tok_b)).json() == []
    # retryable failure: queued again, attempt 2 goes to b
    f = client.post(f"/v1/runs/{run_id}/fail", json={"worker_id": a, "error": "NCCL timeout", "retryable": True},
                    headers=_auth(tok_a))
    assert f.status_code == 200 and f.json()["status"] == "queued"
    claim = client.post("/v1/runs/claim", json={"worker_id": b}, headers=_auth(tok_b)).json()["run"]
    assert claim["id"] == run_id and claim["attempt"] == 2
    # b dies: its lease expires, a reclaims it (attempt 3 = the last)
    with db.writing() as s:
        s.execute(update(Run).where(Run.id == run_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    claim = client.post("/v1/runs/claim", json={"worker_id": a}, headers=_auth(tok_a)).json()["run"]
    assert claim["attempt"] == 3
    assert client.post(f"/v1/runs/{run_id}/metrics", headers=_auth(tok_b),
                       json={"worker_id": b, "step": 1, "loss": 1.0, "step_time_s": 1.0}).status_code == 409
    f = client.post(f"/v1/runs/{run_id}/fail", json={"worker_id": a, "error": "OOM again", "retryable": True},
                    headers=_auth(tok_a))
    assert f.json()["status"] == "failed" and "gave up after 3 attempts" in f.json()["error"]
    assert client.post(f"/v1/runs/{run_id}/fail", json={"worker_id": a, "error": "x"},
                       headers=_auth(tok_a)).status_code == 409  # terminal is final


def test_claim_long_poll_returns_204_after_wait(client: Any, make_token: Callable[[str], str]) -> None:
    import time

    tok = make_token("worker")
    wid = _register(client, tok)
    t0 = time.monotonic()
    r = client.post("/v1/runs/claim", json={"worker_id": wid, "wait_s": 0.6}, headers=_auth(tok))
    assert r.status_code == 204 and time.monotonic() - t0 >= 0.5
    assert client.post("/v1/runs/claim", json={"worker_id": wid, "wait_s": 31}, headers=_auth(tok)).status_code == 422
    assert client.post("/v1/runs/claim", json={"worker_id": "unknown"}, headers=_auth(tok)).status_code == 404


def test_profiles_crud(client: Any) -> None:
    body = {"name": "a100-node", "kind": "hardware", "host": "node-1", "data": {"allreduce_GBps": {"8": 150}}}
    created = client.post("/v1/profiles", json=body)
    assert created.status_code == 201
    pid = created.json()["id"]
    assert client.get(f"/v1/profiles/{pid}").json()["data"] == body["data"]
    assert [p["id"] for p in client.get("/v1/profiles", params={"kind": "hardware"}).json()] == [pid]
    assert client.get("/v1/profiles", params={"kind": "model"}).json() == []
    bad = client.post("/v1/profiles", json={**body, "kind": "weird"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "kind"]
    assert client.delete(f"/v1/profiles/{pid}").status_code == 204


def test_housekeeping_requeues_a_dead_workers_run(client: Any, db: Database, settings: Any,
                                                  make_token: Callable[[str], str]) -> None:
    from service.dispatcher import Dispatcher

    tok = make_token("worker")
    wid = _register(client, tok)
    run_id = client.post(f"/v1/plans/{store_plan(db)}/runs", json={"steps": 1},
                         headers=_auth(make_token("submit"))).json()["id"]
    client.post("/v1/runs/claim", json={"worker_id": wid}, headers=_auth(tok))
    with db.writing() as s:
        s.execute(update(Run).where(Run.id == run_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    Dispatcher(db, settings).housekeeping()  # nobody claims: the dispatcher's periodic sweep notices
    view = client.get(f"/v1/runs/{run_id}").json()
    assert view["status"] == "queued" and "lease" in view["error"] and view["attempts"] == 1


def _claimed(client: Any, db: Database, make_token: Callable[[str], str]) -> tuple[str, str, str]:
    """(run id, worker id, worker token) of a run a registered worker holds."""
    submit, worker_token = make_token("submit"), make_token("worker")
    run_id = client.post(f"/v1/plans/{store_plan(db)}/runs", json={"steps": 5}, headers=_auth(submit)).json()["id"]
    wid = _register(client, worker_token)
    claim = client.post("/v1/runs/claim", json={"worker_id": wid, "wait_s": 0}, headers=_auth(worker_token))
    assert claim.status_code == 200 and claim.json()["run"]["id"] == run_id, claim.text
    return run_id, wid, worker_token


def test_a_retried_metrics_report_replaces_its_first(client: Any, db: Database,
                                                     make_token: Callable[[str], str]) -> None:
    """The worker retries a report whose response it lost: the step was stored twice (a fuzz of the run
    lifecycle). One point per (attempt, step) now, tagged with its attempt; steps keep their order."""
    run_id, wid, token = _claimed(client, db, make_token)
    for step, loss in ((0, 3.0), (1, 2.5), (0, 3.0), (0, 2.9)):
        r = client.post(f"/v1/runs/{run_id}/metrics", headers=_auth(token),
                        json={"worker_id": wid, "step": step, "loss": loss, "step_time_s": 0.5})
        assert r.status_code == 200, r.text
    progress = client.get(f"/v1/runs/{run_id}").json()["progress"]
    assert [(p["attempt"], p["step"], p["loss"]) for p in progress] == [(1, 0, 2.9), (1, 1, 2.5)]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_json_does_not_have_is_a_422_naming_the_field(client: Any, db: Database,
                                                               make_token: Callable[[str], str],
                                                               number: str) -> None:
    """Python's JSON reader takes NaN, Infinity and 1e999 (as inf). Such a field failing validation was an HTTP
    500 (the 422 echoed a value it could not encode); one passing it (loss, an extra metric, a capability) was
    stored and came back as null; a plan request's canonical JSON refused it (500)."""
    run_id, wid, token = _claimed(client, db, make_token)
    bodies = [
        (f"/v1/runs/{run_id}/metrics", f'{{"worker_id": "{wid}", "step": 0, "loss": {number}, "step_time_s": 1}}',
         ["body", "loss"]),
        (f"/v1/runs/{run_id}/metrics", f'{{"worker_id": "{wid}", "step": 0, "loss": 1, "step_time_s": {number}}}',
         ["body", "step_time_s"]),
        (f"/v1/runs/{run_id}/complete", f'{{"worker_id": "{wid}", "metrics": {{"mfu": [0.4, {number}]}}}}',
         ["body", "metrics", "mfu", 1]),
        ("/v1/runs/claim", f'{{"worker_id": "{wid}", "wait_s": {number}}}', ["body", "wait_s"]),
        ("/v1/plans", json.dumps(HYBRID).replace('"seq_length": 2048', f'"seq_length": {number}'),
         ["body", "training", "seq_length"]),
    ]
    for path, text, loc in bodies:
        r = client.post(path, content=text, headers={**_auth(token if "runs" in path else make_token("submit")),
                                                      "Content-Type": "application/json"})
        assert r.status_code == 422, (path, r.status_code, r.text)
        assert r.json()["detail"][0]["loc"] == loc and "finite number" in r.json()["detail"][0]["msg"]
    view = client.get(f"/v1/runs/{run_id}").json()
    assert view["status"] == "running" and view["progress"] == []  # nothing stored, nothing changed
    r = client.post("/v1/runs/claim", params={"wait": "nan"}, json={"worker_id": wid}, headers=_auth(token))
    assert r.status_code < 500
