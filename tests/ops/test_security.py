"""Security properties a platform team checks before exposing the service: keyed token hashes, worker tokens
confined to their own runs, and oversized bodies refused before they are read."""

from __future__ import annotations

import hashlib
import hmac
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from service.db.engine import Database
from service.db.models import ApiToken
from service.tokens import hash_token
from tests.conftest import TEST_PEPPER, LiveServer
from tests.service.helpers import store_plan

pytestmark = pytest.mark.db
WORKER = {"name": "w", "host": "node", "gpus": 8, "gpu_name": "cpu", "memory_gib": 8}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_token_hash_is_a_keyed_hmac_not_a_digest(db: Database, make_token: Callable[[str], str]) -> None:
    token = make_token("admin")
    with db.reading() as s:
        row = s.execute(select(ApiToken)).scalar_one()
        stored = [str(v) for v in s.execute(select(ApiToken.__table__)).one()]
    assert not any(token in v or token.removeprefix("pp_") in v for v in stored)  # plaintext stored nowhere
    assert row.token_hash != hashlib.sha256(token.encode()).hexdigest()  # a stolen table alone tests no guesses
    assert row.token_hash != hashlib.sha256(token.removeprefix("pp_").encode()).hexdigest()
    assert row.token_hash == hmac.new(TEST_PEPPER.encode(), token.encode(), hashlib.sha256).hexdigest()
    assert hash_token(token, "another-pepper") != row.token_hash
    # 32 random url-safe bytes: guessing is out of reach even with the pepper
    assert len(token.removeprefix("pp_")) >= 43


def test_worker_token_cannot_submit_or_read_other_workers_runs(client: Any, db: Database,
                                                              make_token: Callable[[str], str]) -> None:
    admin, worker_a, worker_b = make_token("admin"), make_token("worker"), make_token("worker")
    plan_id = store_plan(db)
    request = client.get(f"/v1/plans/{plan_id}").json()["request"]

    # (estimates are stateless what-ifs and need only read scope, so a worker may ask for one)
    for path, body in (("/v1/plans", request), (f"/v1/plans/{plan_id}/runs", {"steps": 2})):
        r = client.post(path, json=body, headers=_auth(worker_a))
        assert r.status_code == 403, (path, r.text)
    assert client.delete(f"/v1/plans/{plan_id}", headers=_auth(worker_a)).status_code in (403, 405)

    run_id = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 2}, headers=_auth(admin)).json()["id"]
    wa = client.post("/v1/workers/register", json=WORKER, headers=_auth(worker_a)).json()["id"]
    wb = client.post("/v1/workers/register", json={**WORKER, "name": "b"}, headers=_auth(worker_b)).json()["id"]
    # B cannot claim in A's name, and an unclaimed run is nobody's to read
    stolen = client.post("/v1/runs/claim", json={"worker_id": wa, "wait_s": 0}, headers=_auth(worker_b))
    assert stolen.status_code == 403
    assert client.get(f"/v1/runs/{run_id}", headers=_auth(worker_b)).status_code in (403, 404)
    claim = client.post("/v1/runs/claim", json={"worker_id": wa, "wait_s": 0}, headers=_auth(worker_a))
    assert claim.status_code == 200 and claim.json()["run"]["id"] == run_id

    assert client.get(f"/v1/runs/{run_id}", headers=_auth(worker_a)).status_code == 200
    assert [r["id"] for r in client.get("/v1/runs", headers=_auth(worker_a)).json()] == [run_id]
    assert client.get(f"/v1/runs/{run_id}", headers=_auth(worker_b)).status_code in (403, 404)
    assert client.get("/v1/runs", headers=_auth(worker_b)).json() == []
    assert client.get(f"/v1/runs?plan_id={plan_id}", headers=_auth(worker_b)).json() == []
    for action, body in (("heartbeat", {"worker_id": wb}), ("complete", {"worker_id": wb, "metrics": {}}),
                         ("fail", {"worker_id": wb, "error": "x"}), ("heartbeat", {"worker_id": wa})):
        r = client.post(f"/v1/runs/{run_id}/{action}", json=body, headers=_auth(worker_b))
        assert r.status_code in (403, 409), (action, r.status_code, r.text)
    assert client.get(f"/v1/runs/{run_id}", headers=_auth(admin)).json()["status"] == "running"  # untouched


def _raw_exchange(server: LiveServer, head: bytes, body_parts: list[bytes],
                  timeout: float = 5.0) -> tuple[bytes, float]:
    """Send the head and some body parts, never the rest; return what the server answered and how fast."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        t0 = time.monotonic()
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer, time.monotonic() - t0


def test_oversized_bodies_rejected_before_reading(live_server_factory: Callable[..., LiveServer]) -> None:
    server = live_server_factory(dispatcher=False, max_body_bytes=4096)
    # declared 1 GiB, 10 bytes sent: the answer comes without the server waiting for (or parsing) the rest
    head = (b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1073741824\r\n\r\n")
    answer, took = _raw_exchange(server, head, [b'{"kind": "'])
    assert answer.startswith(b"HTTP/1.1 413") and took < 3, answer[:200]

    # chunked (no length): counted while streaming, refused as soon as the limit is passed, stream unfinished
    head = (b"POST /v1/estimate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 1024
    parts = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 5
    answer, took = _raw_exchange(server, head, parts)
    assert answer.startswith(b"HTTP/1.1 413") and took < 3, answer[:200]

    # a body within the limit still reaches validation (422 naming the field), and the server is healthy
    body = b'{"kind": "nope"}'
    head = (b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    answer, _ = _raw_exchange(server, head, [body])
    assert answer.startswith(b"HTTP/1.1 422"), answer[:200]
    assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
