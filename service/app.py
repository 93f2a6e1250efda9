"""FastAPI application factory.

Layering: pydantic schemas (``service.schemas``) → service functions that take a session and raise domain
errors (``service.plans``, ``runs``, ``workers``, ``profiles``, ``tokens``) → thin routes
(``service.routes``). ``service.errors.HTTP_STATUS`` is the one table from errors to HTTP statuses.

The dashboard (``service.ui``) is mounted with the app's ``ServiceContext``, through which it reaches the
settings, the database and the token cache, and reuses the service functions.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from service.context import ServiceContext
from service.db.engine import Database
from service.dispatcher import Dispatcher
from service.errors import HTTP_STATUS, http_body, http_status
from service.finite_json import validation_error
from service.metrics import Metrics
from service.middleware import BodyLimit, RequestMetrics
from service.routes import calibration_sets, ops, plans, profiles, runs
from service.schemas import ErrorOut
from service.settings import Settings, get_settings
from service.tokens import TokenCache
from service.ui import mount_ui

log = logging.getLogger("paraplan.service")
# Documented on every API operation so that clients (and schema checks) know each error's shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text} for code, text in (
        (400, "malformed body (not JSON)"), (401, "missing or invalid bearer token"),
        (403, "the token's scope does not allow this"), (404, "no such object"),
        (413, "body or solver input over a limit"), (503, "database temporarily unavailable; retry"))}


async def _domain_error(_: Request, err: Exception) -> JSONResponse:
    status = http_status(err) or 500
    headers = {"Retry-After": "1"} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    if status >= 500:
        log.warning("%s: %s", type(err).__name__, err)
    return JSONResponse(http_body(err, status), status_code=status, headers=headers)


def create_app(settings: Settings | None = None, database: Database | None = None) -> FastAPI:
    settings = settings or get_settings()
    db = database or Database.connect(settings.database_url)
    ctx = ServiceContext(settings=settings, db=db, tokens=TokenCache(), metrics=Metrics())
    ctx.metrics.attach_database(db.read)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        dispatcher = None
        if settings.seed_demo_plan:
            from service.demo import seed_demo_plan

            try:
                seed_demo_plan(ctx)
            except Exception:
                log.exception("demo plan not seeded")
        if settings.run_dispatcher:
            dispatcher = Dispatcher(db, settings)
            dispatcher.start_background()
            ctx.on_queued = dispatcher.wake
        try:
            yield
        finally:
            if dispatcher is not None:
                dispatcher.shutdown()
            if database is None:
                db.dispose()

    app = FastAPI(title="paraplan", version="0.1.0", lifespan=lifespan,
                  description="Parallel training plans as a service: submit a model, cluster and batch; get a "
                              "hybrid / FlexSP / Spindle plan; have workers execute it. Authorization: "
                              "`Bearer <token>` (see `paraplan token create`).")
    app.state.ctx = ctx
    # the same objects one by one, for callers that reach into the app (tests adjust settings this way)
    app.state.settings, app.state.db, app.state.token_cache = settings, db, ctx.tokens
    for cls, _status in HTTP_STATUS:
        app.add_exception_handler(cls, _domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.include_router(ops.router)
    for router in (plans.router, runs.router, profiles.router, calibration_sets.router):
        app.include_router(router, responses=ERROR_RESPONSES)
    mount_ui(app, ctx)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(RequestMetrics, metrics=ctx.metrics)
    return app



