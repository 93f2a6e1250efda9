"""Pages follow the service's token rules; a browser user pastes a token once and reads with a cookie."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.context import ServiceContext
from service.db.engine import Database
from service.migrate import upgrade
from service.settings import Settings
from service.tokens import TokenCache, create_token
from service.ui import mount_ui
from service.ui.data import TOKEN_COOKIE

PEPPER = "ui-test-pepper"


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    upgrade(database_url=url)
    db = Database.connect(url)
    with db.writing() as session:
        tokens = {scope: create_token(session, scope, PEPPER) for scope in ("read", "submit", "worker")}
    app = FastAPI()
    settings = Settings(database_url=url, require_read_token=True, token_pepper=PEPPER)
    mount_ui(app, ServiceContext(settings=settings, db=db, tokens=TokenCache()))
    with TestClient(app) as client:
        yield client, tokens
    db.dispose()


def test_reading_needs_a_token_when_the_service_says_so(locked: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = locked
    resp = client.get("/")
    assert resp.status_code == 401 and 'href="/ui/token"' in resp.text
    assert client.post("/ui/token", data={"token": "pp_wrong"}).status_code == 401
    resp = client.post("/ui/token", data={"token": tokens["read"]}, follow_redirects=False)
    assert resp.status_code == 303 and TOKEN_COOKIE in resp.headers["set-cookie"]
    assert "httponly" in resp.headers["set-cookie"].lower()
    client.cookies.set(TOKEN_COOKIE, tokens["read"])
    assert client.get("/").status_code == 200


def test_submitting_needs_a_submit_token(locked: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = locked
    form = {"kind": "hybrid", "model": "gpt3-1.3b", "gpu": "A100-80GB", "nodes": "1", "gpus_per_node": "4",
            "global_batch_size": "16", "seq_length": "2048"}
    assert client.post("/plans/new", data={**form, "token": tokens["read"]}).status_code == 403
    assert client.post("/plans/new", data=form).status_code == 401
    resp = client.post("/plans/new", data={**form, "token": tokens["submit"]}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"].startswith("/plans/")
