"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU or GELU MLP) of a plan's shape; with
``ModelConfig.moe`` every ``frequency``-th block's MLP is a mixture of experts (``moe.MoELayer``, whole here:
the plan's expert parallelism shards it afterwards).

Module names follow torchtitan's (``tok_embeddings``, ``layers.<i>.attention.wq`` ...) so that tensor-parallel
plans address them by name. ``layers`` is a ModuleDict keyed by the global layer index so a pipeline stage
keeps the names of the full model after the other layers are deleted.

The attention reads its local head count from the projected tensors, never from the config, so that the
same module runs unchanged after tensor parallelism shards the projections.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from solvers.specs import ModelSpec
from worker.runtime.moe import MoEConfig, MoELayer, is_expert_parameter
from worker.runtime.ring_attention import chunk_positions, ring_attention
from worker.runtime.ulysses import gather_heads_scatter_sequence, gather_sequence_scatter_heads


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    mlp: str = "swiglu"
    causal: bool = True
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    moe: MoEConfig | None = None

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> ModelConfig:
        moe = spec.moe
        return cls(
            num_layers=spec.num_layers,
            hidden_size=spec.hidden_size,
            num_heads=spec.num_attention_heads,
            num_kv_heads=spec.kv_heads,
            head_dim=spec.head_size,
            ffn_hidden_size=spec.ffn_size,
            vocab_size=spec.vocab_size,
            mlp=spec.mlp,
            causal=spec.causal,
            moe=None if moe is None else MoEConfig(
                num_experts=moe.num_experts, top_k=moe.top_k, ffn_hidden_size=spec.expert_ffn_size,
                capacity_factor=moe.capacity_factor, frequency=moe.moe_layer_frequency),
        )

    def is_moe_layer(self, index: int) -> bool:
        return self.moe is not None and self.moe.is_moe_layer(index)

    def layer_params(self, index: int = 0) -> int:
        """Parameters a token passes through in layer ``index`` (an MoE layer: its router and top_k experts)."""
        h, d = self.hidden_size, self.head_dim
        attention = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        mats = 3 if self.mlp == "swiglu" else 2
        if self.moe is not None and self.moe.is_moe_layer(index):
            mlp = self.moe.top_k * mats * h * self.moe.ffn_hidden_size + h * self.moe.num_experts
        else:
            mlp = mats * h * self.ffn_hidden_size
        return attention + mlp + 2 * h

    def flops_per_token(self, seq_length: int) -> float:
        """Model FLOPs per trained token (forward + backward, no recompute), PaLM's convention:
        6 x matmul parameters a token passes through (layers and LM head) + 12 x layers x attention width x
        sequence."""
        layers = sum(self.layer_params(i) for i in range(self.num_layers))
        matmul_params = layers + self.hidden_size * self.vocab_size
        attention = 12 * self.num_layers * self.num_heads * self.head_dim * seq_length
        return 6.0 * matmul_params + attention


def rotary(x: torch.Tensor, theta: float, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary position embedding of x (batch, seq, heads, head_dim) for ``positions`` (default 0..seq-1)."""
    seq, dim = x.shape[1], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    angles = torch.outer(positions.to(device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


def segment_positions(segments: Sequence[int], device: torch.device) -> torch.Tensor:
    """Positions of a packed sequence whose pieces have the lengths ``segments``: each piece restarts at 0."""
    return torch.cat([torch.arange(n, device=device) for n in segments])


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[int],
                     causal: bool) -> torch.Tensor:
    """Attention of a packed sequence (b, heads, seq, d) whose pieces of lengths ``segments`` never attend to each
    other (block-diagonal, causal within a piece: what flash-attention's varlen kernels compute)."""
    gqa = k.shape[1] != q.shape[1]
    outs = [F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=gqa)
            for qs, ks, vs in zip(*(t.split(list(segments), dim=2) for t in (q, k, v)), strict=True)]
    return torch.cat(outs, dim=2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.head_dim, self.causal, self.rope_theta = d, cfg.causal, cfg.rope_theta
        self.wq = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.wk = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.wv = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.wo = nn.Linear(cfg.num_heads * d, h, bias=False)
        # Set by worker.runtime.ulysses: a process group over which the sequence is split.
        self.sequence_group: torch.distributed.ProcessGroup | None = None
        # Set by worker.runtime.ring_attention: the cp group; this rank holds two load-balanced chunks.
        self.context_group: torch.distributed.ProcessGroup | None = None

    def forward(self, x: torch.Tensor, segments: Sequence[int] | None = None) -> torch.Tensor:
        """``segments``: x is a packed sequence of pieces of these lengths (over the whole sequence, before any
        Ulysses split): positions restart and attention stays within each piece."""
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        b, s = q.shape[0], q.shape[1]
        q, k, v = (t.reshape(b, s, -1, self.head_dim) for t in (q, k, v))
        if self.sequence_group is not None:
            q, k, v = (gather_sequence_scatter_heads(t, self.sequence_group) for t in (q, k, v))
        # RoPE after the Ulysses exchange: every rank then holds whole sequences (of its cp chunks), so the
        # positions are global; under context parallelism they are those of the rank's chunks.
        group = self.context_group
        assert segments is None or group is None, "packed sequences do not run under ring attention"
        positions = None if group is None else chunk_positions(q.shape[1], dist.get_rank(group),
                                                               dist.get_world_size(group), q.device)
        if segments is not None:
            positions = segment_positions(segments, q.device)
        q, k = rotary(q, self.rope_theta, positions), rotary(k, self.rope_theta, positions)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if group is not None:
            out = ring_attention(q, k, v, group, causal=self.causal)
        elif segments is not None:
            out = varlen_attention(q, k, v, segments, self.causal)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                                 enable_gqa=k.shape[1] != q.shape[1])
        out = out.transpose(1, 2)
        if self.sequence_group is not None:
            out = gather_heads_scatter_sequence(out, self.sequence_group)
        return self.wo(out.reshape(out.shape[0], out.shape[1], -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gated = cfg.mlp == "swiglu"
        self.w1 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False) if self.gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int = 0) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        moe = cfg.moe
        self.feed_forward: nn.Module = (
            MoELayer(cfg.hidden_size, moe.ffn_hidden_size, moe.num_experts, moe.top_k, cfg.mlp == "swiglu",
                     moe.capacity_factor) if moe is not None and moe.is_moe_layer(index) else FeedForward(cfg))

    def forward(self, x: torch.Tensor, segments: Sequence[int] | None = None) -> torch.Tensor:
        # (without segments, the one-argument call a recompute wrapper of the attention takes)
        a = self.attention_norm(x)
        h = x + (self.attention(a) if segments is None else self.attention(a, segments))
        return h + self.feed_forward(self.ffn_norm(h))


class Decoder(nn.Module):
    """Embedding -> blocks -> norm -> LM head. A pipeline stage sets the parts it does not own to None."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleDict({str(i): Block(cfg, i) for i in range(cfg.num_layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.output: nn.Linear | None = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # Small, depth-scaled init keeps the untrained loss near ln(vocab) for any shape.
        std = 0.02
        for name, p in self.named_parameters():
            if ".feed_forward.router." in name or is_expert_parameter(name):
                continue  # MoE layers keep their own init (see moe.Experts)
            if p.dim() == 1:
                p.fill_(1.0)
            elif name.endswith(("wo.weight", "w2.weight")):
                p.normal_(0.0, std / (2 * max(1, self.cfg.num_layers)) ** 0.5)
            else:
                p.normal_(0.0, std)

    def forward(self, x: torch.Tensor, segments: Sequence[int] | None = None) -> torch.Tensor:
        """``segments``: x is one packed sequence of pieces of these lengths (``Attention.forward``)."""
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h) if segments is None else layer(h, segments)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def blocks(model: nn.Module) -> nn.ModuleDict:
    """The transformer blocks of a Decoder or of a pipeline stage cut from one, keyed by global index."""
    layers = model.get_submodule("layers")
    assert isinstance(layers, nn.ModuleDict)
    return layers


def build_model(cfg: ModelConfig, seed: int, device: torch.device | str = "cpu") -> Decoder:
    """The full model, identical on every rank for the same seed (parallelisms shard it afterwards)."""
    torch.manual_seed(seed)
    with torch.device(device):
        return Decoder(cfg)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the tokens given."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
