"""Spindle's result document (contract: ``kind = "spindle"``): a wavefront schedule of slices."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from solvers.documents.base import Document, ResultDocument


class LayoutDoc(Document):
    """A metaop's layout on its slice's devices: tp x cp x dp = the slice's devices (ep inside dp)."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    ep: int = 1
    zero: int = Field(default=1, description="1: optimizer states sharded over dp; 3: weights and gradients too")
    recompute: str = "none"

    def label(self) -> str:
        """``tp 2 x dp 32, ZeRO-3, full recompute``: the degrees above one, the ZeRO stage, recomputation."""
        parts = " x ".join(f"{k} {v}" for k, v in (("tp", self.tp), ("cp", self.cp), ("dp", self.dp), ("ep", self.ep))
                           if v > 1 or k == "dp")
        rc = f", {self.recompute} recompute" if self.recompute != "none" else ""
        return f"{parts}, ZeRO-{self.zero}{rc}"


class SliceDoc(Document):
    """Some of a metaop's layers on a contiguous block of devices, from ``start_s`` to ``end_s``."""

    metaop: str
    task: str | None = None
    module: str | None = None
    devices: list[int]
    layers: int
    layer_start: int = 0
    start_s: float
    end_s: float
    wave: int = 0
    compute_s: float | None = None
    transfer_wait_s: float | None = None
    ms_per_layer: float | None = None
    layout: LayoutDoc | None = Field(default=None, description="the hybrid layout the slice runs (null: plain data "
                                                               "parallelism over its devices, ZeRO-1)")


class WaveDoc(Document):
    index: int
    start_s: float
    end_s: float
    metaops: list[str]


class WeightReshardDoc(Document):
    """RL post-training: the updated weights of a module that is both trained and run for generation, brought
    into the generation slices' layout before the next step's rollout (exposed in ``iteration_time_s``)."""

    time_s: float
    max_gib_per_device: float = Field(description="the most one generation device receives")
    generation_devices: int
    colocation: Literal["co-located", "separate", "partly co-located"] = Field(
        description="whether the generation devices also train the module: co-located (all), separate (none)")


class SpindleEstimate(Document):
    iteration_time_s: float
    makespan_s: float | None = None
    grad_sync_exposed_s: float | None = None
    peak_memory_gib: float | None = Field(default=None, description="null: memory is not estimated (see "
                                                                      "memory_estimated)")
    memory_gib_per_device: list[float] = Field(default_factory=list)
    memory_estimated: bool = Field(
        default=True, description="false: every metaop gives an explicit time_ms_per_layer and no module shape, so "
                                  "the time model is the whole cost (no memory or communication terms): "
                                  "memory_gib_per_device is empty and peak_memory_gib null")
    fits: bool = True
    memory_limit_gib: float | None = None
    utilization: float | None = None
    module_grad_sync_s: dict[str, float] = Field(default_factory=dict)
    given_layer_times: list[str] = Field(
        default_factory=list, description="metaops with a module shape whose per-layer time is the request's "
                                          "time_ms_per_layer (e.g. measured) instead of the one derived from the "
                                          "shape; their memory, hand-overs and gradient sync are still the shape's")
    weight_reshard: dict[str, WeightReshardDoc] = Field(
        default_factory=dict, description="per module trained and run for generation (RL): the weight reshard")
    speedup_vs_sequential: float | None = None


class SpindleEstimateResult(SpindleEstimate):
    """``POST /v1/estimate`` for a Spindle schedule: its estimate and the bound no schedule beats."""

    lower_bound_s: float


class BaselinePlanDoc(Document):
    iteration_time_s: float
    fits: bool
    slices: list[SliceDoc]


class ExactReport(Document):
    """The CP-SAT model's run, where the request asked for it. Its objective is the time model's makespan
    (transfers and gradient sync are added when the solution is timed, ``model_solution_iteration_time_s``)."""

    warm_start: str
    warm_start_iteration_time_s: float
    status: str = Field(description="CP-SAT's: OPTIMAL (proved), FEASIBLE (stopped by a limit), ...")
    stopped_by: Literal["solved", "deterministic_limit", "wall_clock"] = Field(
        description="what ended the search: solved (proved optimal), deterministic_limit (the reproducible "
                    "budget), wall_clock (the safety net: a rerun may differ)")
    wall_s: float
    workers: int = 1
    seed: int = 0
    deterministic_time_limit: float
    deterministic_time: float = Field(description="CP-SAT's deterministic time spent")
    model_makespan_s: float | None = None
    model_bound_s: float | None = Field(default=None, description="CP-SAT's best bound on the model's makespan")
    model_gap: float | None = Field(default=None, description="(model_makespan_s - model_bound_s) / model_makespan_s; "
                                                              "0: proved optimal for the time model")
    polish_wall_capped: bool = False
    model_solution_iteration_time_s: float | None = None
    iteration_time_s: float | None = None


class SpindleSearch(Document):
    """How the plan was found. Diagnostics only: a candidate over the memory limit has no time (null), it never
    makes the result invalid."""

    wavefront_s: float | None = None
    wavefront_iteration_time_s: float | None = None
    wavefront_ordering: str | None = None
    reference_iteration_time_s: float | None = Field(
        default=None, description="the reference algorithm alone (fluid wavefront, locality line-up, no polish); "
                                  "null: its plan does not fit in memory")
    candidates_iteration_time_s: dict[str, float | None] = Field(
        default_factory=dict, description="every heuristic candidate's iteration time; null: over the memory limit")
    exact: ExactReport | None = None
    reproducible: bool = Field(default=True, description="every search stopped on a budget of work, none on a "
                                                        "wall-clock safety net, and CP-SAT ran one worker: the "
                                                        "same request gives the same plan")
    time_s: float
    solver: str | None = None


class SpindleResult(ResultDocument):
    kind: Literal["spindle"] = "spindle"
    estimate: SpindleEstimate
    slices: list[SliceDoc]
    waves: list[WaveDoc] = Field(default_factory=list)
    lower_bound_s: float
    ratio_to_lower_bound: float | None = None
    baselines: dict[str, float | None] = Field(description="iteration time of each baseline (null: does not fit)")
    baseline_plans: dict[str, BaselinePlanDoc | None] = Field(default_factory=dict)
    search: SpindleSearch
    notes: list[str] = Field(default_factory=list)
