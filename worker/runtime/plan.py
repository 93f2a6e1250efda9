"""A contract plan (request + hybrid result document) mapped to what one node's runtime executes.

The runtime lays ranks out on one device mesh ``pp x dp x cp x tp`` (tp varying fastest, so tensor-parallel
ranks are neighbours, as in Megatron; cp is ring-attention context parallelism), one layout on every layer;
per-layer recompute is honoured layer by layer. Which plans that mesh runs exactly is decided by
``solvers.run_layout`` (the service asks the same function before it queues a run): any other plan is refused
with the field and the reason, never approximated.
"""

from __future__ import annotations

from dataclasses import dataclass

from solvers.documents import HybridResult
from solvers.request import HybridRequest
from solvers.run_experts import ExpertLayout
from solvers.run_layout import load_plan, plan_of, run_layout
from solvers.strategy import PlanStrategy, Schedule
from worker.runtime.model import ModelConfig

__all__ = ["RuntimePlan", "from_document", "load_plan", "plan_of"]


@dataclass(frozen=True)
class RuntimePlan:
    model: ModelConfig
    global_batch_size: int
    seq_length: int
    pp: int = 1
    dp: int = 1
    tp: int = 1
    cp: int = 1  # ring-attention context parallelism (the sequence in 2*cp load-balanced chunks)
    sp: str | None = None  # None, "megatron" (TP + sequence parallel) or "ulysses" (the tp dim runs Ulysses)
    zero: int = 0
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
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def tensor_parallel(self) -> int:
        return 1 if self.sp == "ulysses" else self.tp

    @property
    def sequence_parallel(self) -> int:
        """Ulysses degree (the sequence is split over the tp dim of the mesh)."""
        return self.tp if self.sp == "ulysses" else 1

    def describe(self) -> str:
        parts = [f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.tp > 1:
            parts.append(f"{'sp' if self.sp == 'ulysses' else 'tp'}{self.tp}")
        if self.sp == "megatron":
            parts.append("megatron-sp")
        parts.append(f"zero{self.zero}")
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
        seq_length=request.training.seq_length, pp=layout.pp, dp=layout.dp, tp=layout.tp, cp=layout.cp,
        sp=layout.sp, zero=layout.zero, recompute=layout.recompute, micro_batches=layout.micro_batches,
        schedule=layout.schedule,
        virtual_stages=layout.virtual_stages, stage_layers=layout.stage_layers, precision=layout.precision,
        peak_flops_per_rank=cluster.gpu.peak_flops(layout.precision), gpu_name=cluster.gpu.name,
        experts=layout.experts,
    )
