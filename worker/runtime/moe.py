"""A mixture-of-experts feed-forward layer with expert parallelism (drop-in for ``model.FeedForward``).

Per forward, on each rank of the expert-parallel group (``ep`` ranks, ``num_experts / ep`` experts each):
0. with ``token_group`` (attention under tensor parallelism without sequence parallelism leaves every rank of
   that group the same tokens) each rank keeps its 1/tp of the tokens, and the outputs are gathered back at
   the end, so that no token is routed twice;
1. the router picks ``top_k`` experts per token (Mixtral's gating: softmax over the top-k logits);
2. token copies are sorted by expert; with a capacity factor, copies beyond an expert's capacity in their
   routing group are dropped (their token keeps only the block's residual path, as in Switch/GShard);
3. a ``compression`` may replace the rows bound for each expert by fewer rows (LSH-MoE, ``lsh.py``);
4. per-expert row counts are exchanged first (an all-to-all of ``ep * local_experts`` integers), so that
   both data all-to-alls know their variable splits;
5. dispatch all-to-all, local experts run on rows grouped by expert, combine all-to-all back. With expert
   tensor parallelism (``etp_group``: each expert's MLP split over ``etp`` ranks, Megatron's ETP) the rows a
   rank received are first gathered from the ranks of its ETP group, each rank computes its slice of every
   expert's MLP for all of them, and the partial outputs are reduce-scattered back to the rows' owners;
6. the compression restores one output per token copy, outputs are weighted by the gate and summed.

A routing group is what one forward routes on one rank: capacity and compression act within it. A rank's
group is its tokens of one micro-batch; a single-process layer with ``routing_groups = G`` splits its tokens
into G equal consecutive groups and routes each on its own, which is what G such ranks compute together.

Both all-to-alls are autograd functions (the backward of an all-to-all is the all-to-all with the splits
swapped), so gradients reach the experts on other ranks and the router. ``stats`` accumulates the bytes
sent off-rank (with and without compression) and the wall time spent in all-to-alls.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoEConfig:
    """The MoE layers of a model (``solvers.specs.MoESpec``): every ``frequency``-th layer."""

    num_experts: int
    top_k: int
    ffn_hidden_size: int  # one expert's MLP width
    capacity_factor: float | None = None  # None: no token is dropped
    frequency: int = 1

    def is_moe_layer(self, index: int) -> bool:
        return (index + 1) % self.frequency == 0


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


def _all_gather_rows(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts)


class _KeepOwnRows(torch.autograd.Function):
    """Forward: this rank's 1/n of the rows, which every rank of ``group`` holds alike. Backward: the gradients
    of every rank's rows gathered (each rank's rows reach the loss only through that rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        if x.shape[0] % n:
            raise ValueError(f"{x.shape[0]} tokens do not split evenly over {n} tensor-parallel ranks")
        size = x.shape[0] // n
        return x[rank * size:(rank + 1) * size].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather_rows(grad, ctx.group), None


class _GatherRows(torch.autograd.Function):
    """Forward: every rank's rows, concatenated in rank order. Backward: this rank's slice (what follows runs
    replicated on every rank of ``group``, so the incoming gradient is the same on all of them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.size = group, x.shape[0]
        return _all_gather_rows(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        rank = dist.get_rank(ctx.group)
        return grad[rank * ctx.size:(rank + 1) * ctx.size].contiguous(), None


def keep_own_rows(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out: torch.Tensor = _KeepOwnRows.apply(x, group)
    return out


def gather_rows(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    out: torch.Tensor = _GatherRows.apply(x, group)
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


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class Experts(nn.Module):
    """``count`` expert MLPs stored as stacked weights (gelu: w1, w2; swiglu: w1, w3 gated, w2).

    ``grad_scale`` multiplies the weights' gradients (set by expert parallelism, whose gradient reduction
    averages over the ranks holding the same experts while an expert's gradient sums their tokens')."""

    def __init__(self, count: int, hidden: int, ffn: int, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        self.grad_scale = 1.0
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
        w1, w2, w3 = self.w1, self.w2, self.w3
        if self.grad_scale != 1.0:
            w1, w2 = _ScaleGrad.apply(w1, self.grad_scale), _ScaleGrad.apply(w2, self.grad_scale)
            w3 = _ScaleGrad.apply(w3, self.grad_scale) if w3 is not None else None
        outs = []
        for e, chunk in enumerate(torch.split(rows, counts)):
            a = chunk @ w1[e]
            a = F.silu(a) * (chunk @ w3[e]) if w3 is not None else F.gelu(a)
            outs.append(a @ w2[e])
        return torch.cat(outs) if outs else rows.new_zeros((0, rows.shape[1]))


@dataclass
class _Routed:
    rows: torch.Tensor  # kept token copies, sorted by expert
    expert: torch.Tensor  # their experts
    token: torch.Tensor  # which token each copy came from
    weight: torch.Tensor  # its gate weight


class MoELayer(nn.Module):
    """Top-k MoE feed-forward over (..., hidden) inputs; expert parallel over ``group``, each expert's MLP split
    over ``etp_group``, tokens replicated over ``token_group`` routed once (see the module's docstring)."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int = 2, gated: bool = True,
                 capacity_factor: float | None = None, group: dist.ProcessGroup | None = None, *,
                 etp_group: dist.ProcessGroup | None = None, token_group: dist.ProcessGroup | None = None,
                 routing_groups: int = 1) -> None:
        super().__init__()
        ep = dist.get_world_size(group) if group is not None else 1
        etp = dist.get_world_size(etp_group) if etp_group is not None else 1
        if num_experts % ep:
            raise ValueError(f"num_experts ({num_experts}) must be a multiple of the expert-parallel size ({ep})")
        if ffn % etp:
            raise ValueError(f"the expert FFN width ({ffn}) must be a multiple of the expert-TP size ({etp})")
        self.hidden, self.ffn, self.num_experts, self.top_k = hidden, ffn, num_experts, top_k
        self.capacity_factor, self.group, self.ep = capacity_factor, group, ep
        self.etp_group, self.etp, self.token_group, self.routing_groups = etp_group, etp, token_group, routing_groups
        self.ep_rank = dist.get_rank(group) if group is not None else 0
        self.etp_rank = dist.get_rank(etp_group) if etp_group is not None else 0
        self.router = Router(hidden, num_experts, top_k)
        # A shard's parameters are named after it, so that a checkpoint keeps every shard: ranks holding the same
        # shard (expert data parallelism) share the names, others do not.
        self.experts_name = "experts" if ep == etp == 1 else f"experts_ep{self.ep_rank}of{ep}_etp{self.etp_rank}of{etp}"
        self.add_module(self.experts_name, Experts(num_experts // ep, hidden, ffn // etp, gated))
        self.compression: Compression | None = None
        self.stats = AllToAllStats()
        self.dropped_copies = 0  # token copies over capacity, over all forwards

    @property
    def experts(self) -> Experts:
        experts = self._modules.get(self.__dict__.get("experts_name", ""))
        if not isinstance(experts, Experts):  # (while nn.Module registers it: hasattr() must see none)
            raise AttributeError("experts")
        return experts

    @classmethod
    def sharded_from(cls, full: MoELayer, group: dist.ProcessGroup | None,
                     etp_group: dist.ProcessGroup | None = None,
                     token_group: dist.ProcessGroup | None = None) -> MoELayer:
        """This rank's shard of a full (single-process) layer: the same router; its experts (``group``), and of
        each its slice of the MLP's hidden units (``etp_group``)."""
        w = full.experts
        with torch.random.fork_rng(devices=[]):  # the shard's own init is overwritten: leave the RNG as it was
            layer = cls(full.hidden, full.ffn, full.num_experts, full.top_k, w.gated, full.capacity_factor, group,
                        etp_group=etp_group, token_group=token_group)
        layer.to(w.w1.device)
        lo, n = layer.ep_rank * layer.experts.count, layer.experts.count
        width = full.ffn // layer.etp
        cols = slice(layer.etp_rank * width, (layer.etp_rank + 1) * width)
        with torch.no_grad():
            layer.router.gate.weight.copy_(full.router.gate.weight)
            for name in ("w1", "w2", "w3"):
                src, dst = getattr(w, name), getattr(layer.experts, name)
                if dst is not None:  # w1, w3: (expert, hidden, ffn); w2: (expert, ffn, hidden)
                    dst.copy_(src[lo:lo + n, :, cols] if name != "w2" else src[lo:lo + n, cols, :])
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
            self.dropped_copies += int(expert.numel() - int(keep.sum()))
            expert, token, weight = expert[keep], token[keep], weight[keep]
        return _Routed(tokens[token], expert, token, weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):  # Megatron SP hands the sub-layer its sequence shard as a DTensor
            x = x.to_local()
        tokens = x.reshape(-1, self.hidden)
        if self.token_group is not None:
            tokens = keep_own_rows(tokens, self.token_group)
        if self.routing_groups > 1:
            if tokens.shape[0] % self.routing_groups:
                raise ValueError(f"{tokens.shape[0]} tokens do not split into {self.routing_groups} routing groups")
            out = torch.cat([self._moe(group) for group in tokens.chunk(self.routing_groups)])
        else:
            out = self._moe(tokens)
        if self.token_group is not None:
            out = gather_rows(out, self.token_group)
        return out.reshape(x.shape)

    def _moe(self, tokens: torch.Tensor) -> torch.Tensor:
        """One routing group: route (capacity), compress, run the experts wherever they are, combine."""
        r = self._route(tokens)
        packed = (self.compression.compress if self.compression is not None else _identity)(
            r.rows, r.expert, self.num_experts)
        raw_counts = torch.bincount(r.expert, minlength=self.num_experts)
        y = self._experts_everywhere(packed.rows, packed.counts, raw_counts)
        return tokens.new_zeros(tokens.shape).index_add(0, r.token, packed.restore(y) * r.weight[:, None])

    def _experts_everywhere(self, rows: torch.Tensor, counts: torch.Tensor, raw_counts: torch.Tensor) -> torch.Tensor:
        """Expert outputs for ``rows`` (grouped by global expert, ``counts`` per expert), wherever they live."""
        ep, local = self.ep, self.experts.count
        if self.group is None:
            return self._local_experts(rows, counts.view(1, local))
        # counts first: every rank learns how many rows per local expert each source sends
        recv_counts = torch.empty_like(counts)
        _timed_all_to_all(recv_counts, counts, None, None, self.group, self.stats)
        send = counts.view(ep, local).sum(1).tolist()
        recv_by = recv_counts.view(ep, local)  # [source rank, local expert]
        raw_send = raw_counts.view(ep, local).sum(1).tolist()
        self._account(rows, send, raw_send, counts.numel() * counts.element_size())
        got = all_to_all(rows, send, recv_by.sum(1).tolist(), self.group, self.stats)
        y = self._local_experts(got, recv_by)
        return all_to_all(y, recv_by.sum(1).tolist(), send, self.group, self.stats)

    def _local_experts(self, got: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
        """This rank's experts on ``got``: rows in chunks (source, local expert), ``chunks[s, e]`` rows each."""
        local, mine = self.experts.count, got.shape[0]
        sizes: list[int] = []
        if self.etp_group is not None:  # gather the ETP group's rows: every rank runs its MLP slice on all of them
            peers = [torch.empty_like(chunks) for _ in range(self.etp)]
            dist.all_gather(peers, chunks.contiguous(), group=self.etp_group)
            sizes = [int(p.sum()) for p in peers]
            got = all_to_all(got.repeat(self.etp, 1), [mine] * self.etp, sizes, self.etp_group, self.stats)
            chunks = torch.cat(peers)
        # rows arrive grouped by (source, expert); the experts want them by (expert, source)
        chunk_expert = torch.arange(local, device=got.device).repeat(chunks.shape[0])
        by_expert = torch.argsort(torch.repeat_interleave(chunk_expert, chunks.reshape(-1)), stable=True)
        y = torch.empty_like(got).index_copy(0, by_expert, self.experts(got[by_expert], chunks.sum(0).tolist()))
        if self.etp_group is None:
            return y
        # partial sums over the MLP's hidden units: reduce-scatter them back to the rows' owners
        parts = all_to_all(y, sizes, [mine] * self.etp, self.etp_group, self.stats)
        return parts.view(self.etp, mine, -1).sum(0)

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


_EXPERT_PARAMETER = re.compile(r"(^|\.)experts(_ep\d+of\d+_etp\d+of\d+)?\.")


def is_expert_parameter(name: str) -> bool:
    """Expert weights live on one rank of the expert-parallel group: they are not averaged with the others."""
    return _EXPERT_PARAMETER.search(name) is not None
