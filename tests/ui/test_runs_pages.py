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
    request, result = samples.hybrid(num_layers=4, pp=1, micro_batches=2, runnable=True)
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
        worker_id = register_worker(session, {"name": "node-a", "host": "gpu-host-1", "gpus": 8}, admin).id
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


CPU_REQUEST = {"kind": "hybrid", "model": {"name": "tiny", "num_layers": 4, "hidden_size": 64,
                                           "num_attention_heads": 4, "vocab_size": 128},
               "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2},
               "training": {"global_batch_size": 4, "seq_length": 32, "precision": "fp32"},
               "constraints": {"target": "torchtitan"}}  # a plan the worker runs exactly (as the README's tour)


def _completed_run(db: Database, plan_id: str, device: str) -> str:
    admin = Principal(None, "admin")
    with db.writing() as session:
        worker_id = register_worker(session, {"name": "w", "host": "h", "gpus": 8}, admin).id
        run_id = str(runs.create_run(session, plan_id, steps=3, max_attempts=1)["id"])
    assert runs.claim_run(db, worker_id, admin, lease_s=60) is not None
    runs.complete_run(db, run_id, worker_id, admin, {"step_time_s": 0.5, "device": device,
                                                     "peak_memory_gib_per_rank": [0.4, 0.41]})
    return run_id


def test_a_cpu_run_without_a_profile_says_what_its_prediction_is(ui_client: TestClient, ui_db: Database) -> None:
    from solvers.api import solve

    result = solve(CPU_REQUEST)
    # a CPU host has no CUDA runtime: no reserve in the prediction (1.5 GiB made a CPU run's memory +320%)
    assert all(stage.get("reserve", 0.0) == 0.0 for stage in result.estimate.memory_breakdown_gib_per_stage)
    assert result.estimate.peak_memory_gib < 0.1
    plan_id = store_plan(ui_db, CPU_REQUEST, result.to_json())
    html = ui_client.get(f"/runs/{_completed_run(ui_db, plan_id, 'cpu')}").text
    notes = re.findall(r'<p class="note prediction-note">(.*?)</p>', html, re.S)
    assert len(notes) == 4, notes
    assert notes.pop(0) == "Predicted with the shipped constants (no calibration set applied)."
    # the run is predicted for what runs it, the plan's own figure (its request's default stack) beside it
    assert notes.pop(0).startswith("Predicted for paraplan&#39;s runtime, what runs the plan (framework paraplan: "
                                   "eager elementwise ops, TP overlap none, gradient sync after the backward). The "
                                   "plan&#39;s own estimate, for the stack its request names: ")
    assert notes[0].startswith("The plan was priced for the cpu preset&#39;s nominal speed, without a profile of "
                               "this host: its step time is a placeholder")
    assert "paraplan worker profile" in notes[0]
    assert notes[1].startswith("On a CPU host the measured memory is each process&#39;s peak resident set")
    assert "peak memory per rank" in html and "peak memory per GPU" not in html


def test_a_gpu_plan_run_elsewhere_says_the_prediction_is_for_the_planned_gpu(ui_client: TestClient,
                                                                              ui_db: Database) -> None:
    plan_id = _solved(ui_db, 72)  # planned on A100-80GB
    html = ui_client.get(f"/runs/{_completed_run(ui_db, plan_id, 'cpu')}").text
    assert ("The prediction is for the planned GPU (A100-80GB); this run ran on a CPU host, so the prediction error "
            "measures the difference between the two devices, not the cost model.") in html
    plan_id = _solved(ui_db, 80)
    same = ui_client.get(f"/runs/{_completed_run(ui_db, plan_id, 'NVIDIA A100-SXM4-80GB')}").text
    assert "The prediction is for the planned GPU" not in same  # on the planned GPU: no device to explain
