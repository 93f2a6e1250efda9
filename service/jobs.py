"""The solver job queue: claim under a lease, renew, finish, and recover jobs whose dispatcher died.

A claim is atomic: on PostgreSQL the candidate row is locked with ``FOR UPDATE SKIP LOCKED`` so that
concurrent dispatchers take different jobs; on SQLite the write transaction starts with ``BEGIN IMMEDIATE``
which serialises claimers. Every later write by a dispatcher is conditional on it still holding the lease
(owner and status), so a dispatcher that lost its lease can never overwrite the new holder's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from service.db.engine import Database
from service.db.models import Job, Plan, PlanRequest, utcnow
from solvers.documents import PlanResult


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    plan_id: str
    kind: str
    request: dict[str, Any]
    attempt: int


def _lease_expired(now: Any) -> Any:
    return and_(Job.status == "running", Job.lease_expires_at < now)


def _fail_plan(session: Session, plan_id: str, error: str, detail: list[Any] | None, keep_dedupe: bool) -> None:
    values: dict[str, Any] = {"status": "failed", "error": error, "error_detail": detail, "finished_at": utcnow()}
    if not keep_dedupe:
        values["dedupe_hash"] = None  # a failure not caused by the request: a resubmission solves again
    session.execute(update(Plan).where(Plan.id == plan_id, Plan.status.in_(("queued", "running"))).values(**values))


def reap_exhausted(session: Session) -> int:
    """Fail jobs whose lease expired on their last allowed attempt."""
    now = utcnow()
    rows = session.execute(
        select(Job).where(_lease_expired(now), Job.attempts >= Job.max_attempts).with_for_update(skip_locked=True)
    ).scalars().all()
    for job in rows:
        reason = (f"lease expired {job.attempts} times (last holder {job.lease_owner}); "
                  f"giving up after {job.max_attempts} attempts")
        job.status, job.error, job.finished_at = "failed", reason, now
        job.lease_owner = job.lease_expires_at = None
        _fail_plan(session, job.plan_id, reason, None, keep_dedupe=False)
    return len(rows)


def claim_job(db: Database, owner: str, lease_s: float) -> ClaimedJob | None:
    """Take the oldest queued job, or one whose lease expired, for ``owner``; None when there is none."""
    with db.writing() as session:
        reap_exhausted(session)
        now = utcnow()
        job = session.execute(
            select(Job)
            .where(or_(Job.status == "queued", and_(_lease_expired(now), Job.attempts < Job.max_attempts)))
            .order_by(Job.created_at)
            .limit(1)
            .with_for_update(skip_locked=True)
        ).scalar_one_or_none()
        if job is None:
            return None
        job.status, job.lease_owner = "running", owner
        job.lease_expires_at = now + timedelta(seconds=lease_s)
        job.attempts += 1
        job.started_at = job.started_at or now
        job.progress, job.progress_message = 0.0, f"claimed by {owner}"
        session.execute(update(Plan).where(Plan.id == job.plan_id, Plan.status == "queued").values(status="running"))
        request = session.execute(
            select(PlanRequest.request).join(Plan, Plan.request_id == PlanRequest.id).where(Plan.id == job.plan_id)
        ).scalar_one()
        return ClaimedJob(job.id, job.plan_id, job.kind, request, job.attempts)


def _held(job_id: str, owner: str) -> Any:
    return and_(Job.id == job_id, Job.lease_owner == owner, Job.status == "running")


def renew_lease(db: Database, job_id: str, owner: str, lease_s: float, progress: float | None = None,
                message: str | None = None) -> bool:
    """Extend the lease (and record progress); False when the job is no longer ours (cancelled, re-leased)."""
    values: dict[str, Any] = {"lease_expires_at": utcnow() + timedelta(seconds=lease_s)}
    if progress is not None:
        values["progress"] = max(0.0, min(1.0, progress))
        values["progress_message"] = (message or "")[:256]
    with db.writing() as session:
        return session.execute(update(Job).where(_held(job_id, owner)).values(**values)).rowcount == 1  # type: ignore[attr-defined]


def complete_job(db: Database, job_id: str, owner: str, result: PlanResult) -> bool:
    """Store the result; False (and nothing written) when the lease was lost meanwhile."""
    now = utcnow()
    with db.writing() as session:
        job = session.execute(select(Job).where(_held(job_id, owner)).with_for_update()).scalar_one_or_none()
        if job is None:
            return False
        # lease_owner stays: the record of which dispatcher solved it
        job.status, job.finished_at, job.progress, job.progress_message = "succeeded", now, 1.0, "done"
        job.lease_expires_at = None
        session.execute(update(Plan).where(Plan.id == job.plan_id).values(
            status="succeeded", result=result.to_json(), finished_at=now, estimate=result.estimate.to_json(),
            solver=(result.search.solver or job.kind)[:64], search_time_s=result.search.time_s,
        ))
        return True


def fail_job(db: Database, job_id: str, owner: str, error: str, detail: list[Any] | None = None,
             request_error: bool = False) -> bool:
    """Fail the job for good. ``request_error``: the request itself is bad, so identical resubmissions
    keep getting this failed plan instead of solving again."""
    now = utcnow()
    with db.writing() as session:
        job = session.execute(select(Job).where(_held(job_id, owner)).with_for_update()).scalar_one_or_none()
        if job is None:
            return False
        job.status, job.error, job.finished_at = "failed", error, now
        job.lease_owner = job.lease_expires_at = None
        _fail_plan(session, job.plan_id, error, detail, keep_dedupe=request_error)
        return True


def release_job(db: Database, job_id: str, owner: str) -> bool:
    """Give a job back untouched (graceful shutdown): queued again, this attempt not counted."""
    with db.writing() as session:
        job = session.execute(select(Job).where(_held(job_id, owner)).with_for_update()).scalar_one_or_none()
        if job is None:
            return False
        job.status, job.lease_owner, job.lease_expires_at = "queued", None, None
        job.attempts = max(0, job.attempts - 1)
        job.progress, job.progress_message = 0.0, "released by a stopping dispatcher"
        session.execute(update(Plan).where(Plan.id == job.plan_id, Plan.status == "running").values(status="queued"))
        return True


def queue_depth(session: Session) -> int:
    from sqlalchemy import func

    return int(session.execute(select(func.count()).select_from(Job).where(Job.status == "queued")).scalar_one())
