"""Runs: a succeeded plan executed by a worker, leased like a solver job (claim, heartbeat, complete/fail).

Every write by a worker is conditional on it holding the lease of a running run, so a run completes
exactly once and a worker that lost its lease learns it (409) and aborts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.engine import Database
from service.db.models import Plan, PlanRequest, Run, utcnow
from service.errors import Conflict, Forbidden, NotFound, NotRunnable, get_or_404
from service.tokens import Principal
from service.workers import owned_worker, workers_of_token
from solvers.documents import TERMINAL, FlexSPResult, HybridResult, PlanResult, SpindleResult, load_result
from solvers.errors import SpecError
from solvers.run_layout import check_runnable


def predicted_of(result: PlanResult | None) -> dict[str, Any]:
    """What the plan predicts a run measures: its step (a Spindle iteration) and its peak memory per GPU."""
    if isinstance(result, HybridResult | FlexSPResult):
        return {"step_time_s": result.estimate.step_time_s, "peak_memory_gib": result.estimate.peak_memory_gib}
    if isinstance(result, SpindleResult):
        return {"step_time_s": result.estimate.iteration_time_s, "peak_memory_gib": result.estimate.peak_memory_gib}
    return {"step_time_s": None, "peak_memory_gib": None}


def run_view(run: Run) -> dict[str, Any]:
    return {"id": run.id, "plan_id": run.plan_id, "status": run.status, "worker": run.worker_id,
            "steps": run.steps, "attempts": run.attempts, "error": run.error, "metrics": run.metrics or {},
            "predicted": run.predicted or {}, "progress": run.progress or [],
            "lease_expires_at": run.lease_expires_at, "created_at": run.created_at,
            "started_at": run.started_at, "finished_at": run.finished_at}


def create_run(session: Session, plan_id: str, steps: int, max_attempts: int) -> dict[str, Any]:
    plan = get_or_404(session, Plan, plan_id, "plan")
    if plan.status != "succeeded":
        raise Conflict(f"plan {plan_id} is {plan.status}; only a succeeded plan can be run")
    request = session.get(PlanRequest, plan.request_id)
    assert request is not None  # a foreign key
    try:  # the worker's own test: a run is queued only when it will execute this plan as planned
        check_runnable({"kind": plan.kind, "request": request.request, "result": plan.result})
    except SpecError as err:
        raise NotRunnable(err.problems) from None
    run = Run(plan_id=plan_id, steps=steps, status="queued", max_attempts=max_attempts,
              predicted=predicted_of(load_result(plan.kind, plan.result) if plan.result else None), progress=[])
    session.add(run)
    session.flush()
    return run_view(run)


def _readable(session: Session, run: Run, principal: Principal) -> None:
    if principal.scope == "worker" and principal.token_id is not None and (
        run.worker_id is None or run.worker_id not in workers_of_token(session, principal.token_id)
    ):
        raise Forbidden(f"run {run.id} is not held by a worker of this token")


def get_run(session: Session, run_id: str, principal: Principal) -> dict[str, Any]:
    run = get_or_404(session, Run, run_id, "run")
    _readable(session, run, principal)
    return run_view(run)


def list_runs(session: Session, principal: Principal, plan_id: str | None = None, status: str | None = None,
              limit: int = 100) -> list[dict[str, Any]]:
    query = select(Run).order_by(Run.created_at.desc()).limit(limit)
    if plan_id:
        query = query.where(Run.plan_id == plan_id)
    if status:
        query = query.where(Run.status == status)
    if principal.scope == "worker" and principal.token_id is not None:
        query = query.where(Run.worker_id.in_(workers_of_token(session, principal.token_id)))
    return [run_view(r) for r in session.execute(query).scalars()]


def reap_expired_runs(session: Session) -> int:
    """Runs whose worker stopped renewing: back to queued, or failed on the last attempt."""
    now = utcnow()
    expired = session.execute(
        select(Run).where(Run.status == "running", Run.lease_expires_at < now).with_for_update(skip_locked=True)
    ).scalars().all()
    for run in expired:
        reason = f"lease of worker {run.worker_id} expired (attempt {run.attempts} of {run.max_attempts})"
        if run.attempts >= run.max_attempts:
            run.status, run.finished_at = "failed", now
        else:
            run.status = "queued"
        run.error, run.lease_expires_at = reason, None
    return len(expired)


def claim_run(db: Database, worker_id: str, principal: Principal, lease_s: float) -> dict[str, Any] | None:
    with db.writing() as session:
        owned_worker(session, worker_id, principal).last_heartbeat = utcnow()
        reap_expired_runs(session)
        run = session.execute(
            select(Run).where(Run.status == "queued").order_by(Run.created_at).limit(1)
            .with_for_update(skip_locked=True)
        ).scalar_one_or_none()
        if run is None:
            return None
        now = utcnow()
        run.status, run.worker_id, run.attempts = "running", worker_id, run.attempts + 1
        run.lease_expires_at = now + timedelta(seconds=lease_s)
        run.started_at = run.started_at or now
        plan, request = session.execute(
            select(Plan, PlanRequest.request).join(PlanRequest, PlanRequest.id == Plan.request_id)
            .where(Plan.id == run.plan_id)
        ).one()
        return {"id": run.id, "plan_id": run.plan_id, "steps": run.steps, "attempt": run.attempts,
                "lease_expires_at": run.lease_expires_at,
                "plan": {"id": plan.id, "kind": plan.kind, "request": request,
                         "result": load_result(plan.kind, plan.result) if plan.result else None}}


def _held_run(session: Session, run_id: str, worker_id: str, principal: Principal) -> Run:
    owned_worker(session, worker_id, principal)
    run = session.execute(select(Run).where(Run.id == run_id).with_for_update()).scalar_one_or_none()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.status in TERMINAL:
        raise Conflict(f"run {run_id} is already {run.status}")
    # A lease past its expiry is honoured until a claim reaps it (status back to queued): a late heartbeat
    # from a live worker is not a crash.
    if run.status != "running" or run.worker_id != worker_id:
        raise Conflict(f"worker {worker_id} does not hold the lease of run {run_id}")
    return run


def heartbeat_run(db: Database, run_id: str, worker_id: str, principal: Principal, lease_s: float) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        run.lease_expires_at = utcnow() + timedelta(seconds=lease_s)
        return {"lease_expires_at": run.lease_expires_at}


def report_metrics(db: Database, run_id: str, worker_id: str, principal: Principal, lease_s: float,
                   point: dict[str, Any]) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        # one point per (attempt, step): a worker's retried report (its response lost) replaces its first instead
        # of doubling it, and a retried run's points stay apart from the failed attempt's
        point = {**point, "attempt": run.attempts}
        progress = list(run.progress or [])
        key = (run.attempts, point["step"])
        at = next((i for i, p in enumerate(progress) if (p.get("attempt"), p.get("step")) == key), None)
        if at is None:
            progress.append(point)
        else:
            progress[at] = point
        run.progress = progress[-10_000:]
        run.lease_expires_at = utcnow() + timedelta(seconds=lease_s)
        return {"ok": True, "lease_expires_at": run.lease_expires_at}


def complete_run(db: Database, run_id: str, worker_id: str, principal: Principal,
                 metrics: dict[str, Any]) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        run.status, run.metrics, run.finished_at, run.lease_expires_at = "succeeded", metrics, utcnow(), None
        run.error = None
        return run_view(run)


def fail_run(db: Database, run_id: str, worker_id: str, principal: Principal, error: str,
             retryable: bool) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        run.error, run.lease_expires_at = error, None
        if retryable and run.attempts < run.max_attempts:
            run.status = "queued"
        else:
            run.status, run.finished_at = "failed", utcnow()
            if retryable:
                run.error = f"{error} (gave up after {run.attempts} attempts)"
        return run_view(run)


def cancel_run(db: Database, run_id: str) -> dict[str, Any]:
    with db.writing() as session:
        run = get_or_404(session, Run, run_id, "run")
        if run.status in TERMINAL:
            raise Conflict(f"run {run_id} is already {run.status}")
        run.status, run.finished_at, run.lease_expires_at = "cancelled", utcnow(), None
        return run_view(run)
