"""/v1/plans and /v1/estimate."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Body, Depends, Header, Query, Response

from service import plans
from service.auth import ReadAccess, SubmitAccess
from service.calibration_sets import with_resolution
from service.canonical import content_hash
from service.context import ServiceContext, get_context
from service.errors import Conflict, TooLarge
from service.finite_json import FiniteJSONRoute
from service.limits import check_limits
from service.schemas import PlanList, PlanOut, PlanStatus
from service.tokens import Principal
from service.validation import check_file_references, kind_of, validate_plan_request
from solvers.documents import TERMINAL
from solvers.errors import SpecError
from solvers.exports import EXPORTERS, ExportFormat, ExportOf, export

router = APIRouter(prefix="/v1", tags=["plans"], route_class=FiniteJSONRoute)
log = logging.getLogger("paraplan.api")

_EXAMPLE = {"kind": "hybrid", "model": {"preset": "llama2-7b"},
            "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
            "training": {"global_batch_size": 64, "seq_length": 2048}}


async def wait_for_terminal(ctx: ServiceContext, plan_id: str, wait_s: float) -> None:
    """Long-poll: return when the plan reaches a terminal state or ``wait_s`` passes."""
    deadline = time.monotonic() + min(wait_s, ctx.settings.max_wait_s)
    delay = 0.02
    while time.monotonic() < deadline:
        status = await to_thread.run_sync(_status, ctx, plan_id)
        if status in TERMINAL or status is None:
            return
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 1.5, 0.25)


def _status(ctx: ServiceContext, plan_id: str) -> str | None:
    with ctx.db.reading() as session:
        return plans.plan_status(session, plan_id)


def _get(ctx: ServiceContext, plan_id: str) -> dict[str, Any]:
    with ctx.db.reading() as session:
        return plans.get_plan(session, plan_id)


def _submit(ctx: ServiceContext, body: dict[str, Any], kind: str, digest: str,
            key: str | None) -> tuple[dict[str, Any], bool]:
    return plans.submit_plan(ctx.db, body, kind, ctx.settings.job_max_attempts, key,
                             validate=lambda: validate_plan_request(body, ctx.settings), digest=digest)


# on POST /v1/plans: "true" when the answer is a plan an identical request (or this Idempotency-Key) made before,
# which is returned as it is rather than solved again
EXISTING_HEADER = "Paraplan-Existing-Plan"


def _json(body: bytes, status: int = 200, location: str | None = None, existing: bool | None = None) -> Response:
    headers = {"Location": location} if location else {}
    if existing is not None:
        headers[EXISTING_HEADER] = str(existing).lower()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


@router.post("/plans", response_model=PlanOut, status_code=202,
             responses={200: {"description": "an identical request was already solved (or finished within "
                                             "`wait`): the stored plan; the `Paraplan-Existing-Plan` header says "
                                             "which (true: a plan made before, returned as it is)",
                              "model": PlanOut},
                        409: {"description": "Idempotency-Key reused with another body"},
                        413: {"description": "body or solver input over a limit"},
                        422: {"description": "invalid request; `loc` names the field"}})
async def submit_plan(
    body: dict[str, Any] = Body(..., examples=[_EXAMPLE], description="a plan request (see the contract)"),
    wait: float = Query(0.0, ge=0, description="hold the request up to this many seconds for a terminal state"),
    idempotency_key: str | None = Header(None, alias="Idempotency-Key", max_length=255),
    ctx: ServiceContext = Depends(get_context),
    _: Principal = SubmitAccess,
) -> Response:
    """Submit a plan request. Identical requests (same canonical JSON) are solved once."""
    kind = kind_of(body)
    check_limits(body, ctx.settings)
    # the calibration set it is priced with is part of the request: a new version of a set is a new plan
    body = await to_thread.run_sync(with_resolution, ctx.db, body)
    digest = content_hash(body)
    if idempotency_key is None and (known := ctx.plans.plan_for_hash(digest)) is not None:
        cached = ctx.plans.body(known)
        if cached is not None:  # solved before: no thread hop, no database
            return _json(cached, 200, f"/v1/plans/{known}", existing=True)
    view, created = await to_thread.run_sync(_submit, ctx, body, kind, digest, idempotency_key)
    if created:
        ctx.on_queued()
    # ties this request's id to the plan (and, through the dispatcher's lines, to its job)
    log.info("plan %s %s", view["id"], "queued" if created else "already known", extra={"plan_id": view["id"]})
    if wait > 0 and view["status"] not in TERMINAL:
        await wait_for_terminal(ctx, view["id"], wait)
        view = await to_thread.run_sync(_get, ctx, view["id"])
    status = 200 if view["status"] in TERMINAL else 202
    return _json(ctx.plans.remember(view), status, f"/v1/plans/{view['id']}", existing=not created)


@router.get("/plans", response_model=PlanList)
def list_plans(status: PlanStatus | None = None, kind: str | None = Query(None, max_length=32),
               limit: int = Query(50, ge=1, le=500), cursor: str | None = Query(None, max_length=32),
               ctx: ServiceContext = Depends(get_context), _: Principal = ReadAccess) -> dict[str, Any]:
    """Plans, newest first; follow `next_cursor` for older ones."""
    with ctx.db.reading() as session:
        return plans.list_plans(session, status, kind, limit, cursor)


@router.get("/plans/{plan_id}", response_model=PlanOut)
async def get_plan(plan_id: str, wait: float = Query(0.0, ge=0), ctx: ServiceContext = Depends(get_context),
                   _: Principal = ReadAccess) -> Response:
    """A plan with its request, status, progress and (when succeeded) result."""
    cached = ctx.plans.body(plan_id)
    if cached is not None:  # terminal plans never change
        return _json(cached)
    view = await to_thread.run_sync(_get, ctx, plan_id)
    if wait > 0 and view["status"] not in TERMINAL:
        await wait_for_terminal(ctx, plan_id, wait)
        view = await to_thread.run_sync(_get, ctx, plan_id)
    return _json(ctx.plans.remember(view))


@router.post("/plans/{plan_id}/cancel", response_model=PlanOut,
             responses={409: {"description": "the plan is already in a terminal state"}})
def cancel_plan(plan_id: str, ctx: ServiceContext = Depends(get_context),
                _: Principal = SubmitAccess) -> dict[str, Any]:
    return plans.cancel_plan(ctx.db, plan_id)


@router.get("/plans/{plan_id}/export", responses={200: {"content": {e.media_type: {} for e in EXPORTERS.values()}},
                                                  409: {"description": "not a succeeded hybrid plan"},
                                                  422: {"description": "unknown format"}})
def export_plan(plan_id: str, format: ExportFormat = Query(..., description="target framework"),
                of: ExportOf = Query("plan", description="the plan, or one of its baselines (megatron: the best "
                                     "uniform plan, which Megatron-LM runs as it is)"),
                ctx: ServiceContext = Depends(get_context), _: Principal = ReadAccess) -> Response:
    """The plan (or a baseline) as a launch configuration for Megatron-LM, DeepSpeed, TorchTitan or Galvatron."""
    view = _get(ctx, plan_id)
    if view["kind"] != "hybrid":
        raise Conflict(f"export is for hybrid plans; plan {plan_id} is {view['kind']}")
    if view["status"] != "succeeded":
        raise Conflict(f"plan {plan_id} is {view['status']}; only a succeeded plan can be exported")
    out = export(view["result"], format, view["request"], of)
    exporter = EXPORTERS[format]
    which = "" if of == "plan" else f"-{of}"
    filename = f"paraplan-{plan_id[:8]}{which}-{format}.{exporter.extension}"
    return Response(out, media_type=exporter.media_type,
                    headers={"Content-Disposition": f'inline; filename="{filename}"'})


@router.post("/estimate", responses={413: {"description": "solver input over a limit"},
                                     422: {"description": "invalid request; `loc` names the field"}})
def estimate(body: dict[str, Any] | list[dict[str, Any]] = Body(..., description="one request or an array"),
             ctx: ServiceContext = Depends(get_context), _: Principal = ReadAccess) -> Any:
    """What-if estimate of a given strategy (synchronous: estimates are fast). An array (up to
    PARAPLAN_MAX_ESTIMATES elements) gives an array, with `{"error": ..., "status": 422 or 413}` in place of an
    element that is invalid or over a limit."""
    from solvers.api import estimate as estimate_fn

    def one(request: dict[str, Any]) -> dict[str, Any]:
        kind_of(request)
        check_limits(request, ctx.settings)
        check_file_references(request, ctx.settings)
        return estimate_fn(with_resolution(ctx.db, request)).to_json()

    if isinstance(body, list):
        if len(body) > ctx.settings.max_estimates:
            raise TooLarge(f"request has {len(body)} estimates; this service's limit max_estimates is "
                           f"{ctx.settings.max_estimates} (PARAPLAN_MAX_ESTIMATES)")
        # An element the service refuses (invalid: 422, over a limit: 413) is an error in its place, so that
        # one bad element does not cost the others their answers.
        out: list[dict[str, Any]] = []
        for request in body:
            try:
                out.append(one(request))
            except SpecError as err:
                out.append({"error": str(err), "status": 422, "detail": err.as_detail()})
            except TooLarge as err:
                out.append({"error": err.detail, "status": 413})
        return out
    return one(body)
