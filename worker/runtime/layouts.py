"""Activations re-laid out between neighbouring layers whose layouts differ (as Galvatron's runtime does between
layers of different TP / DP groups).

Between two transformer layers the residual stream of one micro-batch is a (rows, sequence, hidden) tensor; a
layout (``solvers.run_layout.LayerLayout``) says which block of it each rank of the pipeline stage holds:

- rows: the ``dp`` ranks take equal consecutive shares of the micro-batch's rows (``dp_rank``-th share);
- sequence: cp rank ``i`` takes chunks ``i`` and ``2cp - 1 - i`` of ``2cp`` (ring attention's load-balanced
  split); of those two, concatenated, the ``tp`` ranks take consecutive shares under Megatron SP and Ulysses, and
  all (copies, identical on every tp rank) under plain TP;
- hidden: always whole.

``relayout`` moves one micro-batch's activation from layout A to layout B with one all-to-all over the stage: each
rank sends every other rank the part of its block that the other needs (a copy held by several ranks is sent by
one of them only), e.g. tp2 x dp2 -> tp4 gathers the other dp rank's rows; tp4 -> dp4 keeps a quarter of the rows
and sends nothing; Megatron SP -> Ulysses over the same ranks is local. Its backward is the same exchange from B
back to A, scaled by ``data_ranks(A) / data_ranks(B)``, because of how each layout's gradients are scaled:

Each rank computes the mean loss of its own tokens, so the gradient a layer's rank holds for its activation is
the gradient of the global loss times the number of ranks that split the tokens among them (``data_ranks``: dp,
cp, and the Ulysses ranks; tp ranks of plain TP hold the whole gradient of their copies). A layer averages its
weight gradients over those same ranks, which gives the exact gradient; moving to a layout with another
``data_ranks`` rescales the activation gradient so that this holds for every layer.

The pure part (``blocks``, ``pieces``) decides who holds and sends what; ``relayout`` does the exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from solvers.run_layout import LayerLayout
from worker.runtime.model import blocks

Span = tuple[int, int]  # [start, stop) along one dimension of the micro-batch's activation


@dataclass(frozen=True)
class Block:
    """The part of a micro-batch's activation one rank holds: a range of rows, sequence ranges (concatenated in
    this order in the local tensor), and which copy it is among the ranks holding the same part."""

    rows: Span
    seq: tuple[Span, ...]
    copy: int
    copies: int


def _share(total: int, parts: int, index: int) -> Span:
    size = total // parts
    return index * size, (index + 1) * size


def _context_chunks(seq: int, cp_rank: int, cp: int) -> tuple[Span, ...]:
    """The sequence ranges cp rank ``cp_rank`` holds, in local order (``ring_attention.shard_sequence``)."""
    if cp == 1:
        return ((0, seq),)
    return _share(seq, 2 * cp, cp_rank), _share(seq, 2 * cp, 2 * cp - 1 - cp_rank)


def _slice(ranges: tuple[Span, ...], start: int, stop: int) -> tuple[Span, ...]:
    """Local positions [start, stop) of a tensor holding ``ranges`` back to global ranges."""
    out, offset = [], 0
    for a, b in ranges:
        lo, hi = max(start, offset), min(stop, offset + b - a)
        if lo < hi:
            out.append((a + lo - offset, a + hi - offset))
        offset += b - a
    return tuple(out)


def block_of(layout: LayerLayout, rank: int, rows: int, seq: int) -> Block:
    """What local rank ``rank`` of the stage holds under ``layout`` of a (rows, seq, ...) micro-batch activation."""
    tp_rank = rank % layout.tp
    cp_rank = rank // layout.tp % layout.cp
    dp_rank = rank // (layout.tp * layout.cp)
    chunks = _context_chunks(seq, cp_rank, layout.cp)
    if layout.sp is not None:  # Megatron SP or Ulysses: the tp ranks split the cp rank's chunks
        local = seq // layout.cp
        return Block(_share(rows, layout.dp, dp_rank), _slice(chunks, *_share(local, layout.tp, tp_rank)), 0, 1)
    return Block(_share(rows, layout.dp, dp_rank), chunks, tp_rank, layout.tp)


def _overlap(a: Span, b: Span) -> Span | None:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def pieces(src: Block, dst: Block, dst_rank: int) -> list[tuple[Span, Span]]:
    """(rows, seq) global ranges that the rank holding ``src`` sends the rank ``dst_rank`` holding ``dst``, in
    the order both sides pack them. Of the ranks holding the same copy, only copy ``dst_rank % copies`` sends."""
    if src.copy != dst_rank % src.copies:
        return []
    rows = _overlap(src.rows, dst.rows)
    if rows is None:
        return []
    return [(rows, s) for d in dst.seq for a in src.seq if (s := _overlap(a, d)) is not None]


def _local(block: Block, rows: Span, seq: Span) -> tuple[slice, slice]:
    """Where the global (rows, seq) range lies in the local tensor of ``block`` (it lies in one of its ranges)."""
    offset = 0
    for a, b in block.seq:
        if a <= seq[0] and seq[1] <= b:
            return (slice(rows[0] - block.rows[0], rows[1] - block.rows[0]),
                    slice(offset + seq[0] - a, offset + seq[1] - a))
        offset += b - a
    raise ValueError(f"{seq} is not inside {block.seq}")


@dataclass(frozen=True)
class Exchange:
    """What one rank sends to and receives from every rank of the stage to go from one layout to another."""

    src: Block  # this rank's block before
    dst: Block  # and after
    send: tuple[tuple[tuple[Span, Span], ...], ...]  # per destination rank
    recv: tuple[tuple[tuple[Span, Span], ...], ...]  # per source rank
    local: bool  # no rank of the stage sends another anything: each slices its own block


@cache
def exchange_plan(src: LayerLayout, dst: LayerLayout, rank: int, world: int, rows: int, seq: int) -> Exchange:
    """The exchange of local rank ``rank`` (of ``world``) for a (rows, seq, ...) micro-batch activation."""
    before = [block_of(src, r, rows, seq) for r in range(world)]
    after = [block_of(dst, r, rows, seq) for r in range(world)]
    local = all(not pieces(before[i], after[j], j) for i in range(world) for j in range(world) if i != j)
    return Exchange(before[rank], after[rank],
                    tuple(tuple(pieces(before[rank], after[j], j)) for j in range(world)),
                    tuple(tuple(pieces(before[i], after[rank], rank)) for i in range(world)), local)


def _exchange(x: torch.Tensor, plan: Exchange, group: dist.ProcessGroup) -> torch.Tensor:
    dst = plan.dst
    out = x.new_empty((dst.rows[1] - dst.rows[0], sum(b - a for a, b in dst.seq), *x.shape[2:]))
    if plan.local:  # every piece comes from this rank's own block
        for rows, seq in plan.recv[dist.get_rank(group)]:
            out[_local(dst, rows, seq)] = x[_local(plan.src, rows, seq)]
        return out
    inner = math.prod(x.shape[2:])  # elements per (row, position)

    def numel(part: tuple[tuple[Span, Span], ...]) -> int:
        return sum((rows[1] - rows[0]) * (seq[1] - seq[0]) * inner for rows, seq in part)

    send = [x[_local(plan.src, rows, seq)].reshape(-1) for to in plan.send for rows, seq in to]
    flat_in = torch.cat(send) if send else x.new_empty(0)
    in_splits, out_splits = [numel(to) for to in plan.send], [numel(frm) for frm in plan.recv]
    flat_out = x.new_empty(sum(out_splits))
    dist.all_to_all_single(flat_out, flat_in, out_splits, in_splits, group=group)
    pos = 0
    for frm in plan.recv:
        for rows, seq in frm:
            where = _local(dst, rows, seq)
            n = out[where].numel()
            out[where] = flat_out[pos:pos + n].view_as(out[where])
            pos += n
    return out


class _Relayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, src: LayerLayout, dst: LayerLayout, group: dist.ProcessGroup
                ) -> torch.Tensor:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        rows, seq = x.shape[0] * src.dp, x.shape[1] * src.cp * (src.tp if src.sp is not None else 1)
        ctx.backward_plan = exchange_plan(dst, src, rank, world, rows, seq)
        ctx.group, ctx.scale = group, src.data_ranks / dst.data_ranks
        return _exchange(x, exchange_plan(src, dst, rank, world, rows, seq), group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out = _exchange(grad.contiguous(), ctx.backward_plan, ctx.group)
        return (out * ctx.scale if ctx.scale != 1 else out), None, None, None


def activation_layout(layout: LayerLayout) -> tuple[int, int, int, bool]:
    """What of a layout decides who holds which activations (not its ZeRO stage, nor TP vs Ulysses)."""
    return layout.dp, layout.cp, layout.tp, layout.sp is not None


def relayout(x: torch.Tensor, src: LayerLayout, dst: LayerLayout, group: dist.ProcessGroup) -> torch.Tensor:
    """This rank's part of a micro-batch activation laid out as ``src`` -> its part under ``dst`` (differentiable;
    ``group``: the ranks of this pipeline stage, in local rank order)."""
    if activation_layout(src) == activation_layout(dst) and src.data_ranks == dst.data_ranks:
        return x
    out: torch.Tensor = _Relayout.apply(x, src, dst, group)
    return out


def apply_relayouts(model: nn.Module, layers: tuple[LayerLayout, ...], embedding: LayerLayout, head: LayerLayout,
                    group: dist.ProcessGroup) -> None:
    """Re-lay out the input of every block of ``model`` (a Decoder or a pipeline stage cut from one) from the
    previous layer's layout (the embedding's for layer 0, whichever stage ran it) to its own, and the input of the
    final norm from the last layer's to the LM head's: forward pre-hooks, placed first, so they run before
    the hooks tensor parallelism puts on the same modules (sequence-parallel norms take the local shard)."""
    for key, block in blocks(model).items():
        i = int(key)
        block.register_forward_pre_hook(_hook(layers[i - 1] if i else embedding, layers[i], group), prepend=True)
    norm = getattr(model, "norm", None)
    if norm is not None:
        norm.register_forward_pre_hook(_hook(layers[-1], head, group), prepend=True)


def _hook(src: LayerLayout, dst: LayerLayout, group: dist.ProcessGroup) -> Any:
    def pre_hook(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (relayout(args[0], src, dst, group), *args[1:])

    return pre_hook
