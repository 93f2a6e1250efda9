"""Floating-point work of a transformer layer: matrix multiplies and the attention core.

Counts are multiply-adds x 2. The attention core (QK^T and AV) is counted over the full s x s score
matrix, as non-fused kernels execute it and as Megatron's FLOP formula counts it; with a fused causal
(flash) kernel only about half of it runs, which ``causal_fraction`` expresses.
"""

from __future__ import annotations

from solvers.cost_model.shapes import LayerShape, layer_shape
from solvers.specs import ModelSpec, TrainingSpec


def _mlp_flops_per_token(shape: LayerShape) -> float:
    """Forward FLOPs per token of the MLP (an MoE layer: its top_k experts and the router)."""
    h = shape.hidden
    mlp = 2 * h * (shape.mlp_in_width + shape.ffn) * shape.top_k
    router = 2 * h * shape.num_experts if shape.is_moe else 0
    return float(mlp + router)


def gemm_flops_per_token(shape: LayerShape) -> float:
    """Forward matmul FLOPs per token outside the attention core (QKV, output, MLP, router)."""
    h = shape.hidden
    qkv = 2 * h * (shape.q_width + 2 * shape.kv_width)
    out = 2 * shape.q_width * h
    return float(qkv + out) + _mlp_flops_per_token(shape)


def expert_gemm_flops_per_token(shape: LayerShape) -> float:
    """The part of ``gemm_flops_per_token`` an MoE layer spends in its experts and router (0 for a dense layer)."""
    return _mlp_flops_per_token(shape) if shape.is_moe else 0.0


def attention_core_flops(shape: LayerShape, seq: int, causal_fraction: float = 1.0) -> float:
    """Forward FLOPs of QK^T and AV for one sequence of ``seq`` tokens."""
    return 4.0 * seq * seq * shape.q_width * causal_fraction


def layer_forward_flops(shape: LayerShape, seq: int, causal_fraction: float = 1.0) -> float:
    """Forward FLOPs of one layer for one sample."""
    return seq * gemm_flops_per_token(shape) + attention_core_flops(shape, seq, causal_fraction)


def head_forward_flops(model: ModelSpec, seq: int) -> float:
    """Forward FLOPs of the LM head (logits over the vocabulary) for one sample."""
    return 2.0 * seq * model.hidden_size * model.vocab_size


def model_flops_per_step(model: ModelSpec, training: TrainingSpec, causal_fraction: float = 1.0) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward, no recomputation): MFU's numerator."""
    s = training.seq_length
    fwd = sum(layer_forward_flops(layer_shape(model, i), s, causal_fraction) for i in range(model.num_layers))
    fwd += head_forward_flops(model, s)
    return 3.0 * fwd * training.global_batch_size


def megatron_sc21_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs per iteration as Narayanan et al. (SC21) count them, with full activation recomputation."""
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
