"""A contract plan (request + hybrid result document) mapped to what one node's runtime executes.

The runtime lays ranks out on one device mesh ``pp x dp x tp`` (tp varying fastest, so tensor-parallel
ranks are neighbours, as in Megatron). Per-layer recompute is honoured layer by layer; per-layer tp/dp/sp/
zero choices that differ between layers cannot be expressed by one mesh, so the most common choice (by
layer count) is applied everywhere and a note says so. Everything that is approximated is in ``notes``,
which end up in the run's metrics.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from solvers.documents import DocumentError, HybridResult, load_result
from solvers.errors import FieldProblem, SpecError
from solvers.exports.layout import front_loaded_split
from solvers.kinds import kind_of
from solvers.request import HybridRequest, parse
from solvers.strategy import PlanStrategy, Schedule
from worker.runtime.model import ModelConfig


@dataclass(frozen=True)
class RuntimePlan:
    model: ModelConfig
    global_batch_size: int
    seq_length: int
    pp: int = 1
    dp: int = 1
    tp: int = 1
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
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def tensor_parallel(self) -> int:
        return 1 if self.sp == "ulysses" else self.tp

    @property
    def sequence_parallel(self) -> int:
        """Ulysses degree (the sequence is split over the tp dim of the mesh)."""
        return self.tp if self.sp == "ulysses" else 1

    def describe(self) -> str:
        parts = [f"pp{self.pp}", f"dp{self.dp}"]
        if self.tp > 1:
            parts.append(f"{'sp' if self.sp == 'ulysses' else 'tp'}{self.tp}")
        if self.sp == "megatron":
            parts.append("megatron-sp")
        parts.append(f"zero{self.zero}")
        if any(r != "none" for r in self.recompute):
            parts.append("recompute")
        if self.pp > 1:
            parts.append(f"{self.schedule}x{self.micro_batches}")
        return "-".join(parts)


def _dominant(values: list[Any]) -> tuple[Any, bool]:
    """The most common value (ties: the first layer's) and whether layers disagree."""
    counts = Counter(values)
    best = max(counts.values())
    winner = next(v for v in values if counts[v] == best)
    return winner, len(counts) > 1


def load_plan(doc: Any) -> tuple[HybridRequest, HybridResult | None]:
    """A plan document as the server sends it (``{"kind", "request", "result"}``: ``GET /v1/plans/{id}``, or the
    plan of a claimed run) read into its request and typed result (None where it has none); SpecError names the
    bad field, or the kind where the runtime cannot run the plan."""
    if not isinstance(doc, dict) or not isinstance(doc.get("request"), dict):
        raise SpecError.at(("request",), "a plan needs its request object")
    try:
        kind = kind_of(doc["request"])
    except SpecError as err:
        raise err.under("request") from None
    if kind != "hybrid":  # its result would load, but it has no pipeline to map onto a mesh
        raise SpecError.at(("kind",), f"a {kind} plan: the worker runs hybrid plans only ({kind} plans cannot be "
                                      "run yet)")
    try:
        request: HybridRequest = parse(HybridRequest, doc["request"])
    except SpecError as err:
        raise err.under("request") from None
    if doc.get("result") is None:
        return request, None
    try:
        result = load_result(kind, doc["result"])
    except DocumentError as err:
        raise SpecError.at(("result",), str(err)) from None
    assert isinstance(result, HybridResult)  # load_result checks that the document is of ``kind``
    return request, result


def plan_of(request: HybridRequest, result: HybridResult | None) -> PlanStrategy:
    """The plan to run: the result's; without a result, the request's own strategy, read as the cost model
    reads it for an estimate (so that what runs is what was priced)."""
    if result is not None:
        try:
            return result.plan()
        except ValueError as err:  # stage_layers that do not match pp or the layers
            raise SpecError.at(("result", "strategy"), f"invalid strategy: {err}") from None
    if request.strategy is None:
        raise SpecError.at(("result", "strategy"), "a plan needs a strategy (the hybrid result's 'strategy')")
    from solvers.cost_model.api import plan_of_request

    try:
        return plan_of_request(request)
    except SpecError as err:
        raise err.under("request") from None


def from_document(request: HybridRequest, result: HybridResult | PlanStrategy | None,
                  world_size: int | None = None) -> RuntimePlan:
    """Map a plan (its parsed request and its result, or a plan itself) to a RuntimePlan; SpecError names bad
    fields.

    ``world_size`` is the number of processes this node will start (default: the request's cluster)."""
    plan = result if isinstance(result, PlanStrategy) else plan_of(request, result)
    return _runtime_plan(request, plan, world_size)


def _runtime_plan(request: HybridRequest, strategy: PlanStrategy, world_size: int | None) -> RuntimePlan:
    loc = ("result", "strategy")
    model, cluster, training = request.model, request.cluster, request.training
    problems: list[FieldProblem] = []
    notes: list[str] = []
    if len(strategy.layers) != model.num_layers:
        problems.append(FieldProblem((*loc, "layers"),
                                     f"{len(strategy.layers)} layer strategies for a {model.num_layers}-layer model"))
    if model.moe is not None:
        notes.append("MoE layers run as dense layers (expert parallelism is not implemented in the runtime)")
    if model.vocab_size <= 0:
        problems.append(FieldProblem(("request", "model", "vocab_size"), "the runtime trains a language model: > 0"))
    layers = strategy.layers or ()
    keys = [(ls.tp, ls.dp, ls.cp, ls.sp, ls.zero) for ls in layers]
    (tp, dp, cp, sp, zero), mixed = _dominant(keys) if keys else ((1, 1, 1, None, 0), False)
    if mixed:
        notes.append(f"per-layer tp/dp/sp/zero differ; ran the dominant choice tp={tp} dp={dp} cp={cp} sp={sp} "
                     f"zero={zero} on all layers")
    if cp > 1:
        notes.append(f"cp={cp}: ring attention is not implemented; cp ranks run as extra data parallelism")
        dp *= cp
    if sp == "ulysses" and tp == 1:
        sp = None
    if zero == 1:
        notes.append("zero=1 ran as FSDP2 with reshard_after_forward=False (ZeRO-2-like: gradients sharded too)")
    world = strategy.pp * dp * tp
    expected = world_size if world_size is not None else cluster.nodes * cluster.gpus_per_node
    if world != expected:
        problems.append(FieldProblem(loc, f"pp*dp*tp*cp = {world} but this node runs {expected} processes"))
    if cluster.nodes > 1 and world_size is None:
        problems.append(FieldProblem(("request", "cluster", "nodes"), "the worker runs a plan on one node"))
    gbs = training.global_batch_size
    if gbs % (dp * strategy.micro_batches):
        problems.append(FieldProblem(("request", "training", "global_batch_size"),
                                     f"{gbs} is not divisible by dp*micro_batches = {dp * strategy.micro_batches}"))
    if tp > 1:
        if sp == "ulysses":
            need = {"num_attention_heads": model.num_attention_heads, "num_kv_heads": model.kv_heads}
            need_seq = True
        else:
            need = {"num_attention_heads": model.num_attention_heads, "num_kv_heads": model.kv_heads,
                    "ffn_hidden_size": model.ffn_size, "vocab_size": model.vocab_size}
            need_seq = sp == "megatron"
        for name, value in need.items():
            if value % tp:
                problems.append(FieldProblem(("request", "model", name), f"{value} is not divisible by tp={tp}"))
        if need_seq and training.seq_length % tp:
            problems.append(FieldProblem(("request", "training", "seq_length"),
                                         f"{training.seq_length} is not divisible by the sequence split {tp}"))
    schedule, virtual = strategy.schedule, strategy.virtual_stages
    stage_layers = strategy.stage_layers
    if strategy.pp > 1 and schedule == "interleaved":
        virtual = max(2, virtual)
        if strategy.micro_batches % strategy.pp:
            problems.append(FieldProblem((*loc, "micro_batches"), "interleaved 1F1B needs a multiple of pp"))
        if model.num_layers < strategy.pp * virtual:
            problems.append(FieldProblem((*loc, "virtual_stages"), "fewer layers than virtual stages"))
        stage_layers = front_loaded_split(model.num_layers, strategy.pp * virtual)
        notes.append(f"interleaved: layers split evenly into {strategy.pp * virtual} virtual stages")
    elif strategy.pp > 1 and any(n == 0 for n in stage_layers):
        problems.append(FieldProblem((*loc, "stage_layers"), "every pipeline stage needs at least one layer"))
    if problems:
        raise SpecError(problems)
    precision = training.precision
    on_cpu = cluster.gpu.name.lower() == "cpu"
    if on_cpu and precision != "fp32":
        notes.append(f"precision {precision} requested; CPU runs compute in fp32")
        precision = "fp32"
    return RuntimePlan(
        model=ModelConfig.from_spec(model), global_batch_size=gbs, seq_length=training.seq_length,
        pp=strategy.pp, dp=dp, tp=tp, sp=sp, zero=zero,
        recompute=tuple(ls.recompute for ls in layers), micro_batches=strategy.micro_batches,
        schedule=schedule, virtual_stages=virtual if strategy.pp > 1 else 1, stage_layers=tuple(stage_layers),
        precision=precision, peak_flops_per_rank=cluster.gpu.peak_flops(precision),
        gpu_name=cluster.gpu.name, notes=tuple(notes),
    )
