"""A mixture-of-experts feed-forward layer with expert parallelism (drop-in for ``model.FeedForward``).

Per forward, on each rank of the expert-parallel group (``ep`` ranks, ``num_experts / ep`` experts each):
1. the router picks ``top_k`` experts per token (Mixtral's gating: softmax over the top-k logits);
2. token copies are sorted by expert; with a capacity factor, copies beyond an expert's capacity on this
   rank are dropped (their token keeps only the block's residual path, as in Switch/GShard);
3. a ``compression`` may replace the rows bound for each expert by fewer rows (LSH-MoE, ``lsh.py``);
4. per-expert row counts are exchanged first (an all-to-all of ``ep * local_experts`` integers), so that
   both data all-to-alls know their variable splits;
5. dispatch all-to-all, local experts run on rows grouped by expert, combine all-to-all back;
6. the compression restores one output per token copy, outputs are weighted by the gate and summed.

Both all-to-alls are autograd functions (the backward of an all-to-all is the all-to-all with the splits
swapped), so gradients reach the experts on other ranks and the router. ``stats`` accumulates the bytes
sent off-rank (with and without compression) and the wall time spent in all-to-alls.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class AllToAllStats:
    """Accumulated over forwards (backward all-to-alls are timed too; bytes count forward traffic, which the
    backward mirrors exactly)."""

    bytes_sent: int = 0  # off-rank bytes actually sent (rows after compression + the count exchange)
    bytes_uncompressed: int = 0  # off-rank bytes the same forwards would send without compression
    seconds: float = 0.0  # wall time inside all_to_all_single, forward and backward
    calls: int = 0

    @property
    def compression_rate(self) -> float:
        """Bytes sent / bytes uncompressed (1.0 without compression)."""
        return self.bytes_sent / self.bytes_uncompressed if self.bytes_uncompressed else 1.0

    def reset(self) -> None:
        self.bytes_sent = self.bytes_uncompressed = self.calls = 0
        self.seconds = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"alltoall_bytes_sent": float(self.bytes_sent), "alltoall_bytes_uncompressed":
                float(self.bytes_uncompressed), "alltoall_compression_rate": self.compression_rate,
                "alltoall_s": self.seconds, "alltoall_calls": float(self.calls)}


def _timed_all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int] | None,
                      in_splits: list[int] | None, group: dist.ProcessGroup, stats: AllToAllStats | None) -> None:
    t0 = time.perf_counter()
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)
    if stats is not None:
        stats.seconds += time.perf_counter() - t0
        stats.calls += 1


class _AllToAll(torch.autograd.Function):
    """Rows ``x`` split by ``in_splits`` over the group's ranks; returns what the others sent us."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, in_splits: list[int], out_splits: list[int],
                group: dist.ProcessGroup, stats: AllToAllStats | None) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.stats = (in_splits, out_splits), group, stats
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        _timed_all_to_all(out, x.contiguous(), out_splits, in_splits, group, stats)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        in_splits, out_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        _timed_all_to_all(back, grad.contiguous(), in_splits, out_splits, ctx.group, ctx.stats)
        return back, None, None, None, None


def all_to_all(x: torch.Tensor, in_splits: list[int], out_splits: list[int], group: dist.ProcessGroup,
               stats: AllToAllStats | None = None) -> torch.Tensor:
    out: torch.Tensor = _AllToAll.apply(x, in_splits, out_splits, group, stats)
    return out


@dataclass
class Compressed:
    """Rows to send (grouped by expert, ascending) and how to get one output per original row back."""

    rows: torch.Tensor
    counts: torch.Tensor  # rows per expert (num_experts,)
    restore: Callable[[torch.Tensor], torch.Tensor]  # outputs of ``rows`` -> outputs of the original rows


class Compression(Protocol):
    def compress(self, rows: torch.Tensor, expert: torch.Tensor, num_experts: int) -> Compressed:
        """``rows`` sorted by ``expert`` (ascending)."""
        ...


def _identity(rows: torch.Tensor, expert: torch.Tensor, num_experts: int) -> Compressed:
    return Compressed(rows, torch.bincount(expert, minlength=num_experts), lambda y: y)


class Router(nn.Module):
    """Top-k gating; weights are a softmax over the chosen experts' logits (Mixtral)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, num_experts, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(tokens)
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        return F.softmax(top.float(), dim=-1).type_as(tokens), idx


class Experts(nn.Module):
    """``count`` expert MLPs stored as stacked weights (gelu: w1, w2; swiglu: w1, w3 gated, w2)."""

    def __init__(self, count: int, hidden: int, ffn: int, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        self.w1 = nn.Parameter(torch.empty(count, hidden, ffn))
        self.w2 = nn.Parameter(torch.empty(count, ffn, hidden))
        self.w3 = nn.Parameter(torch.empty(count, hidden, ffn)) if gated else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # nn.Linear's default: uniform in +-1/sqrt(fan_in)
        for w in (self.w1, self.w2, self.w3):
            if w is not None:
                bound = 1.0 / math.sqrt(w.shape[1])
                w.uniform_(-bound, bound)

    @property
    def count(self) -> int:
        return int(self.w1.shape[0])

    def forward(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """``rows`` grouped by local expert, ``counts[e]`` rows for expert e."""
        outs = []
        for e, chunk in enumerate(torch.split(rows, counts)):
            a = chunk @ self.w1[e]
            a = F.silu(a) * (chunk @ self.w3[e]) if self.w3 is not None else F.gelu(a)
            outs.append(a @ self.w2[e])
        return torch.cat(outs) if outs else rows.new_zeros((0, rows.shape[1]))


@dataclass
class _Routed:
    rows: torch.Tensor  # kept token copies, sorted by expert
    expert: torch.Tensor  # their experts
    token: torch.Tensor  # which token each copy came from
    weight: torch.Tensor  # its gate weight


class MoELayer(nn.Module):
    """Top-k MoE feed-forward over (..., hidden) inputs; expert parallel when ``group`` is set."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int = 2, gated: bool = True,
                 capacity_factor: float | None = None, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        ep = dist.get_world_size(group) if group is not None else 1
        if num_experts % ep:
            raise ValueError(f"num_experts ({num_experts}) must be a multiple of the expert-parallel size ({ep})")
        self.hidden, self.num_experts, self.top_k = hidden, num_experts, top_k
        self.capacity_factor, self.group, self.ep = capacity_factor, group, ep
        self.ep_rank = dist.get_rank(group) if group is not None else 0
        self.router = Router(hidden, num_experts, top_k)
        self.experts = Experts(num_experts // ep, hidden, ffn, gated)
        self.compression: Compression | None = None
        self.stats = AllToAllStats()

    @classmethod
    def sharded_from(cls, full: MoELayer, group: dist.ProcessGroup | None) -> MoELayer:
        """This rank's expert-parallel shard of a full (single-process) layer: same router, its experts."""
        w = full.experts
        layer = cls(full.hidden, w.w1.shape[2], full.num_experts, full.top_k, w.gated, full.capacity_factor, group)
        lo = layer.ep_rank * layer.experts.count
        with torch.no_grad():
            layer.router.gate.weight.copy_(full.router.gate.weight)
            for name in ("w1", "w2", "w3"):
                src, dst = getattr(w, name), getattr(layer.experts, name)
                if dst is not None:
                    dst.copy_(src[lo:lo + layer.experts.count])
        return layer

    def _route(self, tokens: torch.Tensor) -> _Routed:
        weight, idx = self.router(tokens)
        expert = idx.reshape(-1)
        order = torch.argsort(expert, stable=True)
        expert, token, weight = expert[order], order // self.top_k, weight.reshape(-1)[order]
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * tokens.shape[0] * self.top_k / self.num_experts)
            counts = torch.bincount(expert, minlength=self.num_experts)
            start = torch.cumsum(counts, 0) - counts
            keep = torch.arange(expert.numel(), device=expert.device) - start[expert] < capacity
            expert, token, weight = expert[keep], token[keep], weight[keep]
        return _Routed(tokens[token], expert, token, weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, self.hidden)
        r = self._route(tokens)
        packed = (self.compression.compress if self.compression is not None else _identity)(
            r.rows, r.expert, self.num_experts)
        raw_counts = torch.bincount(r.expert, minlength=self.num_experts)
        y = self._experts_everywhere(packed.rows, packed.counts, raw_counts)
        out = tokens.new_zeros(tokens.shape).index_add(0, r.token, packed.restore(y) * r.weight[:, None])
        return out.reshape(x.shape)

    def _experts_everywhere(self, rows: torch.Tensor, counts: torch.Tensor, raw_counts: torch.Tensor) -> torch.Tensor:
        """Expert outputs for ``rows`` (grouped by global expert, ``counts`` per expert), wherever they live."""
        if self.group is None:
            return self.experts(rows, counts.tolist())
        ep, local = self.ep, self.experts.count
        # counts first: every rank learns how many rows per local expert each source sends
        recv_counts = torch.empty_like(counts)
        _timed_all_to_all(recv_counts, counts, None, None, self.group, self.stats)
        send = counts.view(ep, local).sum(1).tolist()
        recv_by = recv_counts.view(ep, local)  # [source rank, local expert]
        raw_send = raw_counts.view(ep, local).sum(1).tolist()
        self._account(rows, send, raw_send, counts.numel() * counts.element_size())
        got = all_to_all(rows, send, recv_by.sum(1).tolist(), self.group, self.stats)
        # rows arrive grouped by (source, expert); the experts want them by (expert, source)
        chunk_expert = torch.arange(local, device=rows.device).repeat(ep)
        by_expert = torch.argsort(torch.repeat_interleave(chunk_expert, recv_by.reshape(-1)), stable=True)
        y = torch.empty_like(got).index_copy(0, by_expert, self.experts(got[by_expert], recv_by.sum(0).tolist()))
        return all_to_all(y, recv_by.sum(1).tolist(), send, self.group, self.stats)

    def _account(self, rows: torch.Tensor, send: list[int], raw_send: list[int], count_bytes: int) -> None:
        """Off-rank bytes of both data all-to-alls (dispatch and combine move the same rows) and of the count
        exchange; ``raw_send`` is what each rank would get without compression."""
        row_bytes = rows.shape[1] * rows.element_size()
        remote = sum(send) - send[self.ep_rank]
        raw_remote = sum(raw_send) - raw_send[self.ep_rank]
        counts_remote = count_bytes * (self.ep - 1) // self.ep
        self.stats.bytes_sent += 2 * remote * row_bytes + counts_remote
        self.stats.bytes_uncompressed += 2 * raw_remote * row_bytes + counts_remote
        log.debug("moe all-to-all: %d rows off-rank (%d uncompressed), compression rate so far %.3f, %.4f s",
                  remote, raw_remote, self.stats.compression_rate, self.stats.seconds)


def moe_layers(model: nn.Module) -> list[MoELayer]:
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def log_stats(model: nn.Module) -> dict[str, float]:
    """Sum of the MoE layers' all-to-all stats (and log them): what a run reports."""
    total = AllToAllStats()
    for m in moe_layers(model):
        total.bytes_sent += m.stats.bytes_sent
        total.bytes_uncompressed += m.stats.bytes_uncompressed
        total.seconds += m.stats.seconds
        total.calls += m.stats.calls
    log.info("moe all-to-all: compression rate %.3f (%d / %d bytes), %.3f s in %d calls", total.compression_rate,
             total.bytes_sent, total.bytes_uncompressed, total.seconds, total.calls)
    return total.as_dict()


def use_moe(model: nn.Module, num_experts: int, top_k: int = 2, group: dist.ProcessGroup | None = None,
            frequency: int = 1, capacity_factor: float | None = None, seed: int = 0) -> list[MoELayer]:
    """Replace the feed-forward of every ``frequency``-th block of a ``model.Decoder`` by an MoE layer (the
    spec's ``moe_layer_frequency`` convention). Each layer is drawn whole from ``seed`` and then sharded, so
    every rank holds its part of the same model whatever the expert-parallel size."""
    from worker.runtime.model import FeedForward, blocks

    out = []
    for key, block in blocks(model).items():
        ffn = block.get_submodule("feed_forward")
        if not isinstance(ffn, FeedForward) or (int(key) + 1) % frequency:
            continue
        torch.manual_seed(seed * 7919 + int(key))
        full = MoELayer(ffn.w1.in_features, ffn.w1.out_features, num_experts, top_k, ffn.gated, capacity_factor)
        layer = MoELayer.sharded_from(full, group) if group is not None else full
        block.feed_forward = layer
        out.append(layer)
    return out


def is_expert_parameter(name: str) -> bool:
    """Expert weights live on one rank of the expert-parallel group: they are not averaged with the others."""
    return ".experts." in name or name.startswith("experts.")
