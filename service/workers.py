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


def list_workers(session: Session) -> list[dict[str, Any]]:
    return [worker_view(w) for w in session.execute(select(Worker).order_by(Worker.registered_at.desc())).scalars()]
