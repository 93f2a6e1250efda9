"""Fixtures for dashboard tests: a migrated SQLite database, an app with the dashboard, stored plans."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service import jobs, plans
from service.context import ServiceContext
from service.db.engine import Database
from service.migrate import upgrade
from service.settings import Settings
from service.ui import mount_ui
from solvers.documents import load_result
from tests.conftest import PG_URL, reset_postgres


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not PG_URL, reason="PARAPLAN_TEST_DATABASE_URL not set"))])
def ui_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """A migrated, empty database for one test module: SQLite, and PostgreSQL when configured."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('ui') / 'ui.db'}"
        upgrade(database_url=url)
    else:
        url = request.getfixturevalue("_pg_session_url")
        reset_postgres(url)
    db = Database.connect(url)
    yield db
    db.dispose()


@pytest.fixture(scope="module")
def ui_client(ui_db: Database) -> Iterator[TestClient]:
    app = FastAPI()
    mount_ui(app, ServiceContext(settings=Settings(database_url=ui_db.engine.url.render_as_string(hide_password=False),
                                                   run_dispatcher=False), db=ui_db))
    with TestClient(app) as client:
        yield client


def store_plan(db: Database, request: dict[str, Any], result: dict[str, Any] | None) -> str:
    """A plan through the service's own job path: submitted, claimed, completed with ``result`` (or left
    running when ``result`` is None)."""
    view, _ = plans.submit_plan(db, request, request.get("kind", "hybrid"), max_attempts=3)
    claimed = jobs.claim_job(db, "ui-test", lease_s=600)
    assert claimed is not None and claimed.plan_id == view["id"]
    if result is not None:
        assert jobs.complete_job(db, claimed.id, "ui-test", load_result(view["kind"], result))
    return str(view["id"])




CHROMIUM = Path("/usr/bin/chromium")  # Debian's (apt-get install chromium); browser tests skip without it
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module (Playwright)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
