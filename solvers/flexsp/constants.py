"""The constants of FlexSP's cost model, taken explicitly or derived from the model and cluster specs.

The cost of one sequence of ``s`` tokens on a Ulysses sequence-parallel group of ``d`` GPUs is

    T(s, d) = (alpha1 * s**2 + alpha2 * s) / d  +  comm_mb_per_token * s / d / v_d      [ms]

plus ``beta`` once per group per micro-batch. ``comm_mb_per_token`` is 16·L·h/2²⁰: four all-to-alls
(q, k, v, out) forward and four backward of bf16 activations of ``h`` per token per layer. A GPU holds
``floor((memory − model states) / activation_mb_per_token)`` tokens of activations.

The explicit form is the reference's (FlexSP, Galvatron ``flexsp`` branch), fitted on A100s; the derived
form computes the same quantities from a ModelSpec and ClusterSpec with the efficiencies stated below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from solvers.specs import ClusterSpec, ModelSpec, Precision

MB = float(2**20)

# Fractions of the GPU's dense peak reached in practice (stated, not fitted): large GEMMs of a
# ZeRO-3 step, and FlashAttention's s² part (fwd+bwd, causal).
LINEAR_EFFICIENCY = 0.6
ATTENTION_EFFICIENCY = 0.45
# NCCL all-to-all reaches about this fraction of the link bandwidth (Ulysses on NVLink / IB).
ALLTOALL_EFFICIENCY = 0.7
# ZeRO-3 gathers parameters for forward and backward and reduce-scatters gradients once per
# micro-batch; prefetching overlaps about half of it with compute on long sequences.
ZERO3_EXPOSED_FRACTION = 0.5
# Launch and framework overhead per micro-batch per layer (kernel launches, allocator, hooks).
FIXED_MS_PER_LAYER = 2.0


@dataclass(frozen=True)
class FlexSPConstants:
    alpha1_ms_per_token2: float
    alpha2_ms_per_token: float
    beta_ms: float
    comm_mb_per_token: float
    alltoall_GBps_by_group_size: Mapping[int, float]
    activation_mb_per_token: float
    model_states_mb_per_gpu: float
    memory_limit_mb: float
    num_gpus: int
    gpus_per_node: int
    source: str = "explicit"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def token_capacity_per_gpu(self) -> int:
        """Tokens of activations one GPU holds after its share of the model states."""
        free = self.memory_limit_mb - self.model_states_mb_per_gpu
        return max(0, math.floor(free / self.activation_mb_per_token + 1e-9))

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "alpha1_ms_per_token2": self.alpha1_ms_per_token2,
            "alpha2_ms_per_token": self.alpha2_ms_per_token,
            "beta_ms": self.beta_ms,
            "comm_mb_per_token": self.comm_mb_per_token,
            "alltoall_GBps_by_group_size": {str(k): v for k, v in sorted(self.alltoall_GBps_by_group_size.items())},
            "activation_mb_per_token": self.activation_mb_per_token,
            "model_states_mb_per_gpu": self.model_states_mb_per_gpu,
            "memory_limit_mb": self.memory_limit_mb,
            "token_capacity_per_gpu": self.token_capacity_per_gpu,
            "notes": list(self.notes),
        }


def tiling_sizes(num_gpus: int, gpus_per_node: int) -> list[int]:
    """SP degrees whose groups tile the cluster as contiguous node-aligned blocks, ascending: powers of
    two that divide a node, and node multiples ``gpus_per_node · 2^k``. Placed largest first, each block
    starts at a multiple of its own size, so no block smaller than a node straddles two."""
    sizes = {d for d in (2**k for k in range(num_gpus.bit_length())) if d <= num_gpus and gpus_per_node % d == 0}
    d = gpus_per_node
    while d <= num_gpus:
        sizes.add(d)
        d *= 2
    return sorted(sizes)


def zero_state_fraction(zero: int, num_gpus: int) -> float:
    """Fraction of the 16 bytes/param of mixed-precision Adam states one GPU keeps under ZeRO-`zero`.

    bf16 params (2) + bf16 grads (2) + fp32 master/momentum/variance (12): ZeRO-1 shards the 12,
    ZeRO-2 also the grads, ZeRO-3 everything.
    """
    n = num_gpus
    return {0: 1.0, 1: (4 + 12 / n) / 16, 2: (2 + 14 / n) / 16, 3: 1.0 / n}[zero]


def comm_mb_per_token(model: ModelSpec) -> float:
    """All-to-all MB per token of a sequence (before dividing by the SP degree), fwd+bwd, bf16."""
    return 16.0 * model.num_layers * model.hidden_size / MB


def explicit_constants(
    form: Mapping[str, Any], model: ModelSpec, cluster: ClusterSpec, memory_limit_gib: float, zero: int
) -> FlexSPConstants:
    """The contract's ``cost_model.kind = "flexsp"`` form (fields already validated)."""
    n = cluster.num_gpus
    bandwidth = {int(k): float(v) for k, v in form["alltoall_GBps_by_group_size"].items()}
    return FlexSPConstants(
        alpha1_ms_per_token2=float(form["alpha1_ms_per_token2"]),
        alpha2_ms_per_token=float(form["alpha2_ms_per_token"]),
        beta_ms=float(form["beta_ms"]),
        comm_mb_per_token=comm_mb_per_token(model),
        alltoall_GBps_by_group_size=bandwidth,
        activation_mb_per_token=float(form["activation_mb_per_token"]),
        # The reference counts params_billion·16 "GB" of states at 1024 MB each.
        model_states_mb_per_gpu=float(form["params_billion"]) * 16 * 1024 * zero_state_fraction(zero, n),
        memory_limit_mb=memory_limit_gib * 1024,
        num_gpus=n,
        gpus_per_node=cluster.gpus_per_node,
        source="explicit",
    )


def activation_bytes_per_token(model: ModelSpec) -> float:
    """Activations kept for backward per token, all layers, bf16, FlashAttention (no s² scores).

    Korthikanti et al. count 34·h bytes per token per layer for a GPT layer (ffn = 4h) without the
    attention-score term: attention 11h, MLP 19h, layer norms 4h. The MLP part generalises to
    3h + 4·ffn (gelu: input, fc1 output, gelu output, dropout mask) and 3h + 6·ffn (swiglu: gate, up, and
    their product). Grouped-query attention keeps smaller k and v.
    """
    h, f = model.hidden_size, model.expert_ffn_size if model.moe else model.ffn_size
    kv = model.kv_heads * model.head_size
    attention = 2 * h + 2 * h + 2 * 2 * kv + 2 * h + h + 2 * h  # input, q, k+v, context, mask, out-proj in
    mlp = 3 * h + (6 if model.mlp == "swiglu" else 4) * f
    if model.moe is not None:
        mlp *= model.moe.top_k
    return float(model.num_layers * (attention + mlp + 4 * h))


def linear_flops_per_token(model: ModelSpec) -> float:
    """Training FLOPs per token of the weight matmuls (fwd 2·params, bwd 4·params), active params only."""
    per_layer = model.attention_params()
    if model.moe is not None:
        per_layer += model.moe.top_k * model.mlp_params(model.expert_ffn_size)
    else:
        per_layer += model.mlp_params()
    head = model.vocab_size * model.hidden_size
    return 6.0 * (model.num_layers * per_layer + head)


def attention_flops_per_token2(model: ModelSpec) -> float:
    """Training FLOPs of the s² part per (token)²: QKᵀ and AV, 2·2·heads·head_dim each way, ×3 for bwd."""
    width = model.num_attention_heads * model.head_size
    causal = 0.5 if model.causal else 1.0
    return 3.0 * 4.0 * width * model.num_layers * causal


def alltoall_GBps(d: int, cluster: ClusterSpec) -> float:
    """Effective all-to-all bandwidth of a group of ``d`` contiguous, node-aligned GPUs (GB/s per GPU).

    Each GPU sends (d−1)/d of its data over NVLink; when the group spans nodes, (d−g)/d of it leaves the
    node over the GPU's share of the NICs. The slower of the two paths decides.
    """
    if d <= 1:
        return math.inf
    g = cluster.gpus_per_node
    intra = (d - 1) / d / cluster.intra_GBps
    inter = (d - g) / d / cluster.inter_GBps_per_gpu if d > g else 0.0
    return ALLTOALL_EFFICIENCY / max(intra, inter)


def derived_constants(
    model: ModelSpec, cluster: ClusterSpec, precision: Precision, memory_limit_gib: float, zero: int
) -> FlexSPConstants:
    """Constants for any model and cluster, from the specs and the efficiencies stated above."""
    n = cluster.num_gpus
    peak = cluster.gpu.peak_flops(precision, ("precision",))
    params = model.total_params()
    # ZeRO-3: all-gather params for fwd and bwd, reduce-scatter grads, 2 bytes each, once per micro-batch.
    zero_bytes = 3 * 2 * params * (n - 1) / n if zero == 3 else 0.0
    ring_GBps = cluster.inter_GBps_per_gpu if cluster.nodes > 1 else cluster.intra_GBps
    zero_ms = 1e3 * zero_bytes / (ring_GBps * 1e9) * ZERO3_EXPOSED_FRACTION
    sizes = [d for d in tiling_sizes(n, cluster.gpus_per_node) if d > 1]
    return FlexSPConstants(
        alpha1_ms_per_token2=1e3 * attention_flops_per_token2(model) / (peak * ATTENTION_EFFICIENCY),
        alpha2_ms_per_token=1e3 * linear_flops_per_token(model) / (peak * LINEAR_EFFICIENCY),
        beta_ms=zero_ms + FIXED_MS_PER_LAYER * model.num_layers,
        comm_mb_per_token=comm_mb_per_token(model),
        alltoall_GBps_by_group_size={d: alltoall_GBps(d, cluster) for d in sizes},
        activation_mb_per_token=activation_bytes_per_token(model) / MB,
        model_states_mb_per_gpu=16.0 * params * zero_state_fraction(zero, n) / MB,
        memory_limit_mb=memory_limit_gib * 1024,
        num_gpus=n,
        gpus_per_node=cluster.gpus_per_node,
        source="derived",
        notes=(
            f"linear GEMMs at {LINEAR_EFFICIENCY:.0%} and attention at {ATTENTION_EFFICIENCY:.0%} of "
            f"{peak / 1e12:.0f} TFLOP/s; all-to-all at {ALLTOALL_EFFICIENCY:.0%} of link bandwidth; "
            f"{ZERO3_EXPOSED_FRACTION:.0%} of ZeRO-3 traffic exposed per micro-batch",
        ),
    )
