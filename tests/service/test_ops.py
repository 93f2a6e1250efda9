"""Probes, metrics, the error table and the CLI around the service."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from service.errors import Conflict, NotFound, TooLarge, Unauthorized, http_status
from solvers.errors import SpecError
from tests.conftest import PARAPLAN, server_env
from tests.service.helpers import store_plan


def test_error_table_maps_each_error_once() -> None:
    locked = OperationalError("UPDATE jobs", {}, Exception("database is locked"))
    cases = [(NotFound("x"), 404), (Conflict("x"), 409), (IntegrityError("INSERT", {}, Exception()), 409),
             (SpecError.at(("kind",), "bad"), 422), (Unauthorized("x"), 401), (TooLarge("x"), 413), (locked, 503)]
    assert [http_status(err) for err, _ in cases] == [status for _, status in cases]
    assert http_status(ValueError("not ours")) is None


@pytest.mark.db
def test_readyz_metrics_and_openapi(client: Any, db: Any) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["revision"]
    store_plan(db)
    client.post("/v1/plans", json={"kind": "nope"})
    text = client.get("/metrics").text
    for family in ("paraplan_database_up 1.0", "paraplan_http_request_duration_seconds_bucket",
                   'paraplan_jobs{state="succeeded"} 1.0', "paraplan_queue_depth 0.0",
                   'paraplan_solve_seconds_count{kind="hybrid"} 1.0',
                   'route="/v1/plans",status="422"'):
        assert family in text, family
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/plans", "/v1/plans/{plan_id}", "/v1/plans/{plan_id}/export", "/v1/estimate",
                 "/v1/runs/claim", "/v1/workers/register", "/v1/profiles", "/v1/plans/{plan_id}/runs"):
        assert path in paths, path


@pytest.mark.db
def test_readyz_503_until_migrated(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.migrate import upgrade
    from service.settings import Settings

    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    with TestClient(create_app(Settings(database_url=url, run_dispatcher=False))) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and "paraplan db upgrade" in r.json()["reason"]
        upgrade(database_url=url)
        assert c.get("/readyz").status_code == 200


@pytest.mark.db
def test_token_create_cli(tmp_path: Path, _sqlite_template: Path) -> None:
    db_file = tmp_path / "cli.db"
    shutil.copy(_sqlite_template, db_file)
    env = server_env(f"sqlite:///{db_file}")
    ok = subprocess.run([*PARAPLAN, "token", "create", "--scope", "read"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.strip().startswith("pp_") and ok.stdout.count("\n") == 1
    assert ok.stdout.strip() not in ok.stderr
    bad = subprocess.run([*PARAPLAN, "token", "create", "--scope", "root"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "scope" in bad.stderr and "Traceback" not in bad.stderr
    unmigrated = server_env(f"sqlite:///{tmp_path / 'none.db'}")
    no_db = subprocess.run([*PARAPLAN, "token", "create", "--scope", "read"], env=unmigrated, capture_output=True,
                           text=True)
    assert no_db.returncode == 1 and "db upgrade" in no_db.stderr and "Traceback" not in no_db.stderr


@pytest.mark.db
def test_demo_plan_seeded_once_on_an_empty_database(settings: Any) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app

    demo = settings.model_copy(update={"seed_demo_plan": True})
    for _ in range(2):
        with TestClient(create_app(demo)) as c:
            items = c.get("/v1/plans").json()["items"]
    assert len(items) == 1 and items[0]["kind"] == "hybrid" and items[0]["status"] == "queued"
