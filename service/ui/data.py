"""The dashboard's only door to plans and runs: the service-layer functions, never tables directly.

Also resolves who is calling. Browsers send no Authorization header, so the dashboard accepts the same
bearer token from a cookie (set when a token is typed into the form) and applies the service's own rules:
reads are open unless the service requires read tokens; submitting needs a submit token unless the
service is open (no tokens exist yet).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from service import plans, runs, workers
from service.calibration_sets import with_resolution
from service.context import ServiceContext
from service.tokens import Principal, authenticate
from service.validation import validate_plan_request

TOKEN_COOKIE = "paraplan_token"


def context(request: Request) -> ServiceContext:
    """The app's settings, database and token cache (``mount_ui`` put them there)."""
    ctx: ServiceContext = request.app.state.ctx
    return ctx


def principal(request: Request, required: str, token: str | None = None) -> Principal:
    """The caller, from a typed token, the Authorization header or the dashboard cookie (401/403 else)."""
    ctx = context(request)
    raw = token or request.cookies.get(TOKEN_COOKIE)
    authorization = f"Bearer {raw}" if raw else request.headers.get("authorization")
    with ctx.db.reading() as session:
        return authenticate(session, ctx.tokens, authorization, required, ctx.settings.token_pepper,
                            ctx.settings.open_when_no_tokens, not ctx.settings.require_read_token)


def list_plans(request: Request, *, kind: str | None, status: str | None, cursor: str | None,
               limit: int) -> dict[str, Any]:
    with context(request).db.reading() as session:
        return plans.list_plans(session, status=status, kind=kind, limit=limit, cursor=cursor, with_request=True)


def get_plan(request: Request, plan_id: str) -> dict[str, Any]:
    with context(request).db.reading() as session:
        return plans.get_plan(session, plan_id)


def statuses(request: Request, plan_ids: list[str]) -> dict[str, str | None]:
    with context(request).db.reading() as session:
        return {pid: plans.plan_status(session, pid) for pid in plan_ids}


def get_run(request: Request, run_id: str, caller: Principal) -> dict[str, Any]:
    with context(request).db.reading() as session:
        return runs.get_run(session, run_id, caller)


def runs_of_plan(request: Request, plan_id: str, caller: Principal) -> list[dict[str, Any]]:
    with context(request).db.reading() as session:
        return runs.list_runs(session, caller, plan_id=plan_id, limit=20)


def list_runs(request: Request, caller: Principal, status: str | None, limit: int) -> list[dict[str, Any]]:
    with context(request).db.reading() as session:
        return runs.list_runs(session, caller, status=status, limit=limit)


def list_workers(request: Request) -> list[dict[str, Any]]:
    ctx = context(request)
    with ctx.db.reading() as session:
        return workers.list_workers(session, ctx.settings.run_lease_s)


def create_run(request: Request, plan_id: str, steps: int) -> dict[str, Any]:
    """Queue a run of a succeeded plan (Conflict when it has not succeeded) for a worker to claim."""
    ctx = context(request)
    with ctx.db.writing() as session:
        return runs.create_run(session, plan_id, steps, ctx.settings.run_max_attempts)


def submit(request: Request, plan_request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Validate (SpecError / TooLarge name the problem) and queue the request; returns the plan view and whether
    it is new (False: an identical request's plan, made before)."""
    ctx = context(request)
    plan_request = with_resolution(ctx.db, plan_request)  # (before validation: it prices with the set)
    kind = validate_plan_request(plan_request, ctx.settings)
    view, created = plans.submit_plan(ctx.db, plan_request, kind, ctx.settings.job_max_attempts)
    if created:
        ctx.on_queued()  # wake the dispatcher now, as the API's POST does, instead of at its next poll
    return view, created
