"""Solve on a paraplan server: submit, then long-poll with a progress bar (stderr) until a terminal state."""

from __future__ import annotations

import time
from typing import Any

import httpx
import typer

from solvers.documents import TERMINAL, DocumentError, PlanResult, load_result


def _check(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code >= 400:
        typer.echo(f"error: server answered {resp.status_code}: {resp.text}", err=True)
        raise typer.Exit(2 if resp.status_code in (400, 413, 422) else 1)
    body: dict[str, Any] = resp.json()
    return body


def existing_note(body: dict[str, Any]) -> str:
    """What a plan answered for an identical request made before is (the server returns it, not a new solve)."""
    when = str(body.get("created_at") or "")[:19].replace("T", " ")
    return (f"an identical request was submitted before: this is plan {body.get('id')} from {when} UTC, not a new "
            "solve (any change to the request, e.g. constraints.seed, makes a new one)")


def plan_remote(server: str, token: str | None, request: Any, timeout_s: float = 600.0,
                quiet: bool = False) -> PlanResult:
    from rich.progress import Progress

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = server.rstrip("/")
    with httpx.Client(base_url=base, headers=headers, timeout=30.0) as client:
        try:
            resp = client.post("/v1/plans", json=request, params={"wait": 1})
            body = _check(resp)
            if resp.headers.get("Paraplan-Existing-Plan") == "true":
                typer.echo(f"note: {existing_note(body)}", err=True)
            deadline = time.monotonic() + timeout_s
            # The bar appears only for solves that outlast the first second (the POST waited that long).
            with Progress(transient=True, disable=quiet or body.get("status") in TERMINAL) as bar:
                task = bar.add_task("queued", total=1.0)
                while body.get("status") not in TERMINAL and time.monotonic() < deadline:
                    progress = body.get("progress") or {}
                    bar.update(task, completed=progress.get("fraction") or 0.0,
                               description=progress.get("message") or str(body.get("status")))
                    body = _check(client.get(f"/v1/plans/{body['id']}", params={"wait": 1}))
        except httpx.HTTPError as err:
            typer.echo(f"error: cannot reach {base}: {err}", err=True)
            raise typer.Exit(1) from None
        if body.get("status") != "succeeded":
            typer.echo(f"error: plan {body.get('id')} {body.get('status')}: {body.get('error')}", err=True)
            raise typer.Exit(2 if body.get("error_detail") else 1)
        try:
            return load_result(body["kind"], body["result"])
        except DocumentError as err:  # a server of another version: say so, not a traceback
            typer.echo(f"error: plan {body.get('id')}: {err}", err=True)
            raise typer.Exit(1) from None
