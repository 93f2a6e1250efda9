"""The Spindle request: workload of metaops and edges (pydantic at the edge), and its plain form for planners.

A metaop is one module of one task: ``batch_size`` samples through ``num_layers`` layers. Its per-layer time
on ``n`` data-parallel devices is ``slope * ceil(batch / n) + intercept`` (ms), either given explicitly
(``time_ms_per_layer``, the reference planner's form) or derived from a ``module`` shape by the cost model. A
metaop may give both: the given time (e.g. measured on the cluster) then prices its layers, and the shape sizes
its memory, activation hand-overs and gradient sync (``estimate.given_layer_times`` names such metaops).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from solvers.errors import FieldProblem, SpecError
from solvers.request import PlanRequestBase
from solvers.specs import MAX_LAYERS, MAX_SEQ_LENGTH, MAX_WIDTH, ModelSpec, MoESpec, Precision, expand_preset

if TYPE_CHECKING:
    from solvers.spindle.layouts import Layout

Mode = Literal["train", "forward", "decode"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Physical ranges: a time or count near the float limits (1e300 ms, 5e-324 ms, 10^400 samples) overflowed or
# vanished in the planners' arithmetic (NaN splits, a zero division, CP-SAT domains, a successor ordered
# before a predecessor whose duration rounded away).
MIN_LAYER_MS, MAX_LAYER_MS = 1e-3, 1e7  # a GPU layer takes at least a microsecond; at most ~3 hours
MAX_SAMPLES = 2**24


class TimePerLayer(_Spec):
    slope_ms_per_sample: float = Field(ge=0, le=MAX_LAYER_MS)
    intercept_ms: float = Field(ge=0, le=MAX_LAYER_MS)

    @model_validator(mode="after")
    def _positive(self) -> TimePerLayer:
        if self.slope_ms_per_sample + self.intercept_ms < MIN_LAYER_MS:
            raise ValueError(f"a layer of one sample takes slope_ms_per_sample + intercept_ms = "
                             f"{self.slope_ms_per_sample + self.intercept_ms:g} ms; it must be at least "
                             f"{MIN_LAYER_MS:g} ms (a microsecond)")
        return self


class ModuleShape(_Spec):
    """A transformer stack; ``name`` identifies its parameters (metaops with one name share weights)."""

    INPUT_KEYS: ClassVar[tuple[str, ...]] = ("preset",)  # (read by _preset)

    name: str | None = None
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden_size: int = Field(gt=0, le=MAX_WIDTH)
    num_attention_heads: int = Field(gt=0, le=MAX_WIDTH)
    seq_length: int = Field(gt=0, le=MAX_SEQ_LENGTH)
    num_kv_heads: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    ffn_hidden_size: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    causal: bool = False
    moe: MoESpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        # {"preset": "vit-huge", "seq_length": 257}: layer shapes from the model presets.
        if isinstance(data, dict) and "preset" in data:
            from solvers.presets import MODEL_PRESETS

            # the layer shape only (a preset's vocabulary, dropout, ... are no module fields: they were refused)
            shapes = {k: {f: v for f, v in p.items() if f in cls.model_fields} for k, p in MODEL_PRESETS.items()}
            return expand_preset(data, shapes, "model")
        return data

    def model_spec(self) -> ModelSpec:
        return ModelSpec(name=self.name or "module", num_layers=self.num_layers, hidden_size=self.hidden_size,
                         num_attention_heads=self.num_attention_heads, num_kv_heads=self.num_kv_heads,
                         head_dim=self.head_dim, ffn_hidden_size=self.ffn_hidden_size, mlp=self.mlp,
                         causal=self.causal, moe=self.moe)


class MetaOpSpec(_Spec):
    name: str = Field(min_length=1)
    task: str | None = None
    batch_size: int = Field(gt=0, le=MAX_SAMPLES)
    num_layers: int | None = Field(default=None, gt=0, le=MAX_LAYERS)
    time_ms_per_layer: TimePerLayer | None = None
    module: ModuleShape | None = None
    # train: forward+backward with optimizer states; forward: frozen forward only; decode: autoregressive.
    mode: Mode = "train"
    layer_offset: int = Field(default=0, ge=0, le=MAX_LAYERS)  # first layer of module this metaop runs (split stacks)
    decode_tokens: int = Field(default=1, gt=0, le=MAX_SEQ_LENGTH)
    steps: int = Field(default=1, gt=0, le=100_000)  # repeated forward passes (diffusion denoising steps)
    recompute: bool = False  # full activation recomputation: keep layer inputs only, redo the forward

    @model_validator(mode="after")
    def _shape(self) -> MetaOpSpec:
        if self.time_ms_per_layer is None and self.module is None:
            raise ValueError("give time_ms_per_layer or module")
        if self.num_layers is None and self.module is None:
            raise ValueError("num_layers is required without a module")
        if self.module is not None:
            n = self.num_layers or self.module.num_layers - self.layer_offset
            if n <= 0 or self.layer_offset + n > self.module.num_layers:
                raise ValueError(f"layers {self.layer_offset}..{self.layer_offset + n} exceed the module's "
                                 f"{self.module.num_layers}")
        return self

    @property
    def layers(self) -> int:
        if self.num_layers is not None:
            return self.num_layers
        assert self.module is not None
        return self.module.num_layers - self.layer_offset


class WorkloadSpec(_Spec):
    INPUT_KEYS: ClassVar[tuple[str, ...]] = ("preset",)  # (read by _preset)
    metaops: list[MetaOpSpec] = Field(min_length=1, max_length=2000)
    edges: list[tuple[str, str]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and "preset" in data:
            from solvers.spindle.presets import workload_preset

            return workload_preset(data["preset"], **{k: v for k, v in data.items() if k != "preset"})
        return data


BACKWARD_SHARE = 2.0 / 3.0  # of a training slice's time, its backward: where DDP's gradient buckets start


class SpindleOptions(_Spec):
    exact: bool = True  # run the CP-SAT model after the wavefront planner and keep the better plan
    exact_time_limit_s: float = Field(default=10.0, gt=0, le=600)
    # CP-SAT's deterministic-time budget: it, not the wall clock, ends the search, so a request gives the same
    # plan on any load; null: derived from exact_time_limit_s (solvers.spindle.exact.deterministic_budget).
    # The wall clock (exact_time_limit_s) is still a safety net; search.exact.stopped_by says which one stopped.
    exact_deterministic_time: float | None = Field(default=None, gt=0)
    # 1: reproducible; more run CP-SAT's parallel portfolio, faster but different from run to run
    exact_workers: int = Field(default=1, ge=1, le=64)
    # local search after each planner, a budget of work (SLICE_EVALS_PER_S slice evaluations a second), not time
    polish_time_s: float = Field(default=0.3, ge=0, le=60)
    # a training metaop of a module shape may run tensor / context / expert parallel and ZeRO-3 layouts at a
    # width where they beat plain data parallelism or place what it cannot (false: data parallelism only)
    hybrid_layouts: bool = True
    efficiency: float = Field(default=0.5, gt=0, le=1)  # achieved fraction of GPU peak on matmuls
    # per layer forward+backward floor: ~40 kernel launches, framework and NCCL hook overhead (eager PyTorch)
    kernel_overhead_ms: float = Field(default=0.3, ge=0)
    # per message: an activation hand-over between device blocks, each ring step of a gradient all-reduce
    # (NCCL on NVLink / InfiniBand: ~20 us; bench/spindle_runtime.py measures gloo's over TCP on a CPU host)
    link_latency_us: float = Field(default=20.0, ge=0, le=1e6)
    # the share of a module's last training slice its gradient all-reduce may hide behind: DDP starts its buckets
    # during the backward (2/3 of the slice) on GPUs; 0 where the sync starts after the module's backward, or
    # where communication takes the compute's own cores (gloo on a CPU host)
    grad_sync_overlap: float = Field(default=BACKWARD_SHARE, ge=0, le=1)


class SpindleTraining(_Spec):
    precision: Precision = "bf16"  # of the module shapes' matrix multiplies (explicit times carry their own)


class SpindleRequest(PlanRequestBase):
    workload: WorkloadSpec
    training: SpindleTraining = Field(default_factory=SpindleTraining)
    options: SpindleOptions = Field(default_factory=SpindleOptions)
    slices: list[dict[str, Any]] | None = None  # a given schedule to estimate (what-if)


# --- plain form used by the planners ---


@dataclass(frozen=True)
class MetaOp:
    name: str
    task: str
    batch: int
    layers: int
    slope_ms: float
    intercept_ms: float
    mode: Mode = "train"
    module: str = ""  # parameter identity: (module, layer index) hosted twice is stored once, synced once
    layer_offset: int = 0
    params_per_layer: float = 0.0
    act_bytes_per_sample_layer: float = 0.0  # kept from forward to backward (train), KV cache (decode)
    work_bytes_per_sample: float = 0.0  # transient working set of the layer being computed
    out_bytes_per_sample: float = 0.0  # activation handed to a successor (and its gradient back in training)
    # per width 1..N, the hybrid layout it runs (None: plain data parallelism; solvers.spindle.layouts)
    layouts: tuple[Layout | None, ...] = ()
    given_time: bool = False  # a module metaop priced by the request's time_ms_per_layer, not by its shape

    def layout(self, n: int) -> Layout | None:
        return self.layouts[n - 1] if 0 < n <= len(self.layouts) else None

    def layer_ms(self, n: int) -> float:
        dp = self.slope_ms * -(-self.batch // n) + self.intercept_ms
        lay = self.layout(n)
        return dp if lay is None else dp * lay.time_factor

    @property
    def max_devices(self) -> int:
        # beyond one sample per device data parallelism stops helping; tensor / context parallelism does not
        return max(self.batch, len(self.layouts))


@dataclass(frozen=True)
class Workload:
    ops: tuple[MetaOp, ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    topo: tuple[int, ...]
    explicit: bool  # every metaop has an explicit time and no module: the time model is the whole cost

    @property
    def index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    @property
    def tasks(self) -> list[str]:
        return list(dict.fromkeys(op.task for op in self.ops))


def build_graph(ops: Sequence[MetaOp], edges: Sequence[tuple[str, str]], explicit: bool) -> Workload:
    """Index the edges, reject unknown names, duplicates and cycles (naming the field)."""
    problems: list[FieldProblem] = []
    index: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.name in index:
            problems.append(FieldProblem(("workload", "metaops", i, "name"), f"duplicate metaop name {op.name!r}"))
        index[op.name] = i
    preds: list[set[int]] = [set() for _ in ops]
    for k, (a, b) in enumerate(edges):
        for end, name in ((0, a), (1, b)):
            if name not in index:
                problems.append(FieldProblem(("workload", "edges", k, end), f"unknown metaop {name!r}"))
        if a in index and b in index:
            if a == b:
                problems.append(FieldProblem(("workload", "edges", k), f"self edge on {a!r}"))
            preds[index[b]].add(index[a])
    if problems:
        raise SpecError(problems)
    succs: list[set[int]] = [set() for _ in ops]
    for v, ps in enumerate(preds):
        for u in ps:
            succs[u].add(v)
    indeg = [len(p) for p in preds]
    order = [i for i in range(len(ops)) if indeg[i] == 0]
    for u in order:  # Kahn; `order` grows while iterating
        for v in sorted(succs[u]):
            indeg[v] -= 1
            if indeg[v] == 0:
                order.append(v)
    if len(order) != len(ops):
        cyc = sorted(ops[i].name for i in range(len(ops)) if indeg[i] > 0)
        raise SpecError.at(("workload", "edges"), f"edges form a cycle through {', '.join(cyc[:6])}")
    return Workload(tuple(ops), tuple(tuple(sorted(p)) for p in preds), tuple(tuple(sorted(s)) for s in succs),
                    tuple(order), explicit)
