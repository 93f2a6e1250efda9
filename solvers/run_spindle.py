"""A Spindle plan (request + result document) as the worker's Spindle runtime executes it: its slices in order,
which samples each device of a slice holds, which rows move between devices, and which ranks hold (and so
synchronise) each part of each module. Pure: ``worker.runtime.spindle`` runs it, ``check_runnable`` asks it.

What runs (anything else is refused with the field and the reason, never approximated):
- every metaop has a module shape (explicit ``time_ms_per_layer`` metaops have no model to run), dense (no MoE),
  and runs the whole module (``layer_offset`` 0, all its layers);
- a slice runs plain data parallelism over its devices (``layout`` null, or one whose only degree is dp with
  ZeRO 0 or 1, which computes the same);
- roles: a ``train`` metaop of a causal module is a language model over its task's tokens, prefixed by its
  predecessors' outputs (``lm``), or, where its predecessors generate or score (below), a policy update
  (``update``); a ``train`` metaop of a non-causal module is an encoder of patch features whose output feeds
  its successors (``encoder``, it must have some); a ``decode`` metaop of a causal module generates
  ``decode_tokens`` tokens greedily from its task's prompts (``rollout``, no predecessors); a ``forward``
  metaop of a causal module scores the tokens its one generating predecessor made (``score``); ``decode`` and
  ``forward`` metaops run in one slice, a ``forward`` one in one pass (``steps`` 1); a module trained as a
  language model is not also generated with (one-step off-policy RL: no rollouts of the previous step are kept);
- an edge joins metaops of one batch size; the slices' order (by start time) runs every slice after those it
  reads from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from solvers.documents import DocumentError, load_result
from solvers.documents.spindle import SliceDoc, SpindleResult
from solvers.errors import FieldProblem, SpecError
from solvers.spindle.workload import MetaOpSpec, ModuleShape, SpindleRequest

Role = Literal["lm", "update", "encoder", "rollout", "score"]
Loc = tuple[str | int, ...]
# What a module part is: "embed" (token or patch embedding), a layer index, or "head" (final norm and LM head,
# or an encoder's output projection).
Part = str | int


@dataclass(frozen=True)
class ModuleRun:
    """One module (weights shared by every metaop naming it) as the runtime builds it."""

    name: str
    shape: ModuleShape
    out_dim: int | None = None  # an encoder's output width: its successors' hidden size
    trained: bool = False  # some metaop trains it (else it is frozen)


@dataclass(frozen=True)
class MetaOpRun:
    name: str
    task: str
    module: str
    role: Role
    batch: int
    seq_length: int  # the module's, as this metaop runs it
    preds: tuple[str, ...] = ()  # in the workload's edge order
    decode_tokens: int = 1
    prompt_length: int = 0  # rollout: its prompt's tokens; score / update: the rollout's
    text_length: int = 0  # lm: its task's text tokens (the module's seq_length)
    prefix_length: int = 0  # lm: positions its predecessors' outputs take before the text

    @property
    def trains(self) -> bool:
        return self.role in ("lm", "update", "encoder")


@dataclass(frozen=True)
class StepRun:
    """One slice of the plan, in execution order."""

    index: int  # in the document's ``slices``
    metaop: str
    devices: tuple[int, ...]
    layer_start: int
    layers: int
    first: bool  # the metaop's first slice: it embeds the inputs
    last: bool  # the metaop's last slice: its head (loss, output)
    sources: tuple[int, ...]  # document indices of the slices it reads: the metaop's previous slice (then, for
    # a policy update's last slice, its predecessors' last slices too), or the last slices of the metaop's
    # predecessors (in edge order)


@dataclass(frozen=True)
class SpindleProgram:
    modules: dict[str, ModuleRun]
    metaops: dict[str, MetaOpRun]
    steps: tuple[StepRun, ...]
    tasks: tuple[str, ...]
    world_size: int
    predicted_iteration_time_s: float
    predicted_peak_memory_gib: float | None = None
    nodes: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes

    def step(self, index: int) -> StepRun:
        return next(s for s in self.steps if s.index == index)

    def parts(self, step: StepRun) -> list[Part]:
        """The module parts a slice runs."""
        out: list[Part] = ["embed"] if step.first else []
        out += list(range(step.layer_start, step.layer_start + step.layers))
        if step.last and (self.metaops[step.metaop].role != "encoder" or self.modules[self.metaops[
                step.metaop].module].out_dim is not None):
            out.append("head")
        return out

    def hosts(self) -> dict[tuple[str, Part], tuple[int, ...]]:
        """Per (module, part), the ranks holding it: every rank of a slice that runs it, in any mode. Each
        keeps a replica, and their gradients are summed over exactly these ranks (a rank that only generates
        with it receives the update the same way)."""
        out: dict[tuple[str, Part], set[int]] = {}
        for s in self.steps:
            module = self.metaops[s.metaop].module
            for part in self.parts(s):
                out.setdefault((module, part), set()).update(s.devices)
        return {k: tuple(sorted(v)) for k, v in out.items()}


def sample_range(batch: int, devices: Sequence[int], rank: int) -> tuple[int, int]:
    """The contiguous samples ``rank`` holds of a metaop's ``batch`` dealt over ``devices`` (the first
    ``batch % n`` devices one more); (0, 0) when it is not among them."""
    if rank not in devices:
        return (0, 0)
    k, n = list(devices).index(rank), len(devices)
    base, extra = divmod(batch, n)
    start = k * base + min(k, extra)
    return (start, start + base + (1 if k < extra else 0))


def moves(batch: int, src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """The rows handed from a slice on ``src`` to one on ``dst``: (from rank, to rank, first sample, end),
    maximal runs; a run with from == to stays on its device."""
    owner_src = [r for r in src for _ in range(*sample_range(batch, src, r))]
    owner_dst = [r for r in dst for _ in range(*sample_range(batch, dst, r))]
    out: list[tuple[int, int, int, int]] = []
    for i, pair in enumerate(zip(owner_src, owner_dst, strict=True)):
        if out and (out[-1][0], out[-1][1]) == pair and out[-1][3] == i:
            out[-1] = (*pair, out[-1][2], i + 1)
        else:
            out.append((*pair, i, i + 1))
    return out


def _module_of(spec_module: ModuleShape | None, name: str) -> str:
    return spec_module.name if spec_module is not None and spec_module.name else name


def spindle_program(request: SpindleRequest, result: SpindleResult, world_size: int | None = None) -> SpindleProgram:
    """The plan as the runtime runs it; SpecError naming every field the runtime cannot follow."""
    problems: list[FieldProblem] = []

    def refuse(loc: Loc, msg: str) -> None:
        problems.append(FieldProblem(loc, msg))

    world = request.cluster.num_gpus if world_size is None else world_size
    if world != request.cluster.num_gpus:
        refuse(("request", "cluster"), f"the plan is for {request.cluster.num_gpus} devices; {world} ranks start")
    specs = request.workload.metaops
    index = {s.name: i for i, s in enumerate(specs)}
    preds: dict[str, list[str]] = {s.name: [] for s in specs}
    succs: dict[str, list[str]] = {s.name: [] for s in specs}
    for k, (a, b) in enumerate(request.workload.edges):
        preds[b].append(a)
        succs[a].append(b)
        if specs[index[a]].batch_size != specs[index[b]].batch_size:
            refuse(("request", "workload", "edges", k), f"{a!r} ({specs[index[a]].batch_size} samples) feeds "
                   f"{b!r} ({specs[index[b]].batch_size}): the runtime hands samples over one for one")
    shapes: dict[str, ModuleShape] = {}
    roles: dict[str, Role] = {}
    for i, s in enumerate(specs):
        loc: Loc = ("request", "workload", "metaops", i)
        if s.module is None:
            refuse((*loc, "module"), "a metaop of explicit times has no model to run: give a module shape")
            continue
        name = _module_of(s.module, s.name)
        # one set of weights: the same shape in every metaop (each may run its own sequence length)
        if shapes.setdefault(name, s.module).model_copy(update={"seq_length": 1}) != s.module.model_copy(
                update={"seq_length": 1}):
            refuse((*loc, "module"), f"module {name!r} has two shapes")
        if s.module.moe is not None:
            refuse((*loc, "module", "moe"), "the Spindle runtime runs dense modules only")
        if s.layer_offset != 0 or s.layers != s.module.num_layers:
            refuse((*loc, "layer_offset"), "the runtime runs whole modules per metaop (layer_offset 0, all layers)")
        gen = [p for p in preds[s.name] if specs[index[p]].mode != "train"]
        if s.mode == "decode":
            role: Role = "rollout"
            if preds[s.name]:
                refuse((*loc, "mode"), "a decode metaop generates from its task's prompts: it takes no predecessor")
        elif s.mode == "forward":
            role = "score"
            if len(preds[s.name]) != 1 or specs[index[preds[s.name][0]]].mode == "train":
                refuse((*loc, "mode"), "a forward metaop scores the tokens of one generating (decode or forward) "
                                       "predecessor")
            if s.steps != 1:
                refuse((*loc, "steps"), "a forward metaop of several passes (diffusion denoising) is not run: the "
                                        "runtime scores in one pass")
        elif not s.module.causal:
            role = "encoder"
            if not succs[s.name]:
                refuse((*loc, "module", "causal"), "a non-causal trained module is an encoder: it needs a successor "
                                                   "to feed (the runtime has no loss for it)")
            if preds[s.name]:
                refuse((*loc, "name"), "an encoder takes patch features only, no predecessor")
        else:
            role = "update" if gen else "lm"
            generating = {_module_of(o.module, o.name) for o in specs if o.mode != "train"}
            if not gen and _module_of(s.module, s.name) in generating:
                refuse((*loc, "name"), "a module trained without reading this step's rollouts but also generating "
                                       "(one-step off-policy RL) is not run: the runtime keeps no previous step's "
                                       "rollouts to train on")
            if gen and len(gen) != len(preds[s.name]):
                refuse((*loc, "name"), "a policy update reads generating / scoring predecessors only")
            if succs[s.name]:
                refuse((*loc, "name"), "a trained causal module ends in its loss: it feeds no successor")
        if role in ("rollout", "score", "update") and not s.module.causal:
            refuse((*loc, "module", "causal"), f"a {s.mode} metaop needs a causal (token) module")
        roles[s.name] = role
    if problems:
        raise SpecError(problems)

    out_dims: dict[str, set[int]] = {}
    for s in specs:
        if roles[s.name] == "encoder":
            assert s.module is not None
            out_dims.setdefault(_module_of(s.module, s.name), set()).update(
                shapes[_module_of(specs[index[c]].module, c)].hidden_size for c in succs[s.name])
    for name, dims in out_dims.items():
        if len(dims) > 1:
            refuse(("request", "workload", "metaops"), f"encoder {name!r} feeds modules of widths {sorted(dims)}")
    trained = {_module_of(s.module, s.name) for s in specs if s.mode == "train"}
    modules = {n: ModuleRun(n, sh, min(out_dims[n]) if out_dims.get(n) else None, n in trained)
               for n, sh in shapes.items()}

    def rollout_of(name: str) -> MetaOpRun:
        return metaops[name] if metaops[name].role == "rollout" else rollout_of(metaops[name].preds[0])

    metaops: dict[str, MetaOpRun] = {}
    for s in (specs[i] for i in _topological(specs, preds)):
        assert s.module is not None
        mod = _module_of(s.module, s.name)
        role = roles[s.name]
        op = MetaOpRun(s.name, s.task or s.name, mod, role, s.batch_size, s.module.seq_length, tuple(preds[s.name]),
                       s.decode_tokens)
        if role == "rollout":
            op = MetaOpRun(**{**op.__dict__, "prompt_length": s.module.seq_length})
        elif role in ("score", "update"):
            first = rollout_of(op.preds[0])
            if any(rollout_of(p).name != first.name for p in op.preds):
                refuse(("request", "workload", "edges"), f"{s.name!r} reads the tokens of several rollouts")
            op = MetaOpRun(**{**op.__dict__, "prompt_length": first.prompt_length,
                              "decode_tokens": first.decode_tokens})
        elif role == "lm":
            prefix = sum(metaops[p].seq_length for p in op.preds)
            op = MetaOpRun(**{**op.__dict__, "text_length": s.module.seq_length, "prefix_length": prefix})
        metaops[s.name] = op

    steps = _steps(result.slices, metaops, modules, world, refuse)
    if problems:
        raise SpecError(problems)
    est = result.estimate
    tasks = tuple(dict.fromkeys(m.task for m in metaops.values() if m.trains))
    return SpindleProgram(modules, metaops, steps, tasks, world, est.iteration_time_s, est.peak_memory_gib,
                          request.cluster.nodes)


def _topological(specs: Sequence[MetaOpSpec], preds: dict[str, list[str]]) -> list[int]:
    names = [s.name for s in specs]
    done: set[str] = set()
    order: list[int] = []
    while len(order) < len(names):  # the workload was checked acyclic when the plan was made
        for i, n in enumerate(names):
            if n not in done and all(p in done for p in preds[n]):
                done.add(n)
                order.append(i)
    return order


def _steps(slices: Sequence[SliceDoc], metaops: dict[str, MetaOpRun], modules: dict[str, ModuleRun], world: int,
           refuse: Callable[[Loc, str], None]) -> tuple[StepRun, ...]:
    """The slices in execution order (start time, then the document's order), each with what it reads."""
    by_op: dict[str, list[int]] = {}
    for i, s in enumerate(slices):
        loc: Loc = ("result", "slices", i)
        if s.metaop not in metaops:
            refuse((*loc, "metaop"), f"unknown metaop {s.metaop!r}")
            continue
        by_op.setdefault(s.metaop, []).append(i)
        if not s.devices or len(set(s.devices)) != len(s.devices) or not all(0 <= d < world for d in s.devices):
            refuse((*loc, "devices"), f"devices {s.devices} are not distinct ranks below {world}")
        lay = s.layout
        if lay is not None and (lay.tp, lay.cp, lay.ep, lay.zero > 1) != (1, 1, 1, False):
            refuse((*loc, "layout"), f"the Spindle runtime runs data parallelism (ZeRO 0/1) only, not {lay.label()}")
    for name, op in metaops.items():
        if name not in by_op:
            refuse(("result", "slices"), f"no slice runs metaop {name!r}")
            continue
        chain = sorted(by_op[name], key=lambda i: slices[i].layer_start)
        at = 0
        for i in chain:
            if slices[i].layer_start != at:
                refuse(("result", "slices", i, "layer_start"), f"{name!r}: layers from {at} expected")
            at = slices[i].layer_start + slices[i].layers
        if at != modules[op.module].shape.num_layers:
            refuse(("result", "slices", chain[-1], "layers"), f"{name!r}: its slices end at layer {at}, not "
                                                              f"{modules[op.module].shape.num_layers}")
        if op.role in ("rollout", "score") and len(chain) > 1:
            refuse(("result", "slices", chain[1]), f"{name!r} ({op.role}) runs in one slice in the runtime")
    order = sorted((i for ops in by_op.values() for i in ops), key=lambda i: (slices[i].start_s, i))
    position = {i: k for k, i in enumerate(order)}
    out: list[StepRun] = []
    for i in order:
        s = slices[i]
        chain = sorted(by_op[s.metaop], key=lambda j: slices[j].layer_start)
        k = chain.index(i)
        preds = tuple(max(by_op[p], key=lambda j: slices[j].layer_start) for p in metaops[s.metaop].preds
                      if p in by_op)
        # a policy update's last slice reads its scorers' rows again (their tokens and log-probabilities)
        again = preds if k and k == len(chain) - 1 and metaops[s.metaop].role == "update" else ()
        sources = (chain[k - 1], *again) if k else preds
        for src in sources:
            if position[src] > position[i]:
                refuse(("result", "slices", i, "start_s"), f"slice {i} ({s.metaop}) starts before slice {src} it "
                                                           f"reads from")
        out.append(StepRun(i, s.metaop, tuple(s.devices), s.layer_start, s.layers, k == 0, k == len(chain) - 1,
                           sources))
    return tuple(out)


def is_spindle_plan(doc: Any) -> bool:
    """A plan document whose request is of kind spindle."""
    return isinstance(doc, dict) and isinstance(doc.get("request"), dict) and doc["request"].get("kind") == "spindle"


def load_program(doc: Any, world_size: int | None = None) -> SpindleProgram:
    """A Spindle plan document (``{"kind", "request", "result"}``, as ``GET /v1/plans/{id}`` gives it) as the
    runtime runs it; SpecError naming the field otherwise."""
    from solvers.spindle.api import parse_request

    if not isinstance(doc, dict) or not isinstance(doc.get("request"), dict):
        raise SpecError.at(("request",), "a plan document has a request object")
    request = parse_request(doc["request"])
    if not isinstance(doc.get("result"), dict):
        raise SpecError.at(("result",), "the plan has no result to run (not solved yet?)")
    try:
        result = load_result("spindle", doc["result"])
    except DocumentError as err:
        raise SpecError.at(("result",), str(err)) from None
    assert isinstance(result, SpindleResult)
    return spindle_program(request, result, world_size)
