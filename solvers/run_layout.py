"""What paraplan's training runtime (``worker.runtime``) executes for a plan, and whether that is the plan exactly.

The runtime lays ranks out on one device mesh ``pp x dp x tp`` with one layout for every layer. A plan is run
only when that mesh *is* the plan: a plan the runtime would have to approximate (a per-layer mix, context
parallelism, ZeRO-1, ZeRO-0 with TP or a pipeline, MoE layers, bf16 on CPU ranks) is refused with the field and
the reason, never run as something else. Pipelines run the plan's own ``stage_layers``, interleaved ones cut
into virtual stages as ``solvers.cost_model.pipeline.virtual_stage_layers`` says. The service checks a run
request with ``check_runnable`` and the worker builds its mesh from ``run_layout``: one function decides both,
so a run the service accepts is a run the worker executes as planned.

Pure: no torch. ``worker.runtime.plan`` adds the model and device details.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal, get_args

from solvers.cost_model.pipeline import model_layer_order, virtual_stage_layers
from solvers.documents import DocumentError, HybridResult, load_result
from solvers.errors import FieldProblem, SpecError
from solvers.kinds import kind_of
from solvers.request import HybridRequest, parse
from solvers.specs import Precision
from solvers.strategy import SCHEDULES, LayerStrategy, PlanStrategy, Schedule, SpKind

STRATEGY = ("result", "strategy")
TokenDtype = Literal["uint16", "uint32"]
TOKEN_DTYPES: tuple[str, ...] = get_args(TokenDtype)


@dataclass(frozen=True)
class RunLayout:
    """The mesh and schedule one run executes (every field as the plan says, nothing approximated)."""

    pp: int
    dp: int
    tp: int
    sp: SpKind  # None, "megatron" (TP + sequence parallel) or "ulysses" (the tp dim of the mesh runs Ulysses)
    zero: int
    recompute: tuple[str, ...]  # per layer of the model, in model order (``model_layer_order``)
    micro_batches: int
    schedule: Schedule
    virtual_stages: int
    stage_layers: tuple[int, ...]  # layers per virtual stage in model order (``virtual_stage_layers``)
    precision: Precision
    nodes: int
    vocab_size: int

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes


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
        raise SpecError.at(("kind",), f"a {kind} plan: the worker runs hybrid plans only ({kind} plans have no "
                                      "runtime yet)")
    try:
        request: HybridRequest = parse(HybridRequest, doc["request"])
    except SpecError as err:
        raise err.under("request") from None
    result = doc.get("result")
    if result is None:
        return request, None
    if not isinstance(result, HybridResult):
        try:
            result = load_result(kind, result)
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
            raise SpecError.at(STRATEGY, f"invalid strategy: {err}") from None
    if request.strategy is None:
        raise SpecError.at(STRATEGY, "a plan needs a strategy (the hybrid result's 'strategy')")
    from solvers.cost_model.api import plan_of_request

    try:
        return plan_of_request(request)
    except SpecError as err:
        raise err.under("request") from None


def check_runnable(doc: Any) -> RunLayout:
    """The layout the runtime runs for a plan document on its request's cluster; SpecError (locations inside the
    plan document) where the worker cannot run it exactly."""
    request, result = load_plan(doc)
    return run_layout(request, plan_of(request, result))


def _layout_key(layer: LayerStrategy) -> tuple[int, int, int, SpKind, int]:
    return layer.tp, layer.dp, layer.cp, layer.sp, layer.zero


def run_layout(request: HybridRequest, plan: PlanStrategy, world_size: int | None = None) -> RunLayout:
    """The layout that runs ``plan`` exactly, or SpecError naming each field the runtime cannot honour (or that is
    invalid). ``world_size``: the processes of the run (default: the request's cluster, every node)."""
    model, cluster, training = request.model, request.cluster, request.training
    problems: list[FieldProblem] = []

    def refuse(loc: tuple[str | int, ...], msg: str) -> None:
        problems.append(FieldProblem(loc, msg))

    layers = plan.layers
    if len(layers) != model.num_layers:
        refuse((*STRATEGY, "layers"), f"{len(layers)} layer strategies for a {model.num_layers}-layer model")
    if model.moe is not None:
        refuse(("request", "model", "moe"), "the worker cannot run MoE layers yet (expert parallelism has no "
                                            "runtime); the plan would run them as dense layers")
    if model.vocab_size <= 0:
        refuse(("request", "model", "vocab_size"), "the runtime trains a language model: > 0")
    first = layers[0] if layers else LayerStrategy()
    differ = next((i for i, x in enumerate(layers) if _layout_key(x) != _layout_key(first)), None)
    if differ is not None:
        refuse((*STRATEGY, "layers", differ),
               f"layer {differ} is laid out tp={layers[differ].tp} dp={layers[differ].dp} cp={layers[differ].cp} "
               f"sp={layers[differ].sp} zero={layers[differ].zero}, layer 0 tp={first.tp} dp={first.dp} "
               f"cp={first.cp} sp={first.sp} zero={first.zero}: the worker runs one layout on every layer (per-layer "
               "mixes have no runtime yet)")
    tp, dp, cp, zero = first.tp, first.dp, first.cp, first.zero
    sp: SpKind = None if first.sp == "ulysses" and tp == 1 else first.sp
    if cp > 1:
        refuse((*STRATEGY, "layers", 0, "cp"), f"cp={cp}: the worker has no ring attention yet")
    ulysses = sp == "ulysses"
    dp_ranks = dp * (tp if ulysses else 1)  # the ranks that average gradients (Ulysses ranks replicate weights)
    tensor_parallel = 1 if ulysses else tp
    if dp_ranks > 1 and zero == 1:
        refuse((*STRATEGY, "layers", 0, "zero"), "ZeRO-1 (optimizer state sharded alone) has no runtime: FSDP2 "
                                                 "would shard the gradients too (ZeRO-2)")
    if dp_ranks > 1 and zero == 0 and (tensor_parallel > 1 or plan.pp > 1):
        why = "tensor parallelism" if tensor_parallel > 1 else "a pipeline"
        refuse((*STRATEGY, "layers", 0, "zero"), f"ZeRO-0 with {why}: DDP does not compose with it in the runtime "
                                                 "(choose zero 2 or 3)")
    emb = plan.embedding
    emb_tp_ok = emb.tp == tp and emb.sp != "ulysses" if not ulysses else emb.tp in (1, tp) and emb.sp != "megatron"
    if not emb_tp_ok and model.vocab_size > 0:
        want = f"tp={tp}" + (" with sp=\"ulysses\" (or tp=1)" if ulysses else "")
        refuse((*STRATEGY, "embedding", "tp"), f"the runtime lays the embedding and LM head out as the layers "
                                               f"({want}); the plan has tp={emb.tp} sp={emb.sp}")
    if dp_ranks > 1 and emb.zero != zero and zero in (0, 2, 3):
        refuse((*STRATEGY, "embedding", "zero"), f"the runtime shards the embedding and LM head as the layers "
                                                 f"(zero={zero}); the plan has zero={emb.zero}")
    world = plan.pp * dp * tp * cp
    expected = world_size if world_size is not None else cluster.nodes * cluster.gpus_per_node
    if world != expected:
        refuse(STRATEGY, f"pp*dp*tp*cp = {world} but the run has {expected} processes")
    gbs = training.global_batch_size
    if gbs % (dp * plan.micro_batches):
        refuse(("request", "training", "global_batch_size"),
               f"{gbs} is not divisible by dp*micro_batches = {dp * plan.micro_batches}")
    if tp > 1:
        if ulysses:
            need = {"num_attention_heads": model.num_attention_heads, "num_kv_heads": model.kv_heads}
        else:
            need = {"num_attention_heads": model.num_attention_heads, "num_kv_heads": model.kv_heads,
                    "ffn_hidden_size": model.ffn_size, "vocab_size": model.vocab_size}
        for name, value in need.items():
            if value % tp:
                refuse(("request", "model", name), f"{value} is not divisible by tp={tp}")
        if sp is not None and training.seq_length % tp:
            refuse(("request", "training", "seq_length"),
                   f"{training.seq_length} is not divisible by the sequence split {tp}")
    stage_layers, order, virtual = _pipeline(plan, refuse)
    precision = training.precision
    if cluster.gpu.name.lower() == "cpu" and precision != "fp32":
        refuse(("request", "training", "precision"), f"{precision}: CPU ranks compute in fp32 (ask for \"fp32\")")
    if problems:
        raise SpecError(problems)
    return RunLayout(pp=plan.pp, dp=dp, tp=tp, sp=sp, zero=zero, recompute=tuple(layers[i].recompute for i in order),
                     micro_batches=plan.micro_batches, schedule=plan.schedule, virtual_stages=virtual,
                     stage_layers=stage_layers, precision=precision, nodes=cluster.nodes,
                     vocab_size=model.vocab_size)


def _pipeline(plan: PlanStrategy, refuse: Callable[[tuple[str | int, ...], str], None]
              ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """The pipeline the runtime cuts for ``plan``: layers per virtual stage in model order, the plan's layer
    strategy of each model layer (``model_layer_order``) and the virtual stages per rank; refuses (through
    ``refuse``) a schedule the runtime has not. Every schedule the planner emits runs: GPipe and 1F1B with any
    split and any number of micro-batches, interleaved 1F1B with the plan's own split over >= 2 virtual stages
    and micro-batches a multiple of pp (the planner's space)."""
    pp, v, schedule = plan.pp, plan.virtual_stages, plan.schedule
    identity = tuple(range(sum(plan.stage_layers)))
    if schedule not in SCHEDULES:
        refuse((*STRATEGY, "schedule"), f"{schedule!r}: the runtime runs the schedules {', '.join(SCHEDULES)}")
        return plan.stage_layers, identity, 1
    if pp > 1 and any(n < 1 for n in plan.stage_layers):
        refuse((*STRATEGY, "stage_layers"), "every pipeline stage needs at least one layer")
    if v != 1 and (pp == 1 or schedule != "interleaved"):
        why = "a pipeline of pp >= 2 stages" if pp == 1 else "the interleaved schedule"
        refuse((*STRATEGY, "virtual_stages"), f"{v} virtual stages need {why}")
        return plan.stage_layers, identity, 1
    if pp == 1 or schedule != "interleaved":
        return plan.stage_layers, identity, 1
    if v < 2:
        refuse((*STRATEGY, "virtual_stages"), "the interleaved schedule with one virtual stage per rank has no "
                                              "runtime (torch's interleaved 1F1B needs at least 2)")
    elif plan.micro_batches % pp:
        refuse((*STRATEGY, "micro_batches"), "interleaved 1F1B needs a multiple of pp")
    elif min(plan.stage_layers) < v:
        refuse((*STRATEGY, "stage_layers"), f"a stage has fewer layers than its {v} virtual stages")
    else:
        return virtual_stage_layers(plan.stage_layers, v), model_layer_order(plan.stage_layers, v), v
    return plan.stage_layers, identity, 1


def dataset_problems(path: str, dtype: str, vocab_size: int) -> list[FieldProblem]:
    """What is wrong with a run's tokenized dataset as the run request names it (the file itself lives on the
    workers' storage and is checked there): locations under ``dataset``."""
    out: list[FieldProblem] = []
    if not PurePosixPath(path).is_absolute() or "\x00" in path:
        out.append(FieldProblem(("dataset", "path"), "an absolute path on the workers' (shared) storage"))
    limit = {"uint16": 2**16, "uint32": 2**32}.get(dtype)
    if limit is None:
        out.append(FieldProblem(("dataset", "dtype"), f"one of {', '.join(TOKEN_DTYPES)}"))
    elif vocab_size > limit:
        out.append(FieldProblem(("dataset", "dtype"), f"{dtype} holds token ids below {limit}; the plan's model has a "
                                                      f"vocabulary of {vocab_size}"))
    return out
