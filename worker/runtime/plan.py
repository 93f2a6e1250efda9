"""A contract plan (request + hybrid result document) mapped to what one node's runtime executes.

Every transformer layer runs in its own layout (``solvers.run_layout.LayerLayout``: dp x cp x tp over the ranks of
its pipeline stage, tp varying fastest so that tensor-parallel ranks are neighbours, as in Megatron; its
sequence-parallel kind and ZeRO stage), the embedding and the LM head in the plan's embedding layout; per-layer
recompute is honoured layer by layer. Which plans run exactly is decided by ``solvers.run_layout`` (the service
asks the same function before it queues a run): any other plan is refused with the field and the reason, never
approximated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from solvers.documents import HybridResult
from solvers.request import HybridRequest
from solvers.run_experts import ExpertLayout
from solvers.run_layout import LayerLayout, load_plan, plan_of, run_layout
from solvers.strategy import PlanStrategy, Schedule
from worker.runtime.model import ModelConfig

__all__ = ["LayerLayout", "RuntimePlan", "from_document", "load_plan", "plan_of"]


@dataclass(frozen=True)
class RuntimePlan:
    model: ModelConfig
    global_batch_size: int
    seq_length: int
    pp: int = 1
    layers: tuple[LayerLayout, ...] = ()  # per transformer layer, by global index
    embedding: LayerLayout = field(default_factory=LayerLayout)  # the token embedding; the batch is dealt as it says
    head: LayerLayout = field(default_factory=LayerLayout)  # the final norm and LM head (and how the labels are)
    recompute: tuple[str, ...] = ()  # per layer: "none" | "selective" | "full"
    micro_batches: int = 1
    schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    stage_layers: tuple[int, ...] = ()
    precision: str = "bf16"
    peak_flops_per_rank: float = 1e12  # of the precision the run computes in, for MFU
    gpu_name: str = "cpu"
    experts: tuple[ExpertLayout | None, ...] = ()  # per layer: an MoE layer's expert layout, None where dense

    @property
    def stage_ranks(self) -> int:
        """Ranks per pipeline stage (every layout of the plan spans them)."""
        return self.embedding.world

    @property
    def world_size(self) -> int:
        return self.pp * self.stage_ranks

    @property
    def dp(self) -> int:
        """Data-parallel degree of the input: the embedding's (the batch's rows are dealt to its dp ranks)."""
        return self.embedding.dp

    def uniform(self) -> LayerLayout | None:
        """The one layout of every layer, the embedding and the head, if they share one."""
        every = {*self.layers, self.embedding, self.head}
        return self.embedding if len(every) == 1 else None

    def describe(self) -> str:
        """``pp2-dp1-tp2-megatron-sp-zero0-1f1bx4`` for one layout everywhere; with a per-layer mix the layers'
        runs of equal layouts, then the embedding's (and the head's, where its sequence split differs)."""
        parts = [f"pp{self.pp}"]
        one = self.uniform()
        if one is not None:
            parts.append(one.describe())
        else:
            runs: list[tuple[int, int, LayerLayout]] = []
            for i, x in enumerate(self.layers):
                if runs and runs[-1][2] == x:
                    runs[-1] = (runs[-1][0], i, x)
                else:
                    runs.append((i, i, x))
            parts.append("layers[" + ",".join(f"{a}{'' if a == b else f'-{b}'}:{x.describe()}" for a, b, x in runs)
                         + "]")
            parts.append(f"embedding[{self.embedding.describe()}]")
            if self.head != self.embedding:
                parts.append(f"head[{self.head.describe()}]")
        if any(r != "none" for r in self.recompute):
            parts.append("recompute")
        moe = sorted({(x.ep, x.etp, x.lsh) for x in self.experts if x is not None})
        parts.extend(f"ep{ep}" + (f"-etp{etp}" if etp > 1 else "") + ("-lsh" if lsh else "") for ep, etp, lsh in moe)
        if self.pp > 1:
            parts.append(f"{self.schedule}x{self.micro_batches}")
        return "-".join(parts)


def from_document(request: HybridRequest, result: HybridResult | PlanStrategy | None,
                  world_size: int | None = None) -> RuntimePlan:
    """Map a plan (its parsed request and its result, or a plan itself) to a RuntimePlan; SpecError names bad
    fields.

    ``world_size`` is the number of processes this node will start (default: the request's cluster)."""
    plan = result if isinstance(result, PlanStrategy) else plan_of(request, result)
    return _runtime_plan(request, plan, world_size)


def _runtime_plan(request: HybridRequest, strategy: PlanStrategy, world_size: int | None) -> RuntimePlan:
    layout = run_layout(request, strategy, world_size)  # SpecError unless the plan runs exactly as planned
    cluster = request.cluster
    return RuntimePlan(
        model=ModelConfig.from_spec(request.model), global_batch_size=request.training.global_batch_size,
        seq_length=request.training.seq_length, pp=layout.pp, layers=layout.layers, embedding=layout.embedding,
        head=layout.head, recompute=layout.recompute, micro_batches=layout.micro_batches, schedule=layout.schedule,
        virtual_stages=layout.virtual_stages, stage_layers=layout.stage_layers, precision=layout.precision,
        peak_flops_per_rank=cluster.gpu.peak_flops(layout.precision), gpu_name=cluster.gpu.name,
        experts=layout.experts,
    )
