"""Input specs shared by every solver: model, GPU, cluster, training, constraints.

These are the pydantic models at the edge (requests, files). Presets are expanded here, so that
``{"preset": "llama2-7b", "num_layers": 4}`` is a llama2-7b with four layers. Solvers convert what they
need into plain dataclasses / numpy arrays for their hot loops.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from solvers.errors import SpecError
from solvers.strategy import Schedule

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
MlpKind = Literal["gelu", "swiglu"]


# Physical ranges: far beyond any hardware or model that exists, and well inside what float arithmetic prices.
# A GPU of 1e-300 TFLOP/s or links of 1e-300 GB/s made every time overflow to inf, and the planner then said
# that no plan fits the memory limit.
MIN_TFLOPS, MAX_TFLOPS = 1e-6, 1e6  # 1 MFLOP/s .. 1 EFLOP/s per device
MIN_GIB, MAX_GIB = 2.0**-20, 2.0**20  # 1 KiB .. 1 PiB per device
MIN_BANDWIDTH, MAX_BANDWIDTH = 1e-6, 1e7  # GB/s for memory and NVLink, Gb/s for networks
MAX_WIDTH = 2**24  # hidden, FFN and head sizes, heads (PaLM 540B: hidden 18,432)
MAX_SEQ_LENGTH = 2**30  # tokens per sample (the longest-context training runs reach ~10 M)
MAX_LAYERS = 4096
MAX_EXPERTS = 2**20  # per MoE layer ("A Mixture of a Million Experts", 2024)
# What a request leaves out: one node of eight GPUs, sequences of 2,048 tokens (the dashboard's form shows the same)
DEFAULT_NODES = 1
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_SEQ_LENGTH = 2048
# the framework a hybrid plan is for (constraints.target): paraplan plans the whole space (solvers.hybrid.targets)
Target = Literal["paraplan", "megatron", "torchtitan", "deepspeed"]


class _Spec(BaseModel):
    # Unknown keys are an error: a typo such as "num_layer" must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_flag_for_a_number(cls, v: Any, info: ValidationInfo) -> Any:
        """A JSON true or false is no size or count (lax validation read "num_layers": true as 1 layer)."""
        if isinstance(v, bool) and info.field_name is not None:
            ann = cls.model_fields[info.field_name].annotation
            if bool not in (getattr(ann, "__args__", None) or (ann,)):
                raise ValueError(f"must be a number, got {str(v).lower()}")
        return v


def expand_preset(data: Any, table: dict[str, dict[str, Any]], what: str) -> Any:
    """Merge ``{"preset": name, **overrides}`` into the preset's fields (overrides win)."""
    if not isinstance(data, dict) or "preset" not in data:
        return data
    name = data["preset"]
    key = str(name).lower()
    if key not in table:
        raise ValueError(f"unknown {what} preset {name!r}; known: {', '.join(sorted(table))}")
    merged = dict(table[key])
    merged.update({k: v for k, v in data.items() if k != "preset"})
    return merged


class MoESpec(_Spec):
    # (a million: the most any published MoE has; 1e308 overflowed the FLOP count, 2^31 gave negative memory)
    num_experts: int = Field(gt=1, le=MAX_EXPERTS)
    top_k: int = Field(default=2, ge=1)
    expert_ffn_hidden_size: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    capacity_factor: float = Field(default=1.25, gt=0, le=2**20)
    # Layers that are MoE: every `moe_layer_frequency`-th layer (1 = all layers, as in Mixtral).
    moe_layer_frequency: int = Field(default=1, ge=1, le=MAX_LAYERS)

    @model_validator(mode="after")
    def _top_k_le_experts(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        return self


class ModelSpec(_Spec):
    """A transformer (decoder, encoder or encoder-decoder treated as a stack of layers)."""

    INPUT_KEYS: ClassVar[tuple[str, ...]] = ("preset", "hf_config")  # (read by _preset)
    name: str = "custom"
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    hidden_size: int = Field(gt=0, le=MAX_WIDTH)
    num_attention_heads: int = Field(gt=0, le=MAX_WIDTH)
    num_kv_heads: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    ffn_hidden_size: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    vocab_size: int = Field(default=0, ge=0, le=2**32)
    mlp: MlpKind = "gelu"
    tied_embeddings: bool = False
    causal: bool = True
    # Dropout keeps a mask and a copy of what it drops from (Korthikanti et al. count both); at p = 0
    # PyTorch returns its input and nothing is kept. Megatron-LM's default is 0.1; Llama, Qwen2 and
    # Mixtral train without dropout (their presets say 0).
    attention_dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    hidden_dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    moe: MoESpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        from solvers.presets import MODEL_PRESETS, model_from_hf_config

        if isinstance(data, dict) and "hf_config" in data:
            # {"hf_config": {...config.json...}, **overrides}: the imported fields, overrides win
            cfg = data["hf_config"]
            if not isinstance(cfg, dict):
                raise ValueError("hf_config must be the contents of a Hugging Face config.json (a JSON object); "
                                 "the CLI reads a path given there relative to the request file")
            overrides = {k: v for k, v in data.items() if k != "hf_config"}
            return {**model_from_hf_config(cfg, given=overrides), **overrides}
        return expand_preset(data, MODEL_PRESETS, "model")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        kv = self.kv_heads
        if self.num_attention_heads % kv:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_kv_heads ({kv})"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}) unless head_dim is given"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.mlp == "swiglu":
            # Llama's rounding: 2/3 of 4h, up to a multiple of 256.
            return 256 * math.ceil(int(8 * self.hidden_size / 3) / 256)
        return 4 * self.hidden_size

    @property
    def expert_ffn_size(self) -> int:
        if self.moe is not None and self.moe.expert_ffn_hidden_size is not None:
            return self.moe.expert_ffn_hidden_size
        return self.ffn_size

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and (index + 1) % self.moe.moe_layer_frequency == 0

    # --- parameter counts (closed forms, used by memory and FLOP models) ---
    def attention_params(self) -> int:
        h, d = self.hidden_size, self.head_size
        q = h * self.num_attention_heads * d
        kv = 2 * h * self.kv_heads * d
        out = self.num_attention_heads * d * h
        return q + kv + out

    def mlp_params(self, ffn: int | None = None) -> int:
        f = ffn if ffn is not None else self.ffn_size
        mats = 3 if self.mlp == "swiglu" else 2
        return mats * self.hidden_size * f

    def layer_params(self, index: int = 0) -> int:
        """Parameters of one transformer layer (weights; norms add 2h and are included)."""
        norms = 2 * self.hidden_size
        if self.is_moe_layer(index):
            assert self.moe is not None
            experts = self.moe.num_experts * self.mlp_params(self.expert_ffn_size)
            router = self.hidden_size * self.moe.num_experts
            return self.attention_params() + experts + router + norms
        return self.attention_params() + self.mlp_params() + norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        head = 0 if self.tied_embeddings else self.embedding_params()
        return layers + self.embedding_params() + head + self.hidden_size


class GPUSpec(_Spec):
    INPUT_KEYS: ClassVar[tuple[str, ...]] = ("preset",)  # (read by ClusterSpec._gpu_preset)
    name: str = "custom"
    peak_tflops: float = Field(ge=MIN_TFLOPS, le=MAX_TFLOPS, description="dense bf16/fp16 tensor-core peak, TFLOP/s")
    peak_tflops_fp8: float | None = Field(default=None, ge=MIN_TFLOPS, le=MAX_TFLOPS)
    peak_tflops_fp32: float | None = Field(default=None, ge=MIN_TFLOPS, le=MAX_TFLOPS)
    memory_gib: float = Field(ge=MIN_GIB, le=MAX_GIB)
    memory_bandwidth_GBps: float = Field(default=2000.0, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)
    intra_node_bandwidth_GBps: float = Field(default=300.0, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)
    inter_node_bandwidth_Gbps: float = Field(default=1600.0, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)
    matmul_tflops: float | None = Field(
        default=None, ge=MIN_TFLOPS, le=MAX_TFLOPS,
        description="the largest dense bf16/fp16 matmul TFLOP/s measured on this GPU (its maximum achievable "
                    "matmul FLOPS): the cost model prices its GEMMs at this share of the peak (null: assumed, the "
                    "share of the GPU the constants were fitted on)")
    matmul_tflops_fp8: float | None = Field(default=None, ge=MIN_TFLOPS, le=MAX_TFLOPS,
                                            description="the same for FP8 GEMMs (needs peak_tflops_fp8)")
    source: str | None = Field(default=None, max_length=1000,
                               description="where the figures come from (the presets name their datasheets)")

    @model_validator(mode="after")
    def _measured_matmul_within_peak(self) -> GPUSpec:
        if self.matmul_tflops is not None and self.matmul_tflops > self.peak_tflops:
            raise ValueError(f"matmul_tflops {self.matmul_tflops:g} is a measured matmul throughput and cannot "
                             f"exceed peak_tflops {self.peak_tflops:g}")
        if self.matmul_tflops_fp8 is not None:
            if self.peak_tflops_fp8 is None:
                raise ValueError("matmul_tflops_fp8 needs peak_tflops_fp8 (the FP8 peak it is a share of)")
            if self.matmul_tflops_fp8 > self.peak_tflops_fp8:
                raise ValueError(f"matmul_tflops_fp8 {self.matmul_tflops_fp8:g} is a measured matmul throughput "
                                 f"and cannot exceed peak_tflops_fp8 {self.peak_tflops_fp8:g}")
        return self

    @property
    def is_cpu(self) -> bool:
        """A CPU host (the "cpu" preset: gloo processes, no CUDA runtime), as the worker tells one too."""
        return self.name.lower() == "cpu"

    def peak_flops(self, precision: Precision, loc: tuple[str, ...] = ("training", "precision")) -> float:
        """Peak FLOP/s for the precision of the matrix multiplies. fp8 needs the GPU's FP8 peak: Ampere and
        older have no FP8 tensor cores (guessing twice the bf16 peak priced an A100 at 1.5x its speed);
        ``loc``: the request's precision field, named in that error."""
        if precision == "fp8":
            if self.peak_tflops_fp8 is None:
                raise SpecError.at(loc, f"fp8 needs FP8 tensor cores and the {self.name} GPU has no FP8 peak "
                                        "(peak_tflops_fp8): use bf16 or fp16, or give cluster.gpu.peak_tflops_fp8 "
                                        "for a GPU that has them")
            return 1e12 * self.peak_tflops_fp8
        if precision == "fp32":
            return 1e12 * (self.peak_tflops_fp32 or self.peak_tflops / 2)
        return 1e12 * self.peak_tflops


MAX_GROUPS = 4  # node groups of a heterogeneous cluster: GPU generations a job mixes in practice


def _expand_gpu(v: Any) -> Any:
    """A GPU given as a preset name, ``{"preset": ...}`` or ``{"name": preset, overrides...}``, expanded."""
    from solvers.presets import GPU_PRESETS

    if isinstance(v, str):
        return expand_preset({"preset": v}, GPU_PRESETS, "gpu")
    if isinstance(v, dict) and "preset" in v:
        return expand_preset(v, GPU_PRESETS, "gpu")
    if isinstance(v, dict) and "name" in v and str(v["name"]).lower() in GPU_PRESETS:
        # {"name": "A100-80GB", "peak_tflops": 300}: start from the preset, override given fields.
        return expand_preset({"preset": v["name"], **v}, GPU_PRESETS, "gpu")
    return v


class NodeGroup(_Spec):
    """Nodes of one GPU type in a heterogeneous cluster (``cluster.groups``)."""

    gpu: GPUSpec
    nodes: int = Field(gt=0, le=100_000)
    gpus_per_node: int = Field(default=DEFAULT_GPUS_PER_NODE, gt=0, le=1024)

    _gpu_preset = field_validator("gpu", mode="before")(lambda v: _expand_gpu(v))

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class ClusterSpec(_Spec):
    """One GPU type (``gpu``, ``nodes``, ``gpus_per_node``), or ``groups`` of node groups of different types.

    With groups, ``gpu`` is the groups' GPU with the least memory (what a plan blind to the types must fit in),
    ``nodes`` their sum and ``gpus_per_node`` theirs, which must be one for all: the hybrid planner prices each
    pipeline stage on the GPUs that host it (``solvers.cost_model.hetero``)."""

    gpu: GPUSpec
    nodes: int = Field(default=DEFAULT_NODES, gt=0, le=100_000)
    gpus_per_node: int = Field(default=DEFAULT_GPUS_PER_NODE, gt=0, le=1024)
    intra_node_bandwidth_GBps: float | None = Field(default=None, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)
    inter_node_bandwidth_Gbps: float | None = Field(default=None, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)
    groups: tuple[NodeGroup, ...] | None = None
    # per node, between nodes of different groups (default: the slower group's own network)
    inter_group_bandwidth_Gbps: float | None = Field(default=None, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)

    _gpu_preset = field_validator("gpu", mode="before")(lambda v: _expand_gpu(v))

    @model_validator(mode="before")
    @classmethod
    def _from_groups(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("groups") is None:
            if isinstance(data, dict) and data.get("inter_group_bandwidth_Gbps") is not None:
                raise ValueError("inter_group_bandwidth_Gbps applies to a cluster of groups only")
            return data
        raw = data["groups"]
        placeholder = {"gpu": {"memory_gib": 1.0, "peak_tflops": 1.0}, **data}
        if not isinstance(raw, list | tuple):
            return placeholder  # the groups field's own validation names the problem
        if not 1 <= len(raw) <= MAX_GROUPS:
            raise ValueError(f"groups lists 1 to {MAX_GROUPS} node groups, not {len(raw)}")
        try:
            groups = [NodeGroup.model_validate(g) if not isinstance(g, NodeGroup) else g for g in raw]
        except ValueError:
            # the groups field's own validation names the problem (at cluster.groups.N...): the fields the
            # groups set must not be reported missing beside it
            return placeholder
        per_node = {g.gpus_per_node for g in groups}
        if len(per_node) > 1:
            raise ValueError(f"every group needs the same gpus_per_node (got {sorted(per_node)}): a pipeline stage "
                             "is priced per node")
        gpu = min(groups, key=lambda g: g.gpu.memory_gib).gpu
        derived: dict[str, Any] = {"gpu": gpu, "nodes": sum(g.nodes for g in groups),
                                   "gpus_per_node": groups[0].gpus_per_node}
        for key, value in derived.items():
            given = data.get(key)
            if given is not None and given != value and not (key == "gpu" and _same_gpu(given, gpu)):
                raise ValueError(f"{key} is set by groups; give one or the other")
        return {**data, **derived, "groups": groups}

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def intra_GBps(self) -> float:
        """Per-GPU, one-direction bandwidth inside a node (GB/s)."""
        return self.intra_node_bandwidth_GBps or self.gpu.intra_node_bandwidth_GBps

    @property
    def inter_Gbps(self) -> float:
        """The node's network bandwidth (Gb/s): the cluster's own, else its GPU preset's."""
        return self.inter_node_bandwidth_Gbps or self.gpu.inter_node_bandwidth_Gbps

    @property
    def inter_GBps_per_gpu(self) -> float:
        """Per-GPU share of the node's network bandwidth (GB/s)."""
        return self.inter_Gbps / 8.0 / self.gpus_per_node


def _same_gpu(given: Any, gpu: GPUSpec) -> bool:
    """``given`` (as a request writes it) is the GPU ``gpu``: a re-read dump of a cluster of groups."""
    try:
        return GPUSpec.model_validate(_expand_gpu(given)) == gpu
    except ValueError:
        return False


class SizingSpec(_Spec):
    """A hybrid request's ``sizing``: train ``tokens`` by ``deadline_days`` on one of the priced GPU types; the
    result's ``front`` is time-to-train against cost over cluster sizes and types."""

    tokens: float = Field(gt=0, le=1e18)
    deadline_days: float | None = Field(default=None, gt=0, le=1e5)
    # GPU preset name -> price per GPU-hour (any currency); each a candidate GPU type
    price_per_gpu_hour: dict[str, float] = Field(min_length=1, max_length=8)
    max_nodes: int = Field(default=256, gt=0, le=100_000, description="the largest cluster tried, in nodes")
    nodes: list[int] | None = Field(default=None, min_length=1, max_length=256,
                                    description="the node counts to try (default: two per doubling up to max_nodes)")

    @field_validator("price_per_gpu_hour")
    @classmethod
    def _priced_presets(cls, v: dict[str, float]) -> dict[str, float]:
        from solvers.presets import GPU_PRESETS

        unknown = [k for k in v if k.lower() not in GPU_PRESETS]
        if unknown:
            raise ValueError(f"unknown GPU preset {unknown[0]!r}; known: {', '.join(sorted(GPU_PRESETS))}")
        bad = [k for k, price in v.items() if not (isinstance(price, int | float) and 0 < price < 1e6)]
        if bad:
            raise ValueError(f"the price of {bad[0]} must be a positive number per GPU-hour")
        return v


# Far beyond any training batch (2^40 samples), and within what the planner's divisor enumerations (O(sqrt))
# finish in seconds: at 2^63 they ran for minutes.
MAX_GLOBAL_BATCH_SIZE = 2**40


AttentionKernel = Literal["fused", "unfused"]
ElementwiseKernels = Literal["fused", "eager"]
Framework = Literal["megatron-core", "megatron-lm", "torchtitan", "deepspeed", "paraplan"]
TpCommOverlap = Literal["none", "backward", "full"]
Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
# The TP overlap each framework runs unless told otherwise: Megatron issues the backward input-gradient all-reduce
# asynchronously behind the weight-gradient GEMMs (its forward overlap, --tp-comm-overlap, needs Transformer
# Engine's userbuffers and is opt-in); torchtitan's async TP and DeepSpeed's AutoTP are opt-in / do not overlap,
# nor do paraplan's runtime's DTensor layers (worker.runtime.tensor_parallel).
FRAMEWORK_TP_OVERLAP: dict[str, TpCommOverlap] = {"megatron-core": "backward", "megatron-lm": "backward",
                                                   "torchtitan": "none", "deepspeed": "none", "paraplan": "none"}
# What a framework runs where the stack leaves elementwise / dp_overlap out: fused kernels and the gradient sync
# behind the last backward, except paraplan's runtime, which runs PyTorch eager (no torch.compile) and
# all-reduces ZeRO-0/1 gradients after the step's backward passes (worker.runtime.data_parallel).
FRAMEWORK_EAGER_ELEMENTWISE = frozenset({"paraplan"})
FRAMEWORK_DP_SYNC_AFTER_BACKWARD = frozenset({"paraplan"})


class StackSpec(_Spec):
    """The software stack an estimate describes (``training.stack``). Defaults: today's mainstream stack,
    Megatron-core with fused attention, overlapped data-parallel gradient sync, the distributed optimizer and
    bf16. What each field means to the cost model (``solvers/cost_model/stack.py``):

    - ``attention``: "fused" (FlashAttention / cuDNN) keeps no s² scores and computes only the unmasked half of
      causal scores; "unfused" keeps them and computes all of them (the Megatron-LM of 2021). No shipped
      framework runs context parallelism on unfused kernels: the planner keeps cp = 1 on such a stack.
    - ``framework`` decides ``tp_comm_overlap``, ``elementwise`` and ``dp_overlap`` when they are not given, and
      what a layer's "selective" recompute is: Megatron's (the attention core recomputed), or on "torchtitan" its
      per-op policy (every other matmul's output kept, the rest recomputed with the elementwise ops;
      ``solvers/cost_model/memory.py``). "paraplan" is paraplan's own runtime (``worker.runtime``, what a run
      executes; ``solvers.run_layout.RUNTIME_STACK``): eager elementwise ops, no TP overlap, the ZeRO-0/1 gradient
      sync after the backward. ``framework_version`` is stated with the estimate and prices nothing by itself.
    - ``distributed_optimizer``: optimizer states (and at ZeRO-2/3 gradients and weights) may be sharded over
      data-parallel ranks; without it every layer runs ZeRO-0.
    - ``tp_comm_overlap``: how much tensor-parallel communication hides behind GEMMs: "none", "backward" (the
      input-gradient all-reduce behind the weight-gradient GEMMs), "full" (also the forward collectives behind
      the adjacent GEMMs, Transformer Engine's userbuffers).
    - ``dp_overlap``: the per-step gradient sync hides behind the last backward (else it is fully exposed);
      default: true, false on "paraplan".
    - ``fp8_recipe``: the FP8 scaling recipe of ``precision = "fp8"`` (default "delayed"): what the casts of
      every GEMM input cost in HBM traffic.
    - ``elementwise``: "fused" (Megatron's and Transformer Engine's fused kernels, torch.compile) or "eager"
      (PyTorch eager mode, each elementwise op its own kernel: torchtitan without torch.compile), which adds the
      HBM traffic of the unfused norms, rotary embeddings and SwiGLU (``solvers/cost_model/elementwise.py``);
      default: "fused", "eager" on "paraplan"."""

    attention: AttentionKernel = "fused"
    framework: Framework = "megatron-core"
    framework_version: str | None = Field(default=None, min_length=1, max_length=64)
    # strict: "yes" or 1 is no switch (lax validation read "false" as false and "no" as false, "yes" as true)
    distributed_optimizer: bool = Field(default=True, strict=True)
    tp_comm_overlap: TpCommOverlap | None = None
    dp_overlap: bool | None = Field(default=None, strict=True)
    fp8_recipe: Fp8Recipe | None = None
    elementwise: ElementwiseKernels | None = None

    @property
    def tp_overlap(self) -> TpCommOverlap:
        """The TP overlap the stack runs: the given one, else its framework's."""
        return self.tp_comm_overlap or FRAMEWORK_TP_OVERLAP[self.framework]

    @property
    def elementwise_kernels(self) -> ElementwiseKernels:
        """The elementwise kernels the stack runs: the given ones, else its framework's."""
        if self.elementwise is not None:
            return self.elementwise
        return "eager" if self.framework in FRAMEWORK_EAGER_ELEMENTWISE else "fused"

    @property
    def dp_sync_overlapped(self) -> bool:
        """Whether the per-step gradient sync hides behind the last backward: as given, else its framework's."""
        if self.dp_overlap is not None:
            return self.dp_overlap
        return self.framework not in FRAMEWORK_DP_SYNC_AFTER_BACKWARD


class TrainingSpec(_Spec):
    global_batch_size: int = Field(gt=0, le=MAX_GLOBAL_BATCH_SIZE)
    seq_length: int = Field(default=DEFAULT_SEQ_LENGTH, gt=0, le=MAX_SEQ_LENGTH)
    precision: Precision = "bf16"
    optimizer: Literal["adam", "adamw"] = "adam"
    stack: StackSpec = Field(default_factory=StackSpec)

    @field_validator("stack")
    @classmethod
    def _fp8_recipe_needs_fp8(cls, v: StackSpec, info: ValidationInfo) -> StackSpec:
        precision = info.data.get("precision")
        if v.fp8_recipe is not None and precision != "fp8":
            raise ValueError(f"fp8_recipe {v.fp8_recipe!r} is an FP8 scaling recipe and training.precision is "
                             f"{precision!r}: set precision to \"fp8\" or leave fp8_recipe out")
        return v

    @property
    def fp8_recipe(self) -> Fp8Recipe | None:
        """The FP8 scaling recipe priced: the stack's, Transformer Engine's default (delayed) for fp8, else none."""
        if self.precision != "fp8":
            return None
        return self.stack.fp8_recipe or "delayed"

    def priced_stack(self) -> StackSpec:
        """The stack with every default resolved, as estimates state it."""
        # built anew, so that every field counts as set and the result's JSON states all of them
        return StackSpec(**{**self.stack.model_dump(), "tp_comm_overlap": self.stack.tp_overlap,
                            "fp8_recipe": self.fp8_recipe, "elementwise": self.stack.elementwise_kernels,
                            "dp_overlap": self.stack.dp_sync_overlapped})


class Constraints(_Spec):
    """Planner limits. Unknown keys are rejected so typos surface."""

    memory_limit_gib: float | None = Field(default=None, ge=MIN_GIB, le=MAX_GIB)
    micro_batches: int | None = Field(default=None, gt=0)
    max_tp: int | None = Field(default=None, gt=0)
    max_pp: int | None = Field(default=None, gt=0)
    max_cp: int | None = Field(default=None, gt=0)
    schedule: Schedule | None = None
    # interleaved 1F1B: model chunks per GPU tried, 2..this (unset: 2; 1: no interleaving). More chunks shrink
    # the bubble of deep pipelines (Llama 3 405B ran 16 stages) and cost search time and p2p.
    max_virtual_stages: int | None = Field(default=None, gt=0)
    zero: int | None = Field(default=None, ge=0, le=3)
    # Sequence-parallel kind of every layer with tp > 1 ("none" = plain Megatron TP); unset = searched.
    sp: Literal["megatron", "ulysses", "none"] | None = None
    tp_across_nodes: bool = False
    allow_approximate: bool = False
    time_limit_s: float | None = Field(default=None, gt=0)
    seed: int = 0
    # the framework the plan is for: "paraplan" searches the whole space, a framework only the uniform plans it
    # runs exactly as planned (solvers.hybrid.targets)
    target: Target = "paraplan"

    @field_validator("max_virtual_stages")
    @classmethod
    def _interleaving_needs_chunks(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v == 1 and info.data.get("schedule") == "interleaved":
            raise ValueError("the interleaved schedule needs at least 2 virtual stages per GPU")
        return v


def requested_memory_gib(cluster: ClusterSpec, constraints: Constraints | None) -> float:
    """The per-GPU memory the request asks plans to keep within: its limit, else the GPU's memory."""
    if constraints and constraints.memory_limit_gib:
        return constraints.memory_limit_gib
    return cluster.gpu.memory_gib


def memory_limit_bytes(cluster: ClusterSpec, constraints: Constraints | None) -> float:
    """The memory a plan may use per GPU: the request's limit, never more than the GPU has (a plan sized for
    memory the device does not have would not start)."""
    return min(requested_memory_gib(cluster, constraints), cluster.gpu.memory_gib) * 2**30


def memory_limit_note(cluster: ClusterSpec, constraints: Constraints | None) -> str | None:
    """What an estimate says when the request's limit is above the GPU's memory (the limit used instead)."""
    asked, have = requested_memory_gib(cluster, constraints), cluster.gpu.memory_gib
    if asked <= have:
        return None
    return (f"constraints.memory_limit_gib = {asked:g} GiB is more than the {cluster.gpu.name}'s {have:.2f} GiB of "
            f"device memory: planned and estimated within {have:.2f} GiB")
