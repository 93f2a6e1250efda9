"""FlexSP's result document (contract: ``kind = "flexsp"``): one step's sequence-parallel groups."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from solvers.documents.base import Document, ResultDocument


class FlexSPBreakdown(Document):
    compute: float
    alltoall: float
    fixed: float


class GroupDoc(Document):
    """One sequence-parallel group of a micro-batch: ``sp`` GPUs, the rank block ``ranks`` (inclusive)."""

    sp: int
    ranks: list[int] = Field(min_length=2, max_length=2)
    sequences: list[int] = Field(description="indices into batch.sequence_lengths")
    tokens: int | None = None
    time_s: float | None = None
    breakdown_s: FlexSPBreakdown | None = None
    memory_gib: float | None = None


class MicroBatchDoc(Document):
    time_s: float = Field(description="the slowest group's time")
    breakdown_s: FlexSPBreakdown | None = None
    tokens: int | None = None
    groups: list[GroupDoc]


class FlexSPEstimate(Document):
    step_time_s: float
    breakdown_s: FlexSPBreakdown | None = None
    micro_batch_count: int | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    peak_memory_gib: float | None = None
    memory_limit_gib: float | None = None


class FlexSPEstimateResult(FlexSPEstimate):
    """``POST /v1/estimate`` for a FlexSP plan: the estimate with each micro-batch's groups."""

    micro_batches: list[MicroBatchDoc]


class FlexSPBaselines(Document):
    static_sp: dict[str, float] = Field(description="step time of static SP of each degree (s)")
    best_static_sp: int | None = None
    static_sp_rule: str | None = None


class MilpFailure(Document):
    """One MILP run that returned no whole packing: its micro-batch keeps the greedy packing."""

    status: str = Field(description="the backend's own status word (CP-SAT UNKNOWN, CBC 'Not Solved', ...)")
    detail: str = Field(description="what the status means here")
    sequences: int = Field(description="sequences in the micro-batch it ran on")


MilpOutcome = Literal["off", "not_run", "no_improvement", "improved", "partly_failed", "failed"]


class MilpReport(Document):
    backend: str | None = Field(None, description="cpsat, highs or cbc; null when the request turned it off")
    outcome: MilpOutcome | None = Field(None, description="off / not_run / no_improvement / improved; "
                                                          "partly_failed / failed when runs gave no packing")
    not_run_reason: str | None = None
    runs: int
    improved: int
    failed: int = 0
    failures: list[MilpFailure] = Field(default_factory=list)
    gain_s: float
    largest_model: tuple[int, int] = Field(description="(buckets, slots) of the largest MILP solved")


class FlexSPSearch(Document):
    time_s: float
    cpu_s: float | None = None
    solver: str | None = Field(None, description="what produced the plan: the winning heuristic's family, "
                                                 "'+BACKEND' only when the MILP improved a micro-batch")
    candidates_s: dict[str, float] = Field(default_factory=dict,
                                           description="step time of each candidate plan the search compared")
    chosen: str | None = None
    milp: MilpReport | None = None


class FlexSPCostModel(Document):
    """The constants the plan was priced with, and where they came from (``source``)."""

    source: str
    alpha1_ms_per_token2: float
    alpha2_ms_per_token: float
    beta_ms: float
    comm_mb_per_token: float
    alltoall_GBps_by_group_size: dict[str, float]
    activation_mb_per_token: float
    model_states_mb_per_gpu: float
    memory_limit_mb: float
    token_capacity_per_gpu: int
    notes: list[str]


class FlexSPResult(ResultDocument):
    kind: Literal["flexsp"] = "flexsp"
    estimate: FlexSPEstimate
    notes: list[str] = Field(default_factory=list)
    micro_batches: list[MicroBatchDoc]
    baselines: FlexSPBaselines
    lower_bound_s: float
    search: FlexSPSearch
    cost_model: FlexSPCostModel | None = None
