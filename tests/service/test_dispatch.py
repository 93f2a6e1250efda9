"""Solver jobs off the request path: the dispatcher, its child processes, and standalone dispatchers
sharing the queue — over real HTTP (uvicorn subprocesses) and real databases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service import plans
from service.db.engine import Database
from service.db.models import Job, Plan
from service.dispatcher import Dispatcher
from service.settings import Settings
from service.validation import available_kinds
from solvers.kinds import solver_kind
from tests.conftest import PARAPLAN, LiveServer, server_env, start_solver
from tests.service.helpers import wait_for
from tests.service.requests import REQUESTS, slow_spindle, tiny_spindle

pytestmark = [pytest.mark.db, pytest.mark.slow]


def _cli_token(database_url: str, scope: str) -> str:
    out = subprocess.run([*PARAPLAN, "token", "create", "--scope", scope], env=server_env(database_url),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert out.stdout.count("\n") == 1 and token.startswith("pp_")  # the token alone on stdout
    return token


def test_request_to_plan_to_export_over_http(live_server: LiveServer, db: Database, tmp_path: Path) -> None:
    kinds = available_kinds()
    assert "spindle" in kinds or "flexsp" in kinds or "hybrid" in kinds
    submit = {"Authorization": f"Bearer {_cli_token(live_server.database_url, 'submit')}"}
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        assert http.post("/v1/plans", json=REQUESTS[kinds[0]]).status_code == 401
        for kind in kinds:
            r = http.post("/v1/plans", params={"wait": 30}, json=REQUESTS[kind], headers=submit)
            assert r.status_code == 200, (kind, r.text)
            plan = r.json()
            assert plan["status"] == "succeeded" and plan["kind"] == kind, plan
            assert plan["request"] == REQUESTS[kind] and plan["progress"]["fraction"] == 1.0
            got = http.get(f"/v1/plans/{plan['id']}").json()
            assert got["result"] == plan["result"] and "estimate" in got["result"]
            # identical request: the stored plan, not a second solve
            again = http.post("/v1/plans", json=REQUESTS[kind], headers=submit)
            assert again.status_code == 200 and again.json()["id"] == plan["id"]
            for fmt in ("megatron", "deepspeed", "torchtitan", "galvatron"):
                export = http.get(f"/v1/plans/{plan['id']}/export", params={"format": fmt})
                if kind != "hybrid":
                    assert export.status_code == 409
                    continue
                assert export.status_code == 200, export.text
                if fmt in ("deepspeed", "galvatron"):
                    assert isinstance(export.json(), dict)
                else:
                    assert export.text.strip()
            bad = http.get(f"/v1/plans/{plan['id']}/export", params={"format": "jax"})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "format"]
        listed = http.get("/v1/plans", params={"status": "succeeded"}).json()["items"]
        assert {p["kind"] for p in listed} == set(kinds)
        for listed_plan in listed:  # a run is queued only for what the worker executes (test_run_refusals)
            run = http.post(f"/v1/plans/{listed_plan['id']}/runs", json={"steps": 3}, headers=submit)
            assert run.status_code in (201, 422), run.text
            if run.status_code == 422:  # naming the plan's field the runtime cannot follow
                assert all(p["loc"][0] == "plan" and len(p["loc"]) > 1 for p in run.json()["detail"]), run.text
        metrics = http.get("/metrics").text
        assert f'paraplan_jobs{{state="succeeded"}} {len(kinds)}.0' in metrics
        assert 'route="/v1/plans/{plan_id}"' in metrics

    # identical requests submitted concurrently: one plan, one job, solved once
    request = tiny_spindle(999)

    def post(_: int) -> tuple[int, str]:
        r = httpx.post(f"{live_server.url}/v1/plans", params={"wait": 30}, json=request, headers=submit,
                       timeout=60)
        return r.status_code, r.json()["id"]

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(post, range(12)))
    assert {status for status, _ in answers} == {200} and len({pid for _, pid in answers}) == 1
    with db.reading() as s:
        rows = s.execute(select(Job.attempts, Job.status).join(Plan, Plan.id == Job.plan_id)
                         .where(Plan.id == answers[0][1])).all()
    assert [(r.attempts, r.status) for r in rows] == [(1, "succeeded")]  # one job, solved once
    # the CLI client of the same server: the stored plan's result, on stdout
    path = tmp_path / "req.json"
    path.write_text(json.dumps(request))
    token = submit["Authorization"].split()[1]
    out = subprocess.run([*PARAPLAN, "plan", "-f", str(path), "--server", live_server.url, "--token", token,
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with db.reading() as s:
        assert json.loads(out.stdout) == plans.get_plan(s, answers[0][1])["result"].to_json()


def test_all_three_kinds_are_served() -> None:
    """Every kind's solver loads in this install (a broken import fails here instead of hiding a kind)."""
    assert available_kinds() == ["hybrid", "flexsp", "spindle"]
    for kind in ("hybrid", "flexsp", "spindle"):
        assert callable(solver_kind(kind).solve)


def test_four_dispatchers_drain_200_jobs_each_once(database_url: str, db: Database, tmp_path: Path) -> None:
    if db.dialect != "postgresql":
        pytest.skip("PostgreSQL case (FOR UPDATE SKIP LOCKED); SQLite claim exclusivity: test_jobs")
    n = 200
    ids = {plans.submit_plan(db, tiny_spindle(i), "spindle", 3)[0]["id"] for i in range(n)}
    procs = [start_solver(database_url, tmp_path, "--exit-when-idle") for _ in range(4)]
    summaries = []
    for proc in procs:
        out, _ = proc.communicate(timeout=150)
        assert proc.returncode == 0
        summaries.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert sum(s["claimed"] for s in summaries) == n == sum(s["succeeded"] for s in summaries)
    with db.reading() as s:
        rows = s.execute(select(Job.plan_id, Job.status, Job.attempts, Job.lease_owner)).all()
        statuses = set(s.execute(select(Plan.status)).scalars())
    assert {r.plan_id for r in rows} == ids and statuses == {"succeeded"}
    assert all(r.status == "succeeded" and r.attempts == 1 for r in rows)  # each job claimed and solved once
    owners = {r.lease_owner for r in rows}
    assert owners == {s["owner"] for s in summaries if s["claimed"]} and len(owners) >= 2



def test_sigkilled_dispatcher_job_is_released_and_completes(database_url: str, db: Database,
                                                            tmp_path: Path) -> None:
    plan_id = plans.submit_plan(db, slow_spindle(1.5), "spindle", 3)[0]["id"]
    first = start_solver(database_url, tmp_path, "--max-jobs", "1", job_lease_s=1.5)

    def solving() -> bool:  # running, and the solver child has reported progress (past its first phase)
        with db.reading() as s:
            view = plans.get_plan(s, plan_id)
        return view["status"] == "running" and view["progress"]["fraction"] >= 0.1

    wait_for(solving, 60, "mid-solve")
    os.kill(first.pid, signal.SIGKILL)  # the dispatcher only: its solver child must die with it
    first.wait(10)
    second = start_solver(database_url, tmp_path, "--max-jobs", "1", job_lease_s=1.5)
    out, _ = second.communicate(timeout=90)
    assert json.loads(out.decode().strip().splitlines()[-1])["succeeded"] == 1
    with db.reading() as s:
        view = plans.get_plan(s, plan_id)
        job = s.execute(select(Job).where(Job.plan_id == plan_id)).scalar_one()
    assert view["status"] == "succeeded" and view["attempts"] == 2 and f":{second.pid}:" in job.lease_owner
    assert view["result"].to_json()["estimate"]["iteration_time_s"] > 0
    # the killed dispatcher's forkserver and solver child did not outlive it
    wait_for(lambda: not _group_alive(first.pid), 15, "the killed dispatcher's children to exit")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _run_one(database_url: str, request: dict[str, Any], **settings: Any) -> dict[str, Any]:
    database = Database.connect(database_url, pool_size=2)
    try:
        plan_id = plans.submit_plan(database, request, "spindle", 3)[0]["id"]
        cfg = Settings(database_url=database_url, dispatcher_poll_s=0.05, **settings)
        Dispatcher(database, cfg).run(concurrency=1, exit_when_idle=True)
        with database.reading() as s:
            return plans.get_plan(s, plan_id)
    finally:
        database.dispose()


def test_time_limit_kills_the_solve(database_url: str) -> None:
    t0 = time.monotonic()
    view = _run_one(database_url, slow_spindle(20.0), job_time_limit_s=1.0)
    assert view["status"] == "failed" and "time limit of 1 s exceeded" in view["error"]
    assert time.monotonic() - t0 < 10


def test_memory_cap_fails_the_job_with_the_reason(database_url: str) -> None:
    view = _run_one(database_url, tiny_spindle(0), job_memory_limit_mib=64)
    assert view["status"] == "failed" and ("memory" in view["error"] or "exit code" in view["error"]), view
