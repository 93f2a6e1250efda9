"""The hybrid planner's result document (contract: ``kind = "hybrid"``)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field

from solvers.documents.base import Document, ResultDocument
from solvers.documents.calibration import CalibrationSetUse
from solvers.specs import StackSpec, Target
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Recompute, Schedule, SpKind

BaselineName = Literal["megatron", "zero3_dp", "pure_dp"]
BASELINE_NAMES: tuple[BaselineName, ...] = get_args(BaselineName)
"""The uniform recipes every hybrid plan is compared with, in the order the result lists them."""


class LayerDoc(Document):
    """One transformer layer's strategy (``solvers.strategy.LayerStrategy``, whose defaults it shares)."""

    tp: int = 1
    dp: int = 1
    cp: int = 1
    sp: SpKind = None
    zero: int = 0
    recompute: Recompute = "none"
    ep: int = 1
    etp: int | None = None
    lsh: bool = False


class EmbeddingDoc(Document):
    tp: int = 1
    dp: int = 1
    zero: int = 0
    sp: SpKind = None


class StrategyDoc(Document):
    """A whole plan: pipeline, per-layer strategies (one per transformer layer) and the embedding/LM head."""

    pp: int
    micro_batches: int
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    stage_layers: list[int]
    layers: list[LayerDoc]
    embedding: EmbeddingDoc = Field(default_factory=EmbeddingDoc)

    def to_plan(self) -> PlanStrategy:
        return PlanStrategy(
            pp=self.pp, micro_batches=self.micro_batches, schedule=self.schedule, virtual_stages=self.virtual_stages,
            stage_layers=tuple(self.stage_layers),
            layers=tuple(LayerStrategy(**layer.model_dump()) for layer in self.layers),
            embedding=EmbeddingStrategy(**self.embedding.model_dump()))

    @classmethod
    def of(cls, plan: PlanStrategy) -> StrategyDoc:
        return cls.model_validate(plan.to_dict())


class MatmulDoc(Document):
    """The share of its tensor-core peak a GPU type's GEMMs are priced at, and whether it was measured
    (``cluster.gpu.matmul_tflops``) or assumed (the share of the GPU the constants were fitted on)."""

    gpu: str
    precision: str = Field(description="the linear layers' GEMMs' precision")
    share_of_peak: float = Field(description="the largest GEMMs' share of the peak at that precision")
    share_of_peak_16bit: float = Field(description="the same for the GEMMs that stay 16-bit (attention core, "
                                                   "LM head); equal to share_of_peak unless precision is fp8")
    scale: float = Field(description="share_of_peak over the reference GPU's: the multiplier of the GEMM curve")
    measured: bool
    note: str


class HybridEstimate(Document):
    """Time and memory of one step under a strategy, each with its breakdown."""

    step_time_s: float
    throughput_samples_per_s: float
    tokens_per_s: float
    mfu: float
    peak_memory_gib: float
    memory_gib_per_stage: list[float]
    breakdown_s: dict[str, float] = Field(description="sums to step_time_s: compute, recompute, tp_comm, ...")
    memory_breakdown_gib_per_stage: list[dict[str, float]] = Field(default_factory=list)
    stage_time_s: list[float] = Field(default_factory=list)
    fits: bool = True
    notes: list[str] = Field(default_factory=list)
    stack: StackSpec | None = Field(default=None, description="the software stack priced: training.stack with its "
                                                      "defaults resolved (analytic and profile cost models)")
    calibration_set: CalibrationSetUse | None = Field(
        default=None, description="the constants priced: a stored calibration set or the shipped ones, and why "
                                  "(analytic and profile cost models)")
    matmul: list[MatmulDoc] = Field(default_factory=list, description="per GPU type: the share of its peak its "
                                                                     "GEMMs were priced at (analytic and profile "
                                                                     "cost models)")


class HybridEstimateResult(HybridEstimate):
    """``POST /v1/estimate`` for a hybrid strategy: the estimate, the strategy it expanded to, the cost model."""

    strategy: StrategyDoc
    cost_model: str


class BaselineDoc(Document):
    """A uniform recipe priced by the same cost model; ``note`` says why one is missing (``fits`` false)."""

    fits: bool = True
    note: str | None = None
    outside_constraints: list[str] = Field(default_factory=list,
                                           description="the request's constraints this recipe does not keep")
    strategy: StrategyDoc | None = None
    estimate: HybridEstimate | None = None
    throughput_samples_per_s: float | None = None
    gain: float | None = Field(None, description="the plan's throughput over this baseline's, less 1")
    gain_bound: float | None = Field(None, description="the most any plan of the search space gains over it")


class HybridSearch(Document):
    """How the plan was found. Beyond ``time_s`` and ``solver``, fields joined the document over time: a plan
    stored before one did lacks it."""

    time_s: float = Field(description="wall clock, baselines included")
    solver: str
    cpu_s: float | None = Field(None, description="this process' CPU time: the fair figure on a shared machine")
    planner_cpu_s: float | None = Field(None, description="the search alone")
    plan_from: str | None = Field(None, description="'dp' (the planner) or 'baseline:NAME' when none beat it")
    configs_total: int | None = None
    configs_solved: int | None = None
    configs_pruned_by_bound: int | None = None
    dp_runs: int | None = None
    time_limited: bool | None = None
    configs_solved_by_certificate: int | None = None
    lower_bound_step_time_s: float | None = Field(None, description="no plan of the search space runs faster")
    optimality_gap: float | None = Field(None, description="the plan's step over lower_bound_step_time_s, less 1")
    certificate_cpu_s: float | None = None
    baselines_time_s: float | None = None
    baselines_cpu_s: float | None = None
    cost_model: str | None = None
    planner_step_time_s: float | None = None
    target: Target | None = Field(None, description="constraints.target: the framework the plan is for ('paraplan': "
                               "the whole space)")
    target_plans_checked: int | None = Field(None, description="a framework target: fitting plans of its uniform "
                                             "grid whose run was checked, fastest first")
    target_grid_best_step_time_s: float | None = Field(None, description="a framework target: the fastest fitting "
                                                       "plan of its uniform grid (the plan is at least as fast)")


HeteroBaselineName = Literal["fastest_group", "type_oblivious"]


class StagePlacement(Document):
    """The GPUs a pipeline stage runs on in a cluster of groups."""

    stage: int
    groups: list[int] = Field(description="indices into cluster.groups (two or more: the stage spans groups and "
                                          "its slowest GPU type sets its pace)")
    gpus: list[str] = Field(description="the GPU type of each of those groups")
    layers: int
    memory_limit_gib: float = Field(description="what each GPU of the stage may use")


class HeteroDoc(Document):
    """A plan on a cluster of groups (``cluster.groups``): where each stage runs, and the plan against the best
    plan on the fastest group alone and the best uniform plan chosen blind to the GPU types."""

    placement: list[StagePlacement]
    baselines: dict[HeteroBaselineName, BaselineDoc | None] = Field(default_factory=dict)


class FrontPoint(Document):
    """One cluster of a sizing front (``sizing``): its plan's time to train the tokens and what that costs."""

    cluster: dict[str, Any] = Field(description="gpu, nodes, gpus_per_node: a cluster section of a request")
    gpus: int
    days: float = Field(description="estimated: the tokens over the plan's estimated throughput")
    cost: float = Field(description="days x 24 x GPUs x the GPU type's price per GPU-hour")
    meets_deadline: bool | None = None
    step_time_s: float
    mfu: float
    strategy: StrategyDoc


class SizingDoc(Document):
    """How the sizing front (the result's ``front``: the clusters no other tried cluster beats on both time and
    cost, fastest first) was searched."""

    cheapest_in_deadline: int | None = Field(None, description="index into front of the cheapest point that meets "
                                                               "the deadline (None: none does, or no deadline)")
    clusters_tried: int
    clusters_without_plan: list[str] = Field(default_factory=list, description="tried sizes no plan fits, and why")
    clusters_pruned: int = Field(0, description="tried clusters not planned: a plan found beats their floor (the step "
                                                "their matrix multiplies alone take at the best GEMM efficiency) on "
                                                "both time and cost, so none of their plans is on the front")
    clusters_beaten_in_search: int = Field(0, description="tried clusters planned with a threshold from the points "
                                                          "found before them (a step time from which a plan is "
                                                          "beaten on both time and cost) whose search found no plan "
                                                          "below it (every pipeline configuration's floor reached it, "
                                                          "or none solved beat it): none of their plans is on the "
                                                          "front")
    workers: int = Field(1, description="processes that planned the sizes in parallel")
    time_s: float
    cpu_s: float = Field(description="CPU seconds of the sizing, its worker processes' included")


class HybridResult(ResultDocument):
    kind: Literal["hybrid"] = "hybrid"
    estimate: HybridEstimate
    strategy: StrategyDoc
    search: HybridSearch
    baselines: dict[BaselineName, BaselineDoc | None] = Field(default_factory=dict)
    hetero: HeteroDoc | None = Field(None, description="only for a cluster of groups")
    front: list[FrontPoint] | None = Field(None, description="only for a request with sizing")
    sizing: SizingDoc | None = Field(None, description="only for a request with sizing")

    def plan(self) -> PlanStrategy:
        return self.strategy.to_plan()

    def baseline_plan(self, name: BaselineName) -> PlanStrategy | None:
        base = self.baselines.get(name)
        return base.strategy.to_plan() if base is not None and base.strategy is not None else None
