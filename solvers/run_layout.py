"""What paraplan's training runtime (``worker.runtime``) executes for a plan, and whether that is the plan exactly.

The runtime runs every layer in its own layout, as planned: each transformer layer lays the ``N / pp`` ranks of
its pipeline stage out as ``dp x cp x tp`` (tp varying fastest; cp: ring attention over load-balanced sequence
chunks, ``worker.runtime.ring_attention``) with its own sequence-parallel kind and ZeRO stage (``LayerLayout``),
the embedding and the LM head as the plan's embedding strategy says; activations are re-laid out between
neighbours whose layouts differ; MoE layers fold their experts over the layer's ranks (``solvers.run_experts``).
Pipelines run the plan's own ``stage_layers``, interleaved ones cut into virtual stages as
``solvers.cost_model.pipeline.virtual_stage_layers`` says, and each model layer runs the strategy its stage was
priced with (``model_layer_order``: with interleaving the plan lists its layers stage by stage, not in model
order). A plan the runtime would have to approximate (an expert layout it cannot fold onto a layer's ranks, MoE
layers under context parallelism, virtual stages without the interleaved schedule, bf16 on CPU ranks) or cannot
split (a sequence not in 2*cp equal chunks) is refused with the field and the reason, never run as something
else. The service checks a run request with ``check_runnable`` and the worker builds its meshes from
``run_layout``: one function decides both, so a run the service accepts is a run the worker executes as planned.

Pure: no torch. ``worker.runtime.plan`` adds the model and device details.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal, get_args

from solvers.cost_model.calibration_set import RESOLVED
from solvers.cost_model.pipeline import model_layer_order, virtual_stage_layers
from solvers.documents import DocumentError, HybridResult, load_result
from solvers.errors import FieldProblem, SpecError
from solvers.kinds import kind_of
from solvers.request import HybridRequest, parse
from solvers.run_experts import ExpertLayout, expert_layouts
from solvers.run_flexsp import FlexSPRunLayout, check_flexsp_runnable, is_flexsp_plan
from solvers.run_spindle import SpindleProgram, is_spindle_plan, load_program
from solvers.specs import ModelSpec, Precision, StackSpec
from solvers.strategy import SCHEDULES, EmbeddingStrategy, LayerStrategy, PlanStrategy, Schedule, SpKind

STRATEGY = ("result", "strategy")

# The software stack the runtime is (``training.stack`` of what a run measures): attention through
# ``scaled_dot_product_attention`` (fused kernels), every elementwise op in PyTorch eager mode (no torch.compile),
# DTensor tensor parallelism with no communication overlap, ZeRO-0/1 gradients all-reduced after the step's
# backward passes (``worker.runtime.data_parallel``; FSDP2's ZeRO-2/3 traffic overlaps as priced by the constants),
# sharded optimizer states, "selective" recompute of the attention core (``worker.runtime.checkpointing``).
# ``StackSpec(framework="paraplan")`` resolves to all of this.
RUNTIME_STACK = StackSpec(framework="paraplan")
TokenDtype = Literal["uint16", "uint32"]
TOKEN_DTYPES: tuple[str, ...] = get_args(TokenDtype)


@dataclass(frozen=True)
class LayerLayout:
    """How one transformer layer (or the embedding / the LM head) lays out the ``dp * cp * tp`` ranks of its
    pipeline stage: local rank ``r`` is ``(dp_rank, cp_rank, tp_rank)`` with tp varying fastest.

    ``sp``: None (plain Megatron TP over the tp ranks; they hold copies of the activations between layers),
    "megatron" (TP + sequence parallelism: the tp ranks hold slices of the sequence between sub-layers) or
    "ulysses" (the tp ranks split the sequence and replicate the weights). ``cp``: ring-attention context
    parallelism; cp rank ``i`` holds sequence chunks ``i`` and ``2cp - 1 - i`` of ``2cp`` (load-balanced), and
    under SP or Ulysses its tp ranks split those two chunks, concatenated."""

    dp: int = 1
    cp: int = 1
    tp: int = 1
    sp: SpKind = None
    zero: int = 0

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp

    @property
    def tensor_parallel(self) -> int:
        """The degree the weights are split by (Megatron TP); 1 under Ulysses."""
        return 1 if self.sp == "ulysses" else self.tp

    @property
    def ulysses(self) -> int:
        """The Ulysses degree (the tp ranks split the sequence, weights replicated); 1 otherwise."""
        return self.tp if self.sp == "ulysses" else 1

    @property
    def data_ranks(self) -> int:
        """The ranks that hold the same weights and each train on their own tokens: they average gradients (over
        dp, cp and the Ulysses ranks), and the ZeRO stage shards over them."""
        return self.dp * self.cp * self.ulysses

    def describe(self) -> str:
        parts = [f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.tp > 1:
            parts.append(f"{'sp' if self.sp == 'ulysses' else 'tp'}{self.tp}")
        if self.sp == "megatron":
            parts.append("megatron-sp")
        parts.append(f"zero{self.zero}")
        return "-".join(parts)


@dataclass(frozen=True)
class RunLayout:
    """The layouts and schedule one run executes (every field as the plan says, nothing approximated)."""

    pp: int
    layers: tuple[LayerLayout, ...]  # per transformer layer, by global index
    embedding: LayerLayout  # the token embedding; the input batch is dealt to ranks as it says
    head: LayerLayout  # the final norm and LM head (the plan's embedding strategy, as ``embedding``)
    recompute: tuple[str, ...]  # per layer of the model, in model order (``model_layer_order``)
    micro_batches: int
    schedule: Schedule
    virtual_stages: int
    stage_layers: tuple[int, ...]  # layers per virtual stage in model order (``virtual_stage_layers``)
    precision: Precision
    nodes: int
    vocab_size: int
    experts: tuple[ExpertLayout | None, ...] = ()  # per layer: the MoE layers' expert layout, None where dense

    @property
    def world_size(self) -> int:
        return self.pp * self.embedding.world

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes


def runtime_request(request: dict[str, Any]) -> dict[str, Any]:
    """A hybrid request as the runtime runs it (what a run of its plan measures): its ``training.stack`` replaced
    by ``RUNTIME_STACK`` and, since a set for the request's stack is not one for the runtime's, the calibration set
    it named or the service resolved for it dropped."""
    training = request.get("training")
    cost_model = request.get("cost_model")
    out = {**request, "training": {**(training if isinstance(training, dict) else {}),
                                   "stack": RUNTIME_STACK.model_dump(mode="json", exclude_unset=True)}}
    if isinstance(cost_model, dict):
        out["cost_model"] = {k: v for k, v in cost_model.items() if k not in ("calibration_set", RESOLVED)}
    return out


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
        raise SpecError.at(("kind",), f"a {kind} plan: this reads hybrid plans ({kind} plans are read by their own "
                                      "runtime's check, solvers.run_flexsp or solvers.run_spindle)")
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


def check_runnable(doc: Any) -> RunLayout | SpindleProgram | FlexSPRunLayout:
    """The layout the runtime runs for a plan document on its request's cluster (a Spindle plan: its program,
    ``solvers.run_spindle``; a FlexSP plan: ``run_flexsp.check_flexsp_runnable``); SpecError (locations inside
    the plan document) where the worker cannot run it exactly."""
    if is_spindle_plan(doc):
        return load_program(doc)
    if is_flexsp_plan(doc):
        return check_flexsp_runnable(doc)
    request, result = load_plan(doc)
    return run_layout(request, plan_of(request, result))


def layer_layout(layer: LayerStrategy) -> LayerLayout:
    """A layer's layout as the runtime runs it (a sequence-parallel kind on one tp rank does nothing: dropped)."""
    return LayerLayout(dp=layer.dp, cp=layer.cp, tp=layer.tp, sp=layer.sp if layer.tp > 1 else None,
                       zero=layer.zero)


def end_layouts(embedding: EmbeddingStrategy, layers: tuple[LayerLayout, ...]) -> tuple[LayerLayout, LayerLayout]:
    """The embedding's and the LM head's layouts: the plan's embedding strategy (tp, dp, ZeRO; ``sp="ulysses"``:
    the tp ranks split the sequence and replicate the vocabulary, Galvatron's ``vsp``). With a split vocabulary,
    the activations beside it are sequence-sharded (Megatron SP: a reduce-scatter out of the embedding, an
    all-gather into the head) when the plan's embedding says ``"megatron"`` or the neighbouring layer runs Megatron
    SP, as Megatron and Galvatron apply their sequence-parallel flag to the embedding with the layers.

    The plan's embedding has no cp (the planner counts a layer's cp ranks in the embedding's dp: to the embedding
    and head, sequence chunks and rows are alike). Where the first and last layers share one cp degree that
    divides the embedding's dp, the embedding and head take it too (dp / cp rows, the layers' chunks): the same
    data-parallel ranks, and no re-layout between them and the layers."""
    cp = layers[0].cp if layers and layers[0].cp == layers[-1].cp and embedding.dp % layers[0].cp == 0 else 1

    def end(neighbour: LayerLayout | None) -> LayerLayout:
        sp: SpKind = embedding.sp
        if sp is None and neighbour is not None and neighbour.sp == "megatron":
            sp = "megatron"
        return LayerLayout(dp=embedding.dp // cp, cp=cp, tp=embedding.tp, sp=sp if embedding.tp > 1 else None,
                           zero=embedding.zero)

    return end(layers[0] if layers else None), end(layers[-1] if layers else None)


def _spans(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _layer_problems(layout: LayerLayout, pp: int, expected: int) -> list[tuple[tuple[str, ...], str]]:
    """What one layer's layout cannot run as: (field under the layer, reason)."""
    out: list[tuple[tuple[str, ...], str]] = []
    if pp * layout.world != expected:
        out.append(((), f"pp*dp*tp*cp = {pp * layout.world} but the run has {expected} processes"))
    if layout.zero not in (0, 1, 2, 3):
        out.append((("zero",), f"zero={layout.zero}: one of 0, 1, 2, 3"))
    return out


def _shape_problems(layout: LayerLayout, model: ModelSpec, seq_length: int, micro_rows: int | None,
                    transformer: bool) -> list[tuple[tuple[str, ...], str]]:
    """What the model's or the training's shape does not split into for ``layout``: (request field, reason)."""
    out: list[tuple[tuple[str, ...], str]] = []
    if layout.tensor_parallel > 1 or layout.ulysses > 1:
        if transformer:
            need = {"num_attention_heads": model.num_attention_heads, "num_kv_heads": model.kv_heads}
            if layout.tensor_parallel > 1:
                need["ffn_hidden_size"] = model.ffn_size
        else:  # the vocabulary-parallel embedding and LM head; under Ulysses they split nothing but the sequence
            need = {"vocab_size": model.vocab_size} if layout.tensor_parallel > 1 else {}
        out += [(("model", name), f"{value} is not divisible by tp={layout.tp}") for name, value in need.items()
                if value % layout.tp]
    cp, tp = layout.cp, layout.tp
    if cp > 1 and seq_length % (2 * cp):
        out.append((("training", "seq_length"), f"{seq_length} is not divisible by 2*cp = {2 * cp} (ring attention "
                                                "gives each cp rank two equal, load-balanced chunks)"))
    elif layout.sp is not None and (seq_length // cp) % tp:
        local = f"the {seq_length // cp} tokens of a cp rank" if cp > 1 else str(seq_length)
        out.append((("training", "seq_length"), f"{local} is not divisible by the sequence split {tp}"))
    if micro_rows is not None and micro_rows % layout.dp:
        out.append((("training", "global_batch_size"), f"dp={layout.dp}: a micro-batch of {micro_rows} samples does "
                                                       "not split into equal data-parallel shares"))
    return out


def run_layout(request: HybridRequest, plan: PlanStrategy, world_size: int | None = None) -> RunLayout:
    """The layout that runs ``plan`` exactly, or SpecError naming each field the runtime cannot honour (or that is
    invalid). ``world_size``: the processes of the run (default: the request's cluster, every node).

    A problem shared by several layers is reported once, at the first of them, naming them all."""
    model, cluster, training = request.model, request.cluster, request.training
    problems: list[FieldProblem] = []

    def refuse(loc: tuple[str | int, ...], msg: str) -> None:
        if all(p.loc != loc or p.msg != msg for p in problems):
            problems.append(FieldProblem(loc, msg))

    layers = plan.layers
    if len(layers) != model.num_layers:
        refuse((*STRATEGY, "layers"), f"{len(layers)} layer strategies for a {model.num_layers}-layer model")
    if model.vocab_size <= 0:
        refuse(("request", "model", "vocab_size"), "the runtime trains a language model: > 0")
    expected = world_size if world_size is not None else cluster.nodes * cluster.gpus_per_node
    gbs = training.global_batch_size
    if gbs % plan.micro_batches:
        refuse(("request", "training", "global_batch_size"),
               f"{gbs} is not divisible by micro_batches = {plan.micro_batches}")
    micro_rows = gbs // plan.micro_batches if gbs % plan.micro_batches == 0 else None
    stage_layers, order, virtual = _pipeline(plan, refuse)
    # The plan's layers are checked in the plan's order (problems name the plan's index); the run holds them in
    # the model's (``order``), which differs from the plan's under interleaving.
    planned = tuple(layer_layout(x) for x in layers)
    layouts = tuple(planned[j] for j in order)
    embedding, head = end_layouts(plan.embedding, layouts)
    per_layer: dict[tuple[tuple[str, ...], str], list[int]] = {}  # (field under a layer, reason) -> its layers
    for i, layout in enumerate(planned):
        for problem in _layer_problems(layout, plan.pp, expected):
            per_layer.setdefault(problem, []).append(i)
        for field, msg in _shape_problems(layout, model, training.seq_length, micro_rows, transformer=True):
            refuse(("request", *field), msg)
    for (field, msg), which in per_layer.items():
        refuse((*STRATEGY, "layers", which[0], *field), msg if len(which) == 1 else f"{msg} (layers {_spans(which)})")
    emb = plan.embedding
    if plan.pp * emb.tp * emb.dp != expected:
        refuse((*STRATEGY, "embedding"), f"the embedding and LM head are laid out pp*tp*dp = "
                                         f"{plan.pp * emb.tp * emb.dp} ranks but the run has {expected} processes")
    if emb.zero not in (0, 1, 2, 3):
        refuse((*STRATEGY, "embedding", "zero"), f"zero={emb.zero}: one of 0, 1, 2, 3")
    for end in (embedding, head):
        for field, msg in _shape_problems(end, model, training.seq_length, micro_rows, transformer=False):
            refuse(("request", *field), msg)
    experts, expert_problems = expert_layouts(request, plan, order)
    for found in expert_problems:
        refuse(found.loc, found.msg)
    precision = training.precision
    if cluster.gpu.name.lower() == "cpu" and precision != "fp32":
        refuse(("request", "training", "precision"), f"{precision}: CPU ranks compute in fp32 (ask for \"fp32\")")
    elif precision == "fp8":  # its autocast covers bf16 / fp16 only: an FP8 plan would run in fp32
        refuse(("request", "training", "precision"), "fp8: the runtime has no FP8 GEMMs (plan in \"bf16\")")
    if problems:
        raise SpecError(problems)
    return RunLayout(pp=plan.pp, layers=layouts, embedding=embedding, head=head,
                     recompute=tuple(layers[j].recompute for j in order),
                     micro_batches=plan.micro_batches, schedule=plan.schedule, virtual_stages=virtual,
                     stage_layers=stage_layers, precision=precision, nodes=cluster.nodes,
                     vocab_size=model.vocab_size, experts=experts)


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


def dataset_problems(path: str, dtype: str, vocab_size: int, document_separator: int | None = None,
                     by_document: bool = False) -> list[FieldProblem]:
    """What is wrong with a run's tokenized dataset as the run request names it (the file itself lives on the
    workers' storage and is checked there): locations under ``dataset``. ``by_document``: the run's sequences are
    the file's documents (FlexSP), which then needs ``document_separator``; other runs read fixed windows and
    refuse one."""
    out: list[FieldProblem] = []
    if by_document and document_separator is None:
        out.append(FieldProblem(("dataset", "document_separator"), "a FlexSP run trains on whole documents: the token "
                                                                   "id that ends each one"))
    elif not by_document and document_separator is not None:
        out.append(FieldProblem(("dataset", "document_separator"), "only a FlexSP run reads documents; this run reads "
                                                                   "windows of its sequence length"))
    elif document_separator is not None and not 0 <= document_separator < vocab_size:
        out.append(FieldProblem(("dataset", "document_separator"), f"a token id of the plan's vocabulary "
                                                                   f"(0..{vocab_size - 1})"))
    if not PurePosixPath(path).is_absolute() or "\x00" in path:
        out.append(FieldProblem(("dataset", "path"), "an absolute path on the workers' (shared) storage"))
    limit = {"uint16": 2**16, "uint32": 2**32}.get(dtype)
    if limit is None:
        out.append(FieldProblem(("dataset", "dtype"), f"one of {', '.join(TOKEN_DTYPES)}"))
    elif vocab_size > limit:
        out.append(FieldProblem(("dataset", "dtype"), f"{dtype} holds token ids below {limit}; the plan's model has a "
                                                      f"vocabulary of {vocab_size}"))
    return out
