"""Plan service functions: submit (deduplicated by content hash), read, list, cancel.

They take a Database or Session, return plain dicts (the API's JSON) and raise domain errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from service.canonical import content_hash
from service.db.engine import Database
from service.db.models import IdempotencyKey, Job, Plan, PlanRequest, utcnow
from service.errors import Conflict, NotFound, get_or_404
from solvers.documents import ACTIVE, TERMINAL, load_result


def plan_view(plan: Plan, request: dict[str, Any] | None, job: Job | None, content: str | None) -> dict[str, Any]:
    """The plan as the API shows it; its result is the kind's typed document (a stored one of any version)."""
    view: dict[str, Any] = {
        "id": plan.id, "status": plan.status, "kind": plan.kind, "request": request,
        "result": load_result(plan.kind, plan.result) if plan.result is not None else None,
        "error": plan.error, "content_hash": content, "solver": plan.solver, "search_time_s": plan.search_time_s,
        "estimate": plan.estimate, "created_at": plan.created_at, "finished_at": plan.finished_at,
        "progress": None, "attempts": None, "started_at": None,
    }
    if plan.error_detail:
        view["error_detail"] = plan.error_detail
    if job is not None:
        view["progress"] = {"fraction": job.progress, "message": job.progress_message}
        view["attempts"] = job.attempts
        view["started_at"] = job.started_at
    return view


def _load(session: Session, where: Any) -> dict[str, Any] | None:
    row = session.execute(
        select(Plan, PlanRequest.request, PlanRequest.content_hash, Job)
        .join(PlanRequest, PlanRequest.id == Plan.request_id)
        .outerjoin(Job, Job.plan_id == Plan.id)
        .where(where)
    ).first()
    return None if row is None else plan_view(row[0], row[1], row[3], row[2])


def get_plan(session: Session, plan_id: str) -> dict[str, Any]:
    view = _load(session, Plan.id == plan_id)
    if view is None:
        raise NotFound(f"plan {plan_id} not found")
    return view


def find_by_hash(session: Session, digest: str) -> dict[str, Any] | None:
    return _load(session, Plan.dedupe_hash == digest)


def _by_idempotency_key(session: Session, key: str, digest: str) -> dict[str, Any] | None:
    row = session.get(IdempotencyKey, key)
    if row is None:
        return None
    if row.content_hash != digest:
        raise Conflict("Idempotency-Key was already used with a different request body")
    return get_plan(session, row.plan_id)


def submit_plan(db: Database, request: dict[str, Any], kind: str, max_attempts: int,
                idempotency_key: str | None = None, validate: Callable[[], object] | None = None,
                digest: str | None = None) -> tuple[dict[str, Any], bool]:
    """Store a request and queue its solve unless an identical one exists. Returns (plan view, created).

    ``validate`` runs only when the request is new (a stored one was valid when it was stored). Concurrent
    identical submissions race on the unique ``plans.dedupe_hash``; the loser's IntegrityError is answered
    with the winner's plan, so the request is solved once."""
    digest = digest or content_hash(request)
    with db.reading() as session:  # fast path, no write lock: the cached POST
        if idempotency_key and (by_key := _by_idempotency_key(session, idempotency_key, digest)) is not None:
            return by_key, False
        found = find_by_hash(session, digest)
        if found is not None and not idempotency_key:
            return found, False
    if found is None and validate is not None:
        validate()
    for _ in range(3):
        try:
            with db.writing() as session:
                if idempotency_key and (found := _by_idempotency_key(session, idempotency_key, digest)):
                    return found, False
                existing = session.execute(select(Plan.id).where(Plan.dedupe_hash == digest)).scalar_one_or_none()
                if existing is None:
                    existing = _insert(session, request, digest, kind, max_attempts)
                    created = True
                else:
                    created = False
                if idempotency_key:
                    session.add(IdempotencyKey(key=idempotency_key, content_hash=digest, plan_id=existing))
                session.flush()
                return get_plan(session, existing), created
        except IntegrityError:
            continue  # someone inserted the same hash or key first: read theirs on the next pass
    raise Conflict("request is being submitted concurrently; retry")


def _insert(session: Session, request: dict[str, Any], digest: str, kind: str, max_attempts: int) -> str:
    req_id = session.execute(select(PlanRequest.id).where(PlanRequest.content_hash == digest)).scalar_one_or_none()
    if req_id is None:
        stored = PlanRequest(content_hash=digest, kind=kind, request=request)
        session.add(stored)
        session.flush()
        req_id = stored.id
    plan = Plan(request_id=req_id, dedupe_hash=digest, kind=kind, status="queued")
    session.add(plan)
    session.flush()
    session.add(Job(plan_id=plan.id, kind=kind, status="queued", max_attempts=max_attempts))
    return plan.id


def list_plans(session: Session, status: str | None = None, kind: str | None = None, limit: int = 50,
               cursor: str | None = None, with_request: bool = False) -> dict[str, Any]:
    """Newest first, keyset-paginated: ``cursor`` is the ``next_cursor`` of the previous page.
    ``with_request`` adds each plan's request document (the dashboard labels rows with model and cluster).
    Results are never loaded: a page of big results would cost more than the rest of the query."""
    query = select(Plan).options(defer(Plan.result)).order_by(Plan.created_at.desc(), Plan.id.desc()).limit(limit + 1)
    if status:
        query = query.where(Plan.status == status)
    if kind:
        query = query.where(Plan.kind == kind)
    if cursor:
        last = session.get(Plan, cursor)
        if last is None:
            raise NotFound(f"cursor {cursor} is not a plan id")
        query = query.where(or_(Plan.created_at < last.created_at,
                                and_(Plan.created_at == last.created_at, Plan.id < last.id)))
    rows = list(session.execute(query).scalars())
    items = [{"id": p.id, "status": p.status, "kind": p.kind, "solver": p.solver, "estimate": p.estimate,
              "search_time_s": p.search_time_s, "error": p.error, "created_at": p.created_at,
              "finished_at": p.finished_at} for p in rows[:limit]]
    if with_request and items:
        requests: dict[str, Any] = dict(session.execute(select(Plan.id, PlanRequest.request).join(
            PlanRequest, PlanRequest.id == Plan.request_id).where(Plan.id.in_([i["id"] for i in items]))).all())
        for item in items:
            item["request"] = requests.get(str(item["id"]))
    return {"items": items, "next_cursor": rows[limit - 1].id if len(rows) > limit else None}


def cancel_plan(db: Database, plan_id: str) -> dict[str, Any]:
    with db.writing() as session:
        plan = get_or_404(session, Plan, plan_id, "plan")
        if plan.status in TERMINAL:
            raise Conflict(f"plan {plan_id} is already {plan.status}")
        now = utcnow()
        plan.status, plan.finished_at, plan.dedupe_hash, plan.error = "cancelled", now, None, "cancelled by request"
        session.execute(update(Job).where(Job.plan_id == plan_id, Job.status.in_(ACTIVE))
                        .values(status="cancelled", finished_at=now, lease_owner=None, lease_expires_at=None))
        session.flush()
        return get_plan(session, plan_id)


def plan_status(session: Session, plan_id: str) -> str | None:
    return session.execute(select(Plan.status).where(Plan.id == plan_id)).scalar_one_or_none()


def count_plans(session: Session) -> int:
    return int(session.execute(select(func.count()).select_from(Plan)).scalar_one())
