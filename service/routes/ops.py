"""/healthz, /readyz, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.context import ServiceContext, get_context
from service.errors import db_unavailable_reason
from service.migrate import current_revision, head_revision

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "database unreachable or not migrated to head"}})
def readyz(ctx: ServiceContext = Depends(get_context)) -> Response:
    """Ready to serve: the database answers and its schema is at the migrations' head."""
    try:
        current = current_revision(ctx.db.engine)
    except Exception as err:
        return JSONResponse({"status": "unavailable", "reason": f"{db_unavailable_reason(err)}: {type(err).__name__}"},
                            status_code=503)
    head = head_revision()
    if current != head:
        return JSONResponse({"status": "unavailable",
                             "reason": f"database schema at {current or 'no revision'}, migrations head is {head}; "
                                       "run `paraplan db upgrade`"}, status_code=503)
    return JSONResponse({"status": "ok", "revision": current})


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(ctx: ServiceContext = Depends(get_context)) -> Response:
    """Prometheus exposition."""
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
