"""Solve on a paraplan server: submit, then poll with a progress spinner until a terminal state."""

from __future__ import annotations

import time
from typing import Any

import httpx
import typer

TERMINAL = {"succeeded", "failed", "cancelled"}


def plan_remote(server: str, token: str | None, request: Any, timeout_s: float = 600.0) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = server.rstrip("/")
    with httpx.Client(base_url=base, headers=headers, timeout=30.0) as client:
        try:
            resp = client.post("/v1/plans", json=request, params={"wait": 5})
        except httpx.HTTPError as err:
            typer.echo(f"error: cannot reach {base}: {err}", err=True)
            raise typer.Exit(1) from None
        if resp.status_code >= 400:
            typer.echo(f"error: server answered {resp.status_code}: {resp.text}", err=True)
            raise typer.Exit(2 if resp.status_code in (400, 413, 422) else 1)
        body: dict[str, Any] = resp.json()
        deadline = time.monotonic() + timeout_s
        while body.get("status") not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
            body = client.get(f"/v1/plans/{body['id']}").json()
        if body.get("status") != "succeeded":
            typer.echo(f"error: plan {body.get('id')} {body.get('status')}: {body.get('error')}", err=True)
            raise typer.Exit(1)
        result: dict[str, Any] = body["result"]
        return result
