"""The dashboard's only door to plans and runs: the service-layer functions, never tables directly.

Also resolves who is calling. Browsers send no Authorization header, so the dashboard accepts the same
bearer token from a cookie (set when a token is typed into the form) and applies the service's own rules:
reads are open unless the service requires read tokens; submitting needs a submit token unless the
service is open (no tokens exist yet).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from service import plans, runs
from service.db.engine import Database
from service.settings import Settings
from service.tokens import Principal, TokenCache, authenticate
from service.validation import validate_plan_request

TOKEN_COOKIE = "paraplan_token"
_fallback_cache = TokenCache()


def settings_of(request: Request) -> Settings:
    from service.settings import get_settings

    found = getattr(request.app.state, "settings", None)
    return found if isinstance(found, Settings) else get_settings()


def database(request: Request) -> Database:
    db = getattr(request.app.state, "db", None)
    if not isinstance(db, Database):
        raise RuntimeError("the dashboard needs app.state.db (service.db.engine.Database)")
    return db


def principal(request: Request, required: str, token: str | None = None) -> Principal:
    """The caller, from a typed token, the Authorization header or the dashboard cookie (401/403 else)."""
    settings = settings_of(request)
    raw = token or request.cookies.get(TOKEN_COOKIE)
    authorization = f"Bearer {raw}" if raw else request.headers.get("authorization")
    cache = getattr(request.app.state, "token_cache", None)
    with database(request).reading() as session:
        return authenticate(session, cache if isinstance(cache, TokenCache) else _fallback_cache, authorization,
                            required, settings.token_pepper, settings.open_when_no_tokens,
                            not settings.require_read_token)


def list_plans(request: Request, *, kind: str | None, status: str | None, cursor: str | None,
               limit: int) -> dict[str, Any]:
    with database(request).reading() as session:
        return plans.list_plans(session, status=status, kind=kind, limit=limit, cursor=cursor, with_request=True)


def get_plan(request: Request, plan_id: str) -> dict[str, Any]:
    with database(request).reading() as session:
        return plans.get_plan(session, plan_id)


def statuses(request: Request, plan_ids: list[str]) -> dict[str, str | None]:
    with database(request).reading() as session:
        return {pid: plans.plan_status(session, pid) for pid in plan_ids}


def get_run(request: Request, run_id: str, caller: Principal) -> dict[str, Any]:
    with database(request).reading() as session:
        return runs.get_run(session, run_id, caller)


def runs_of_plan(request: Request, plan_id: str, caller: Principal) -> list[dict[str, Any]]:
    with database(request).reading() as session:
        return runs.list_runs(session, caller, plan_id=plan_id, limit=20)


def submit(request: Request, plan_request: dict[str, Any]) -> dict[str, Any]:
    """Validate (SpecError / TooLarge name the problem) and queue the request; returns the plan view."""
    settings = settings_of(request)
    kind = validate_plan_request(plan_request, settings)
    view, _created = plans.submit_plan(database(request), plan_request, kind, settings.job_max_attempts)
    return view
