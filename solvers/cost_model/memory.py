"""Memory per GPU: model states by ZeRO stage, activations by recompute mode, SP and CP.

Model states (mixed-precision Adam, Rajbhandari et al.): per parameter 2 bytes of weights, 2 of
gradients and 12 of optimizer states (fp32 master weights, momentum, variance); fp32 training keeps 4 + 4
+ 8. ZeRO-1 shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the weights, over the
layer's data-parallel group.

Activations (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"), per
layer for s tokens, b samples, h hidden, a heads, t tensor-parallel ranks, with 2-byte elements and
1-byte dropout masks:
- no recompute: s b h (10 + 24/t + 5 a s / (h t)); with sequence parallelism s b h / t (34 + 5 a s / h)
- selective (attention core recomputed): the 5 a s^2 b term goes
- full: only the layer input, 2 s b h (/ t with sequence parallelism)
Written per tensor so that GQA, SwiGLU, other FFN widths and MoE follow: 10 s b h is what tensor
parallelism replicates (two LayerNorm inputs, the QKV and MLP inputs, two dropout masks), the rest is
split over t. Ulysses splits everything over its group, context parallelism over cp.
Without dropout (p = 0: PyTorch returns the input, no mask, no copy) the masks go and the attention core
keeps only the softmax output, 2 a s^2 b: 32 s b h + 2 a s^2 b for the GPT layer above. A SwiGLU MLP keeps its
gate, up projection and their product where its elementwise ops are fused, and silu's output besides where they run
eagerly (``training.stack.elementwise = "eager"``, the worker's runtime).

torchtitan's selective checkpointing is a per-op policy instead (``per_op``; its ``selective_ac_option = "op"``):
of a layer's forward it keeps the attention kernel's output and every other matmul's output, in the order the
layer runs them (Llama: q, v, w1, w2 of q, k, v, o, w1, w3, w2), and recomputes the rest in backward, elementwise
ops included. Kept: the layer input, those outputs (split over t as their weights are; the last matmul's output
is a partial sum, whole on each rank) and, under sequence parallelism, the outputs of the two reduce-scatters
that end the attention and the MLP blocks (2 s b h / t: its save list names ``reduce_scatter_tensor``). An MoE
layer's experts run as grouped GEMMs, which the policy does not save: all recomputed, none of their outputs kept
(the expert-parallel all-to-alls' outputs it keeps are the MoE terms', ``AnalyticCostModel``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.cost_model.shapes import LayerShape
from solvers.specs import Precision

ArrayLike = np.ndarray | float

# sp kinds and recompute modes as integer codes for vectorised formulas
SP_NONE, SP_MEGATRON, SP_ULYSSES = 0, 1, 2
RC_NONE, RC_SELECTIVE, RC_FULL = 0, 1, 2


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of weights, gradients and optimizer states."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def state_bytes_per_param(precision: Precision) -> StateBytes:
    if precision == "fp32":
        return StateBytes(4.0, 4.0, 8.0)
    return StateBytes(2.0, 2.0, 12.0)


def model_state_bytes(params: ArrayLike, dp: ArrayLike, zero: ArrayLike, per: StateBytes
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, gradients, optimizer) bytes per GPU for ``params`` parameters held by this rank before
    ZeRO sharding over ``dp`` ranks."""
    p, dp, zero = (np.asarray(x, dtype=float) for x in (params, dp, zero))
    w = p * per.params / np.where(zero >= 3, dp, 1.0)
    g = p * per.grads / np.where(zero >= 2, dp, 1.0)
    o = p * per.optimizer / np.where(zero >= 1, dp, 1.0)
    return w, g, o


@dataclass(frozen=True)
class ActivationTerms:
    """Per-token activation elements of one layer, grouped by how they shrink under parallelism."""

    replicated: float  # elements per token kept whole on every tensor-parallel rank unless SP
    replicated_masks: float  # of which 1-byte masks
    split: float  # elements per token split over tensor-parallel ranks
    core_per_seq_token: float  # attention-core bytes per query per key: softmax 2a (+ mask a, dropout 2a)
    core_masks: float
    layer_input: float  # what full recompute keeps (the layer input)
    per_op_split: float  # what the per-op policy keeps besides the input, split over t: attention output, matmuls
    per_op_whole: float  # ... and whole on each tensor-parallel rank: the last matmul's output (a partial sum)
    per_op_scattered: float  # ... and under sequence parallelism the two blocks' reduce-scatter outputs, split over t


def activation_terms(shape: LayerShape, eager: bool = False) -> ActivationTerms:
    h = shape.hidden
    # gelu keeps the activation's input and output; swiglu the gate, the up projection and their product, and run
    # eagerly (silu, then the multiply: two kernels) also silu's output, which the multiply's backward reads and a
    # fused kernel recomputes
    mlp = ((4 if eager else 3) if shape.gated else 2) * shape.ffn * shape.top_k
    masks = 2.0 * h if shape.hidden_dropout else 0.0  # after the attention projection and after the MLP
    # softmax output (what the probabilities-times-V GEMM reads); dropout adds its mask and output
    core, core_masks = (5.0, 1.0) if shape.attention_dropout else (2.0, 0.0)
    # the matmuls' outputs in the order they run (width, split over t); the per-op policy keeps the odd ones. An MoE
    # layer's experts run as grouped GEMMs (torch._grouped_mm), which its save list does not name: none kept
    ffn = shape.ffn * shape.top_k
    mlp_outputs = [] if shape.is_moe else (
        [(ffn, True), (ffn, True), (h, False)] if shape.gated else [(ffn, True), (h, False)])
    matmuls = [(shape.q_width, True), (shape.kv_width, True), (shape.kv_width, True), (h, False), *mlp_outputs]
    saved = matmuls[::2]
    return ActivationTerms(
        replicated=8.0 * h + masks,
        replicated_masks=masks,
        split=4.0 * shape.q_width + 4.0 * shape.kv_width + 2.0 * mlp,  # Q, K, V, out-proj input, MLP
        core_per_seq_token=core * shape.heads,
        core_masks=core_masks * shape.heads,
        layer_input=2.0 * h,
        per_op_split=2.0 * shape.q_width + sum(2.0 * w for w, split in saved if split),
        per_op_whole=sum(2.0 * w for w, split in saved if not split),
        per_op_scattered=2.0 * 2 * h,
    )


def _bytes(elements: ArrayLike, masks: ArrayLike, elem_bytes: float) -> np.ndarray:
    """Bytes of tensors counted at 2 bytes per element, masks at 1, rescaled to ``elem_bytes``."""
    elements, masks = np.asarray(elements, dtype=float), np.asarray(masks, dtype=float)
    return (elements - masks) * elem_bytes / 2.0 + masks


def activation_bytes(shape: LayerShape, seq: int, samples: ArrayLike, tp: ArrayLike, cp: ArrayLike,
                     sp: ArrayLike, recompute: ArrayLike, elem_bytes: float = 2.0, flash: bool = False,
                     per_op: bool = False, eager: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(kept per micro-batch, transient during backward) activation bytes per GPU for one layer.

    ``samples`` is the micro-batch per data-parallel rank; ``seq`` the full sequence (split over cp).
    With ``flash`` the attention core keeps only softmax statistics (negligible) instead of 5 a s^2 b.
    With ``per_op`` selective recompute is torchtitan's per-op policy (module docstring), else Megatron's. With
    ``eager`` the elementwise ops run as separate kernels (``training.stack.elementwise``) and keep what a fused
    kernel does not (``activation_terms``).
    """
    samples, tp, cp, sp, recompute = (np.asarray(x, dtype=float) for x in (samples, tp, cp, sp, recompute))
    t = activation_terms(shape, eager)
    tokens = samples * seq / cp  # tokens this rank's sequence slice holds
    sharded = sp != SP_NONE
    repl_div = np.where(sharded, tp, 1.0)
    repl = _bytes(t.replicated, t.replicated_masks, elem_bytes) / repl_div
    split = _bytes(t.split, 0.0, elem_bytes) / tp
    core = 0.0 if flash else _bytes(t.core_per_seq_token, t.core_masks, elem_bytes) * seq / tp
    none = tokens * (repl + split + core)
    full = tokens * _bytes(t.layer_input, 0.0, elem_bytes) / repl_div
    if per_op:  # (Ulysses splits the tokens of every tensor over its group, the partial sum's too)
        scattered = np.where((sp == SP_MEGATRON) & (tp > 1), _bytes(t.per_op_scattered, 0.0, elem_bytes) / tp, 0.0)
        selective = full + tokens * (_bytes(t.per_op_split, 0.0, elem_bytes) / tp
                                     + _bytes(t.per_op_whole, 0.0, elem_bytes) / np.where(sp == SP_ULYSSES, tp, 1.0)
                                     + scattered)
    else:
        selective = tokens * (repl + split)
    kept = np.where(recompute == RC_FULL, full, np.where(recompute == RC_SELECTIVE, selective, none))
    # what is rebuilt during backward lives only while that layer's backward runs
    transient = np.where(recompute == RC_FULL, none, np.where(recompute == RC_SELECTIVE, none - selective, 0.0))
    return kept, transient
