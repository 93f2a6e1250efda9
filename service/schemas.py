"""Pydantic schemas at the HTTP edge: request bodies and the documented response shapes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from solvers.documents import FlexSPResult, HybridResult, PlanKind, PlanResult, SpindleResult
from solvers.documents import Status as PlanStatus
from solvers.documents.calibration import CalibrationFitDoc
from solvers.documents.flexsp import FlexSPEstimate
from solvers.documents.hybrid import HybridEstimate
from solvers.documents.spindle import SpindleEstimate
from solvers.run_layout import TokenDtype


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorOut(BaseModel):
    """Every error body: a message, or (422) a list of ``{loc, msg, type}`` naming the bad fields."""

    detail: str | list[dict[str, Any]]


# --- plans ---------------------------------------------------------------------------------------
class Progress(BaseModel):
    fraction: float
    message: str | None = None


class _PlanOut(_Out):
    """A plan: its request, status, progress and (when succeeded) the kind's result document."""

    id: str
    status: PlanStatus
    request: dict[str, Any] | None = None
    error: str | None = None
    content_hash: str | None = None
    solver: str | None = None
    search_time_s: float | None = None
    progress: Progress | None = None
    attempts: int | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class HybridPlanOut(_PlanOut):
    kind: Literal["hybrid"]
    result: HybridResult | None = None
    estimate: HybridEstimate | None = None


class FlexSPPlanOut(_PlanOut):
    kind: Literal["flexsp"]
    result: FlexSPResult | None = None
    estimate: FlexSPEstimate | None = None


class SpindlePlanOut(_PlanOut):
    kind: Literal["spindle"]
    result: SpindleResult | None = None
    estimate: SpindleEstimate | None = None


PlanOut = Annotated[HybridPlanOut | FlexSPPlanOut | SpindlePlanOut, Field(discriminator="kind")]
"""GET /v1/plans/{id}: typed by its ``kind``, so that a client can generate its types from /openapi.json."""


class PlanSummary(_Out):
    id: str
    status: PlanStatus
    kind: PlanKind
    solver: str | None = None
    estimate: HybridEstimate | FlexSPEstimate | SpindleEstimate | None = None
    search_time_s: float | None = None
    error: str | None = None
    created_at: datetime
    finished_at: datetime | None = None


class PlanList(BaseModel):
    items: list[PlanSummary]
    next_cursor: str | None = Field(None, description="pass as `cursor` to get the next page")


# --- runs and workers ----------------------------------------------------------------------------
class DatasetIn(_Body):
    """A tokenized dataset file on the workers' storage: a flat array of token ids."""

    path: str = Field(min_length=1, max_length=4096)
    dtype: TokenDtype = "uint16"
    document_separator: int | None = Field(
        None, ge=0, description="FlexSP runs (required there, refused elsewhere): the token id that ends each "
                                "document; the run's sequences are the file's documents, in order")


class RunCreate(_Body):
    steps: int = Field(20, gt=0, le=1_000_000)
    checkpoint_every_steps: int | None = Field(None, gt=0, le=1_000_000)
    dataset: DatasetIn | None = None


class RunSubmit(RunCreate):
    """``POST /v1/runs``: the same request naming its plan in the body."""

    plan_id: str = Field(min_length=1, max_length=32)


class RunOut(_Out):
    id: str
    plan_id: str
    status: PlanStatus
    worker: str | None = None
    steps: int
    attempts: int
    attempt: int
    resumed_from_step: int | None = None
    checkpoint_every_steps: int | None = None
    dataset: dict[str, Any] | None = None
    nodes_needed: int = 1
    nodes: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    predicted: dict[str, Any] = Field(default_factory=dict)
    progress: list[dict[str, Any]] = Field(default_factory=list)


class WorkerRegister(_Body):
    name: str = Field(min_length=1, max_length=128)
    host: str = Field(min_length=1, max_length=255)
    gpus: int = Field(0, ge=0, le=1_000_000)
    gpu_name: str | None = Field(None, max_length=128)
    memory_gib: float | None = Field(None, ge=0)
    torch_version: str | None = Field(None, max_length=64)
    cuda_version: str | None = Field(None, max_length=64)
    capabilities: dict[str, Any] = Field(default_factory=dict)


class WorkerRegistered(BaseModel):
    id: str
    heartbeat_interval_s: float
    lease_s: float


class WorkerRef(_Body):
    worker_id: str = Field(min_length=1, max_length=32)


class ClaimBody(WorkerRef):
    wait_s: float = Field(0.0, ge=0, le=30)
    endpoint: str | None = Field(None, max_length=300, description="host:port where this worker would host the "
                                 "c10d rendezvous of a multi-node run as its node 0")


class MetricsReport(WorkerRef):
    model_config = ConfigDict(extra="allow")
    step: int = Field(ge=0)
    loss: float
    step_time_s: float = Field(ge=0)
    resumed_from_step: int | None = Field(None, ge=0)


class CompleteBody(WorkerRef):
    metrics: dict[str, Any] = Field(default_factory=dict)


class FailBody(WorkerRef):
    error: str = Field(min_length=1, max_length=100_000)
    retryable: bool = False


class LeaseOut(BaseModel):
    lease_expires_at: datetime


class ClaimedPlan(BaseModel):
    id: str
    kind: PlanKind
    request: dict[str, Any]
    result: PlanResult | None


class ClaimedRun(BaseModel):
    id: str
    plan_id: str
    steps: int
    attempt: int
    lease_expires_at: datetime
    checkpoint_every_steps: int | None = None
    dataset: dict[str, Any] | None = None
    nnodes: int = 1
    node_rank: int = 0
    rendezvous_endpoint: str | None = None
    plan: ClaimedPlan


class ClaimOut(BaseModel):
    run: ClaimedRun


# --- profiles ------------------------------------------------------------------------------------
class ProfileCreate(_Body):
    name: str = Field(min_length=1, max_length=255)
    kind: Literal["hardware", "model"]
    host: str | None = Field(None, max_length=255)
    data: dict[str, Any]


class ProfileOut(_Out):
    id: str
    name: str
    kind: str
    host: str | None = None
    data: dict[str, Any] | None = None
    created_at: datetime


# --- calibration sets ----------------------------------------------------------------------------------------
class MeasuredStep(_Body):
    """A step measured outside this service: the hybrid request that describes the run, the strategy it ran
    (a plan's strategy object or the uniform shorthand) and its measured step time."""

    request: dict[str, Any]
    strategy: dict[str, Any]
    step_time_s: float = Field(gt=0)


class CalibrationSetCreate(_Body):
    """Fit a set's constants from finished runs of this service (``runs``), from steps measured elsewhere
    (``measurements``) or from uploaded hardware profiles' layer times (``profiles`` with the ``gpu`` they ran
    on); stored as the next version of ``name``."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    runs: list[str] | None = Field(default=None, min_length=1, max_length=200)
    measurements: list[MeasuredStep] | None = Field(default=None, min_length=1, max_length=200)
    # hardware profiles' layer times (the worker's profiler), on nodes of ``gpu``: a GPU preset name, since a
    # profile names its device as torch does
    profiles: list[str] | None = Field(default=None, min_length=1, max_length=20)
    gpu: str | None = Field(default=None, min_length=1, max_length=128)


class CalibrationSetOut(_Out):
    id: str
    name: str
    version: int
    gpu: str
    stack: dict[str, Any]
    constants: dict[str, float]
    fit: CalibrationFitDoc
    sources: dict[str, Any]
    created_at: datetime
