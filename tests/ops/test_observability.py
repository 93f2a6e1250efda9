"""Metrics and logs of a real server process after real traffic: every Prometheus family the platform team
scrapes is present with plausible values; log lines are JSON with the request id the response carries;
tokens never reach the logs."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PARAPLAN, LiveServer, server_env
from tests.service.requests import tiny_cpu_hybrid

pytestmark = pytest.mark.db
WORKER = {"name": "w-ops", "host": "node-ops", "gpus": 1, "gpu_name": "cpu", "memory_gib": 8,
          "torch_version": "2", "cuda_version": None, "capabilities": {}}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _json_lines(server: LiveServer) -> list[dict[str, Any]]:
    lines = []
    for raw in server.logs().splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))
    return lines


def _traffic(server: LiveServer, admin: str, worker: str) -> dict[str, str]:
    """A solved plan, a queued run, a registered worker with a heartbeat, a 422 and a 404."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        plan = c.post("/v1/plans?wait=30", json=tiny_cpu_hybrid(), headers=_auth(admin))
        assert plan.status_code in (200, 201) and plan.json()["status"] == "succeeded", plan.text
        plan_id = plan.json()["id"]
        run = c.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3}, headers=_auth(admin))
        assert run.status_code == 201, run.text
        wid = c.post("/v1/workers/register", json=WORKER, headers=_auth(worker)).json()["id"]
        assert c.post(f"/v1/workers/{wid}/heartbeat", headers=_auth(worker)).status_code == 200
        assert c.post("/v1/plans", json={"kind": "nope"}, headers=_auth(admin)).status_code == 422
        assert c.get("/v1/plans/does-not-exist").status_code == 404
        for _ in range(5):
            assert c.get(f"/v1/plans/{plan_id}").status_code == 200
    return {"plan_id": plan_id, "run_id": run.json()["id"], "worker_id": wid,
            "submit_request_id": plan.headers["x-request-id"], "run_request_id": run.headers["x-request-id"]}


def test_metrics_families_after_traffic(live_server: LiveServer) -> None:
    ids = _traffic(live_server, live_server.token("admin"), live_server.token("worker"))
    for path in ("/openapi.json", "/no/such/a", "/no/such/b"):
        httpx.get(f"{live_server.url}{path}")
    m = _samples(httpx.get(f"{live_server.url}/metrics").text)

    # request latency histogram by route and status; the 5 GETs of one plan are all counted
    latency = "paraplan_http_request_duration_seconds"
    counts = {(lab["method"], lab["route"], lab["status"]): v for lab, v in m[f"{latency}_count"]}
    assert counts[("GET", "/v1/plans/{plan_id}", "200")] >= 5
    assert counts[("POST", "/v1/plans", "422")] == 1 and counts[("GET", "/v1/plans/{plan_id}", "404")] == 1
    # the schema route is named; unknown paths share one label (scanners cannot blow up the label set)
    assert counts[("GET", "/openapi.json", "200")] == 1 and counts[("GET", "unmatched", "404")] == 2
    sums = {(lab["method"], lab["route"], lab["status"]): v for lab, v in m[f"{latency}_sum"]}
    assert 0 < sums[("GET", "/v1/plans/{plan_id}", "200")] < 5 * 5.0
    inf = [v for lab, v in m[f"{latency}_bucket"]
           if lab["route"] == "/v1/plans/{plan_id}" and lab["status"] == "200" and lab["le"] == "+Inf"]
    assert inf == [counts[("GET", "/v1/plans/{plan_id}", "200")]]

    assert dict((lab["state"], v) for lab, v in m["paraplan_jobs"]).get("succeeded") == 1
    assert m["paraplan_queue_depth"] == [({}, 0.0)]
    assert dict((lab["state"], v) for lab, v in m["paraplan_runs"]) == {"queued": 1}
    solve = {lab["kind"]: v for lab, v in m["paraplan_solve_seconds_count"]}
    solve_sum = {lab["kind"]: v for lab, v in m["paraplan_solve_seconds_sum"]}
    assert solve == {"hybrid": 1} and 0 < solve_sum["hybrid"] < 30
    beats = {lab["worker"]: v for lab, v in m["paraplan_worker_heartbeat_age_seconds"]}
    assert set(beats) == {ids["worker_id"]} and 0 <= beats[ids["worker_id"]] < 30
    assert m["paraplan_database_up"] == [({}, 1.0)]


def test_json_logs_carry_request_job_and_run_ids(live_server: LiveServer) -> None:
    admin = live_server.token("admin")
    ids = _traffic(live_server, admin, live_server.token("worker"))
    r = httpx.get(f"{live_server.url}/v1/runs/{ids['run_id']}", headers={**_auth(admin), "X-Request-ID": "ops-req-42"})
    generated = httpx.get(f"{live_server.url}/v1/plans/{ids['plan_id']}")
    assert r.status_code == 200 and r.headers["x-request-id"] == "ops-req-42"
    rid = generated.headers["x-request-id"]
    assert len(rid) == 32 and rid != "ops-req-42"
    bad = httpx.get(f"{live_server.url}/healthz", headers={"X-Request-ID": "evil id; rm -rf"})
    assert bad.headers["x-request-id"] != "evil id; rm -rf"  # not echoed: generated instead

    lines = _json_lines(live_server)
    by_rid = {line.get("request_id"): line for line in lines if line.get("logger") == "paraplan.access"}
    mine = by_rid["ops-req-42"]
    assert mine["route"] == "/v1/runs/{run_id}" and mine["status"] == 200 and mine["run_id"] == ids["run_id"]
    assert mine["duration_ms"] >= 0 and mine["level"] == "info"
    assert by_rid[rid]["plan_id"] == ids["plan_id"]
    # a request's id leads to the plan or run it made, and the plan id to its job's lines
    api = [line for line in lines if line.get("logger") == "paraplan.api"]
    assert any(line["request_id"] == ids["submit_request_id"] and line.get("plan_id") == ids["plan_id"]
               for line in api), api
    assert any(line["request_id"] == ids["run_request_id"] and line.get("run_id") == ids["run_id"]
               and line.get("plan_id") == ids["plan_id"] for line in api), api
    job_lines = [line for line in lines if line.get("logger") == "paraplan.dispatcher"]
    assert any(line.get("plan_id") == ids["plan_id"] and line.get("job_id") and "succeeded" in line["msg"]
               for line in job_lines), job_lines


def test_tokens_never_logged(live_server: LiveServer) -> None:
    admin = live_server.token("admin")
    _traffic(live_server, admin, live_server.token("worker"))
    forged = "pp_" + "x" * 43
    with httpx.Client(base_url=live_server.url) as c:
        assert c.get("/v1/runs", headers=_auth(forged)).status_code == 401
        assert c.post("/v1/plans", json={"kind": "nope"}, headers=_auth(admin)).status_code == 422
        assert c.get("/v1/plans", headers={"Authorization": "Basic " + admin}).status_code == 401
    log = live_server.logs()
    assert log.count("paraplan.access") >= 10  # the log captured the traffic...
    assert admin not in log and forged not in log and admin.removeprefix("pp_") not in log  # ...but no token

    out = subprocess.run([*PARAPLAN, "token", "create", "--scope", "read"], env=server_env(live_server.database_url),
                         capture_output=True, text=True, timeout=60)
    token = out.stdout.strip()
    assert out.returncode == 0 and token.startswith("pp_") and token not in out.stderr
