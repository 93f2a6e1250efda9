"""SQLAlchemy 2 models. Portable types only (String ids, JSON, UTC datetimes) so that the same Alembic
migrations run on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, TypeDecorator, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def new_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on both databases (SQLite stores naive strings, PostgreSQL timestamptz)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        # SQLite compares the stored text: keep one format (naive UTC) so that ordering is chronological.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON, datetime: UTCDateTime}


class PlanRequest(Base):
    """A request document stored once per content (canonical JSON + its sha256)."""

    __tablename__ = "plan_requests"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Plan(Base):
    """The answer to a request. ``dedupe_hash`` holds the content hash while the plan counts as the
    canonical answer (queued, running, succeeded, or failed on invalid input); it is cleared when a plan
    is cancelled or fails for reasons outside the request (time limit, lost leases), so that a resubmission
    solves again. Its unique constraint is what makes concurrent identical submissions solve once."""

    __tablename__ = "plans"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    request_id: Mapped[str] = mapped_column(ForeignKey("plan_requests.id"), index=True)
    dedupe_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    estimate: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    solver: Mapped[str | None] = mapped_column(String(64))
    search_time_s: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    error_detail: Mapped[list[Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (Index("ix_plans_status_created", "status", "created_at"), Index("ix_plans_created", "created_at"))


class Job(Base):
    """Solver work for one plan, claimed by dispatchers under a lease."""

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    progress_message: Mapped[str | None] = mapped_column(String(256))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()

    __table_args__ = (Index("ix_jobs_status_created", "status", "created_at"),)


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    content_hash: Mapped[str] = mapped_column(String(64))
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str | None] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    revoked: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Worker(Base):
    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128))
    host: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_name: Mapped[str | None] = mapped_column(String(128))
    memory_gib: Mapped[float | None] = mapped_column(Float)
    torch_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    capabilities: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    token_id: Mapped[str | None] = mapped_column(ForeignKey("api_tokens.id"))
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat: Mapped[datetime | None] = mapped_column()


class Run(Base):
    """A plan executed by a worker, leased like a solver job."""

    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    steps: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str | None] = mapped_column(ForeignKey("workers.id"), index=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    error: Mapped[str | None] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    predicted: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    progress: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    checkpoint_every_steps: Mapped[int | None] = mapped_column(Integer)
    dataset: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {"path", "dtype"}; None: synthetic tokens
    resumed_from_step: Mapped[int | None] = mapped_column(Integer)  # of the current attempt, as its worker reports
    nodes_needed: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    ranks_per_node: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # one entry per node of the current attempt (gathering while queued, then running):
    # {"worker_id", "node_rank", "host", "endpoint", "lease_expires_at" (ISO)}
    nodes: Mapped[list[Any] | None] = mapped_column(JSON)

    __table_args__ = (Index("ix_runs_status_created", "status", "created_at"),)


class Profile(Base):
    __tablename__ = "profiles"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16), index=True)
    host: Mapped[str | None] = mapped_column(String(255))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CalibrationSet(Base):
    """One version of a named calibration set: the analytic model's constants for a GPU type and stack
    (``set_key``), how they were fitted (``fit``) and from what (``sources``: run ids, or inline measurements)."""

    __tablename__ = "calibration_sets"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int] = mapped_column(Integer)
    gpu: Mapped[str] = mapped_column(String(128))
    stack: Mapped[dict[str, Any]] = mapped_column(JSON)
    set_key: Mapped[str] = mapped_column(String(512))
    constants: Mapped[dict[str, Any]] = mapped_column(JSON)
    fit: Mapped[dict[str, Any]] = mapped_column(JSON)
    sources: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("name", "version", name="uq_calibration_sets_name_version"),
                      Index("ix_calibration_sets_set_key", "set_key", "created_at"))
