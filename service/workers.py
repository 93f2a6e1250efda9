"""Worker registration and liveness."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Worker, utcnow
from service.errors import Forbidden, NotFound
from service.tokens import Principal


def register_worker(session: Session, info: dict[str, Any], principal: Principal) -> Worker:
    worker = Worker(**info, token_id=principal.token_id, last_heartbeat=utcnow())
    session.add(worker)
    session.flush()
    return worker


def owned_worker(session: Session, worker_id: str, principal: Principal) -> Worker:
    """The worker, if the caller may act for it: the token that registered it, or an admin/open caller."""
    worker = session.get(Worker, worker_id)
    if worker is None:
        raise NotFound(f"worker {worker_id} is not registered")
    if principal.token_id is not None and not principal.is_admin and worker.token_id != principal.token_id:
        raise Forbidden(f"worker {worker_id} was registered with another token")
    return worker


def heartbeat(session: Session, worker_id: str, principal: Principal) -> None:
    owned_worker(session, worker_id, principal).last_heartbeat = utcnow()


def workers_of_token(session: Session, token_id: str) -> list[str]:
    return list(session.execute(select(Worker.id).where(Worker.token_id == token_id)).scalars())


def worker_view(worker: Worker) -> dict[str, Any]:
    return {"id": worker.id, "name": worker.name, "host": worker.host, "gpus": worker.gpus,
            "gpu_name": worker.gpu_name, "memory_gib": worker.memory_gib, "torch_version": worker.torch_version,
            "cuda_version": worker.cuda_version, "capabilities": worker.capabilities,
            "registered_at": worker.registered_at, "last_heartbeat": worker.last_heartbeat}


def list_workers(session: Session, online_within_s: float) -> list[dict[str, Any]]:
    """Workers, newest first; ``online``: heard from within ``online_within_s`` (a live one beats 4 times a lease)."""
    now = utcnow()
    out = []
    for w in session.execute(select(Worker).order_by(Worker.registered_at.desc())).scalars():
        seen = w.last_heartbeat
        if seen is not None and seen.tzinfo is None:  # (SQLite returns naive UTC)
            seen = seen.replace(tzinfo=now.tzinfo)
        out.append({**worker_view(w), "online": seen is not None and (now - seen).total_seconds() <= online_within_s})
    return out
