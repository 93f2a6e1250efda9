"""Tokens: hashed at rest, 401 without a valid token, 403 with too small a scope, scope rules per endpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from service.db.engine import Database
from service.db.models import ApiToken
from service.tokens import hash_token
from tests.conftest import TEST_PEPPER

pytestmark = pytest.mark.db
PROFILE = {"name": "p", "kind": "hardware", "host": "h", "data": {"a": 1}}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_open_until_the_first_token_then_401(client: Any, make_token: Callable[[str], str]) -> None:
    assert client.post("/v1/profiles", json=PROFILE).status_code == 201  # no token exists: open (dev mode)
    make_token("admin")
    client.app.state.ctx.tokens.ttl_s = 0  # see the new token at once
    r = client.post("/v1/profiles", json=PROFILE)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert client.post("/v1/profiles", json=PROFILE, headers=_auth("pp_wrong")).status_code == 401
    assert client.post("/v1/profiles", json=PROFILE, headers={"Authorization": "Basic abc"}).status_code == 401


@pytest.mark.parametrize(("scope", "status"), [("read", 403), ("submit", 403), ("worker", 201), ("admin", 201)])
def test_scopes_on_a_worker_endpoint(client: Any, make_token: Callable[[str], str], scope: str, status: int) -> None:
    token = make_token(scope)
    r = client.post("/v1/profiles", json=PROFILE, headers=_auth(token))
    assert r.status_code == status, r.text
    if status == 403:
        assert "worker" in r.json()["detail"]


def test_admin_only_delete_and_reads_open_by_default(client: Any, make_token: Callable[[str], str]) -> None:
    worker, admin = make_token("worker"), make_token("admin")
    pid = client.post("/v1/profiles", json=PROFILE, headers=_auth(worker)).json()["id"]
    assert client.get(f"/v1/profiles/{pid}").status_code == 200  # require_read_token defaults to false
    assert client.delete(f"/v1/profiles/{pid}", headers=_auth(worker)).status_code == 403
    assert client.delete(f"/v1/profiles/{pid}", headers=_auth(admin)).status_code == 204
    assert client.get(f"/v1/profiles/{pid}").status_code == 404


def test_read_token_required_when_configured(settings: Any, make_token: Callable[[str], str]) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app

    read = make_token("read")
    with TestClient(create_app(settings.model_copy(update={"require_read_token": True}))) as c:
        assert c.get("/v1/plans").status_code == 401
        assert c.get("/v1/plans", headers=_auth(read)).status_code == 200
        assert c.get("/v1/plans", headers=_auth(make_token("submit"))).status_code == 200  # submit may read
        assert c.get("/healthz").status_code == 200  # probes stay open


def test_tokens_are_stored_as_peppered_hashes(db: Database, make_token: Callable[[str], str]) -> None:
    token = make_token("submit")
    with db.reading() as s:
        rows = s.execute(select(ApiToken)).scalars().all()
    assert len(rows) == 1 and token not in (rows[0].token_hash, rows[0].name)
    assert rows[0].token_hash == hash_token(token, TEST_PEPPER) != hash_token(token, "another-pepper")
