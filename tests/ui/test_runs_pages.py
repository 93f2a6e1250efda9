"""Runs from the dashboard (no browser): "Run this plan" on a solved plan's page queues a run and opens it; the
runs and workers pages list them; a failed plan offers neither a run nor exports."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from service import jobs, plans, runs
from service.context import ServiceContext
from service.db.engine import Database
from service.migrate import upgrade
from service.settings import Settings
from service.tokens import Principal, TokenCache, create_token
from service.ui import mount_ui
from service.workers import register_worker
from tests.ui import samples
from tests.ui.conftest import store_plan


def _solved(db: Database, batch: int) -> str:
    request, result = samples.hybrid(num_layers=4, pp=1)
    request["training"]["global_batch_size"] = batch  # a distinct request, so a distinct plan
    return store_plan(db, request, result)


def test_run_this_plan_queues_a_run_a_worker_then_claims(ui_client: TestClient, ui_db: Database) -> None:
    plan_id = _solved(ui_db, 48)
    page = ui_client.get(f"/plans/{plan_id}").text
    assert f'action="/plans/{plan_id}/runs"' in page and "Run this plan" in page
    assert "no worker is online" in page  # where the run will wait, and how to start a worker
    resp = ui_client.post(f"/plans/{plan_id}/runs", data={"steps": "7"}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/runs/")
    run_id = resp.headers["location"].removeprefix("/runs/")
    run_page = ui_client.get(f"/runs/{run_id}").text
    assert "7 steps" in run_page and "queued" in run_page
    # the run is a real queued run: the worker functions claim it
    admin = Principal(None, "admin")
    with ui_db.writing() as session:
        worker_id = register_worker(session, {"name": "node-a", "host": "gpu-host-1", "gpus": 4}, admin).id
    claimed = runs.claim_run(ui_db, worker_id, admin, lease_s=60)
    assert claimed is not None and claimed["id"] == run_id and claimed["steps"] == 7

    listed = ui_client.get("/runs").text
    row = re.search(rf'<tr data-run-id="{run_id}">(.*?)</tr>', listed, re.S)
    assert row and f"/plans/{plan_id}" in row.group(1) and "running" in row.group(1) and worker_id in row.group(1)
    assert "1 worker online" in listed
    assert ui_client.get("/runs?status=succeeded").text.count(f'data-run-id="{run_id}"') == 0
    workers = ui_client.get("/workers").text
    row = re.search(rf'<tr data-worker-id="{worker_id}">(.*?)</tr>', workers, re.S)
    assert row and "node-a" in row.group(1) and "gpu-host-1" in row.group(1) and "online" in row.group(1)
    assert "1 worker online" in ui_client.get(f"/plans/{plan_id}").text


def test_bad_steps_are_named_on_the_plan_page(ui_client: TestClient, ui_db: Database) -> None:
    plan_id = _solved(ui_db, 56)
    for steps in ("0", "x", "2000000"):
        resp = ui_client.post(f"/plans/{plan_id}/runs", data={"steps": steps}, follow_redirects=False)
        assert resp.status_code == 422 and "steps: a whole number from 1 to 1,000,000" in resp.text
        assert f'value="{steps}"' in resp.text  # the user's value is kept


def test_a_failed_plan_has_no_exports_and_no_run(ui_client: TestClient, ui_db: Database) -> None:
    request, _ = samples.hybrid(num_layers=3, pp=1)
    request["training"]["global_batch_size"] = 11
    view, _ = plans.submit_plan(ui_db, request, "hybrid", max_attempts=1)
    claimed = jobs.claim_job(ui_db, "ui-test", lease_s=60)
    assert claimed is not None
    jobs.fail_job(ui_db, claimed.id, "ui-test", "no plan fits", detail=[], request_error=True)
    html = ui_client.get(f"/plans/{view['id']}").text
    assert 'id="failure"' in html and "/export?" not in html and "Run this plan" not in html
    resp = ui_client.post(f"/plans/{view['id']}/runs", data={"steps": "5"}, follow_redirects=False)
    assert resp.status_code == 409 and "only a succeeded plan can be run" in resp.text
    solved = ui_client.get(f"/plans/{_solved(ui_db, 64)}").text
    assert solved.count("/export?format=") >= 4  # (a solved one still has them)


def test_running_a_plan_needs_a_submit_token_once_tokens_exist(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    upgrade(database_url=url)
    db = Database.connect(url)
    with db.writing() as session:
        tokens = {scope: create_token(session, scope, "pepper") for scope in ("read", "submit")}
    plan_id = _solved(db, 24)
    app = FastAPI()
    mount_ui(app, ServiceContext(settings=Settings(database_url=url, token_pepper="pepper", run_dispatcher=False),
                                 db=db, tokens=TokenCache()))
    with TestClient(app) as client:
        resp = client.post(f"/plans/{plan_id}/runs", data={"steps": "3"})
        assert resp.status_code == 401 and "missing bearer token" in resp.text
        assert client.post(f"/plans/{plan_id}/runs", data={"steps": "3", "token": tokens["read"]}).status_code == 403
        resp = client.post(f"/plans/{plan_id}/runs", data={"steps": "3", "token": tokens["submit"]},
                           follow_redirects=False)
        assert resp.status_code == 303 and "paraplan_token=" in resp.headers["set-cookie"]
    db.dispose()
