"""The dimensions of one transformer layer that the time and memory formulas need, as plain numbers."""

from __future__ import annotations

from dataclasses import dataclass

from solvers.specs import ModelSpec


@dataclass(frozen=True, slots=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # FFN width of the dense MLP, or of one expert in an MoE layer
    gated: bool  # SwiGLU-style MLP: three matrices, two of them on the input side
    params: int  # weights of the whole layer (all experts)
    expert_params: int  # weights that live in experts (sharded over ep); 0 for dense layers
    num_experts: int = 1
    top_k: int = 1
    attention_dropout: bool = True  # the attention probabilities go through dropout (p > 0)
    hidden_dropout: bool = True  # the attention and MLP outputs do

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def mlp_in_width(self) -> int:
        """Output width of the MLP's input-side matrices (gate and up are fused for SwiGLU)."""
        return (2 if self.gated else 1) * self.ffn


def layer_shape(model: ModelSpec, index: int) -> LayerShape:
    moe = model.is_moe_layer(index)
    assert model.moe is not None or not moe
    ffn = model.expert_ffn_size if moe else model.ffn_size
    experts = model.moe.num_experts if (moe and model.moe) else 1
    return LayerShape(
        hidden=model.hidden_size,
        heads=model.num_attention_heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_size,
        ffn=ffn,
        gated=model.mlp == "swiglu",
        params=model.layer_params(index),
        expert_params=experts * model.mlp_params(ffn) if moe else 0,
        num_experts=experts,
        top_k=model.moe.top_k if (moe and model.moe) else 1,
        attention_dropout=model.attention_dropout > 0,
        hidden_dropout=model.hidden_dropout > 0,
    )
