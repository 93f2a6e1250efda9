"""/v1/plans/{id}/runs, /v1/runs and the worker endpoints (register, claim, heartbeat, metrics, complete, fail)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Response, status

from service import runs, workers
from service.auth import ReadAccess, SubmitAccess, WorkerAccess
from service.context import ServiceContext, get_context
from service.finite_json import FiniteJSONRoute
from service.schemas import (
    ClaimBody,
    ClaimOut,
    CompleteBody,
    FailBody,
    LeaseOut,
    MetricsReport,
    PlanStatus,
    RunCreate,
    RunOut,
    RunSubmit,
    WorkerRef,
    WorkerRegister,
    WorkerRegistered,
)
from service.tokens import Principal

router = APIRouter(prefix="/v1", tags=["runs"], route_class=FiniteJSONRoute)
log = logging.getLogger("paraplan.api")
_LEASE_LOST: dict[int | str, dict[str, Any]] = {
    409: {"description": "this worker does not hold the run's lease (abort the run), or it is terminal"}}


_RUN_REFUSED: dict[int | str, dict[str, Any]] = {
    409: {"description": "the plan has not succeeded"},
    422: {"description": "the worker cannot run this plan exactly (each problem's loc is a field of the plan)"}}


@router.post("/plans/{plan_id}/runs", response_model=RunOut, status_code=201, responses=_RUN_REFUSED)
def create_run(plan_id: str, body: RunCreate, ctx: ServiceContext = Depends(get_context),
               _: Principal = SubmitAccess) -> dict[str, Any]:
    """Ask for a succeeded plan to be executed by a worker, exactly as planned (else 422 with the reason)."""
    return _queue_run(ctx, plan_id, body)


@router.post("/runs", response_model=RunOut, status_code=201, responses=_RUN_REFUSED)
def submit_run(body: RunSubmit, ctx: ServiceContext = Depends(get_context),
               _: Principal = SubmitAccess) -> dict[str, Any]:
    """``POST /v1/plans/{plan_id}/runs`` with the plan named in the body."""
    return _queue_run(ctx, body.plan_id, body)


def _queue_run(ctx: ServiceContext, plan_id: str, body: RunCreate) -> dict[str, Any]:
    with ctx.db.writing() as session:
        dataset = body.dataset.model_dump(exclude_none=True) if body.dataset else None
        run = runs.create_run(session, plan_id, body.steps, ctx.settings.run_max_attempts,
                              body.checkpoint_every_steps, dataset)
    log.info("run %s queued for plan %s", run["id"], plan_id, extra={"run_id": run["id"], "plan_id": plan_id})
    return run


@router.get("/runs", response_model=list[RunOut])
def list_runs(plan_id: str | None = Query(None, max_length=32), status: PlanStatus | None = None,
              limit: int = Query(100, ge=1, le=1000), ctx: ServiceContext = Depends(get_context),
              principal: Principal = ReadAccess) -> list[dict[str, Any]]:
    with ctx.db.reading() as session:
        return runs.list_runs(session, principal, plan_id, status, limit)


@router.get("/runs/{run_id}", response_model=RunOut)
def get_run(run_id: str, ctx: ServiceContext = Depends(get_context),
            principal: Principal = ReadAccess) -> dict[str, Any]:
    """A run with its measured metrics next to the plan's predictions. Worker tokens see only their runs."""
    with ctx.db.reading() as session:
        return runs.get_run(session, run_id, principal)


@router.post("/runs/{run_id}/cancel", response_model=RunOut,
             responses={409: {"description": "the run is already in a terminal state"}})
def cancel_run(run_id: str, ctx: ServiceContext = Depends(get_context), _: Principal = SubmitAccess) -> dict[str, Any]:
    return runs.cancel_run(ctx.db, run_id)


# --- worker endpoints ----------------------------------------------------------------------------
@router.post("/workers/register", response_model=WorkerRegistered, status_code=201, tags=["workers"])
def register_worker(body: WorkerRegister, ctx: ServiceContext = Depends(get_context),
                    principal: Principal = WorkerAccess) -> dict[str, Any]:
    lease_s = ctx.settings.run_lease_s
    with ctx.db.writing() as session:
        worker = workers.register_worker(session, body.model_dump(), principal)
        return {"id": worker.id, "heartbeat_interval_s": lease_s / 4, "lease_s": lease_s}


@router.post("/workers/{worker_id}/heartbeat", tags=["workers"])
def worker_heartbeat(worker_id: str, ctx: ServiceContext = Depends(get_context),
                     principal: Principal = WorkerAccess) -> dict[str, bool]:
    with ctx.db.writing() as session:
        workers.heartbeat(session, worker_id, principal)
    return {"ok": True}


@router.get("/workers", tags=["workers"])
def list_workers(ctx: ServiceContext = Depends(get_context), _: Principal = ReadAccess) -> list[dict[str, Any]]:
    with ctx.db.reading() as session:
        return workers.list_workers(session, ctx.settings.run_lease_s)


@router.post("/runs/claim", response_model=ClaimOut, response_model_exclude_unset=True, tags=["workers"],
             responses={204: {"description": "nothing claimable within wait_s"}})
async def claim_run(body: ClaimBody, ctx: ServiceContext = Depends(get_context),
                    principal: Principal = WorkerAccess) -> Any:
    """Atomically take the oldest queued run this worker can hold (long-polls up to `wait_s`); a run on N nodes
    starts when N workers have joined it, each polling to keep its place (`service.runs`)."""
    deadline = time.monotonic() + body.wait_s
    while True:
        claimed = await to_thread.run_sync(runs.claim_run, ctx.db, body.worker_id, principal, ctx.settings.run_lease_s,
                                           body.endpoint)
        if claimed is not None:
            log.info("run %s claimed by worker %s", claimed["id"], body.worker_id,
                     extra={"run_id": claimed["id"], "worker_id": body.worker_id})
            return {"run": claimed}
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        await asyncio.sleep(min(0.5, remaining))


@router.post("/runs/{run_id}/heartbeat", response_model=LeaseOut, tags=["workers"], responses=_LEASE_LOST)
def run_heartbeat(run_id: str, body: WorkerRef, ctx: ServiceContext = Depends(get_context),
                  principal: Principal = WorkerAccess) -> dict[str, Any]:
    return runs.heartbeat_run(ctx.db, run_id, body.worker_id, principal, ctx.settings.run_lease_s)


@router.post("/runs/{run_id}/metrics", tags=["workers"], responses=_LEASE_LOST)
def run_metrics(run_id: str, body: MetricsReport, ctx: ServiceContext = Depends(get_context),
                principal: Principal = WorkerAccess) -> dict[str, Any]:
    point = body.model_dump(exclude={"worker_id"})
    return runs.report_metrics(ctx.db, run_id, body.worker_id, principal, ctx.settings.run_lease_s, point)


@router.post("/runs/{run_id}/complete", response_model=RunOut, tags=["workers"], responses=_LEASE_LOST)
def complete_run(run_id: str, body: CompleteBody, ctx: ServiceContext = Depends(get_context),
                 principal: Principal = WorkerAccess) -> dict[str, Any]:
    return runs.complete_run(ctx.db, run_id, body.worker_id, principal, body.metrics)


@router.post("/runs/{run_id}/fail", response_model=RunOut, tags=["workers"], responses=_LEASE_LOST)
def fail_run(run_id: str, body: FailBody, ctx: ServiceContext = Depends(get_context),
             principal: Principal = WorkerAccess) -> dict[str, Any]:
    return runs.fail_run(ctx.db, run_id, body.worker_id, principal, body.error, body.retryable)
