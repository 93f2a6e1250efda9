"""Context parallelism: causal ring attention over a cp process group, with load-balanced sequence chunks.

The sequence is cut into ``2 * cp`` equal chunks and cp rank ``i`` holds chunks ``i`` and ``2cp - 1 - i`` (as
Megatron/TransformerEngine's CP and torchtitan do): under a causal mask every rank then has the same amount of
attention work. Keys and values travel round the ring (rank ``r`` sends to ``r + 1``), so at ring step ``j`` rank
``r`` holds the K/V of rank ``src = r - j``, and by chunk order:

- ``j = 0`` (its own K/V): causal within the two chunks (the late chunk sees all of the early one);
- ``src < r``: every local query sees the early K/V chunk ``src`` whole and nothing of the late one;
- ``src > r``: only the late query chunk ``2cp - 1 - r`` sees anything, and it sees both K/V chunks whole.

So each step after the first computes exactly half a block, unmasked. The partial results are merged exactly
with their log-sum-exp (``out = sum_j exp(lse_j - lse) * out_j``, ``lse = logaddexp_j lse_j``).

Backward is a second ring (``_RingAttention.backward``): scores are recomputed per block from the saved
log-sum-exp (as flash attention does), ``dq`` stays local, and each K/V block's ``dk``/``dv`` travel with it and
come home after a last hop. Communication is ``torch.distributed`` P2P (``batch_isend_irecv``), so it runs on gloo
CPU ranks as on NCCL; the next block's exchange is in flight while the current one is computed.

Grouped-query attention works on the K/V heads as they are (query head ``h`` reads K/V head ``h // group``, as
``scaled_dot_product_attention(enable_gqa=True)``): K/V are never expanded, neither in memory nor on the wire.
Rotary embeddings must use each token's global position: ``chunk_positions``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def chunk_positions(local_length: int, cp_rank: int, cp: int, device: torch.device | None = None) -> torch.Tensor:
    """Global positions of the ``local_length`` tokens cp rank ``cp_rank`` holds (its chunks ``r`` and
    ``2cp - 1 - r`` of a sequence of ``local_length * cp`` tokens)."""
    if local_length % 2:
        raise ValueError(f"a cp rank holds two equal chunks: {local_length} tokens is odd")
    c = local_length // 2
    late = 2 * cp - 1 - cp_rank
    return torch.cat([torch.arange(cp_rank * c, (cp_rank + 1) * c, device=device),
                      torch.arange(late * c, (late + 1) * c, device=device)])


def shard_sequence(x: torch.Tensor, dim: int, cp_rank: int, cp: int) -> torch.Tensor:
    """Cp rank ``cp_rank``'s load-balanced part of ``x`` along ``dim``: chunks ``r`` and ``2cp - 1 - r`` of
    ``2 * cp``, concatenated (the inverse of ``unshard_sequence``)."""
    if cp == 1:
        return x
    if x.shape[dim] % (2 * cp):
        raise ValueError(f"a sequence of {x.shape[dim]} is not divisible into 2*cp = {2 * cp} chunks")
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]], dim=dim).contiguous()


def unshard_sequence(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The whole sequence from every cp rank's part (``parts[r]`` from rank ``r``), in token order."""
    cp = len(parts)
    halves = [p.chunk(2, dim=dim) for p in parts]
    return torch.cat([halves[i][0] for i in range(cp)] + [halves[i][1] for i in reversed(range(cp))], dim=dim)


# --- block math (plain tensors, no autograd: _RingAttention differentiates by hand) -------------------------
# Queries are kept as (b, kv_heads, group, s, d) so that a K/V block (b, kv_heads, s, d) broadcasts over the
# query heads that share it.

def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    s = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)).float() * scale
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def _block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of queries ``q`` over one K/V block, in fp32; every query row must see at least one key."""
    s = _scores(q, k, scale, mask)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.matmul(p.to(v.dtype), v.unsqueeze(2)).float(), lse


def _merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold one block's softmax-normalised result into the running one, in place (exact: log-sum-exp weights)."""
    new = torch.logaddexp(lse, block_lse)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(block_out * torch.exp(block_lse - new).unsqueeze(-1))
    lse.copy_(new)


def _block_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
                    delta: torch.Tensor, scale: float, mask: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one block given the final ``lse`` and ``delta = rowsum(dout * out)`` (fp32)."""
    p = torch.exp(_scores(q, k, scale, mask) - lse.unsqueeze(-1))  # the block's share of the final softmax
    dv = torch.matmul(p.transpose(-1, -2), dout).sum(2)
    dp = torch.matmul(dout, v.unsqueeze(2).float().transpose(-1, -2))
    ds = p * (dp - delta.unsqueeze(-1))
    dq = torch.matmul(ds, k.unsqueeze(2).float()) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q.float()).sum(2) * scale
    return dq, dk, dv


def _own_block_mask(local_length: int, device: torch.device) -> torch.Tensor:
    """Step 0 (a rank's own chunks ``r < 2cp-1-r``): causal in each chunk, the late chunk sees the early one."""
    c = local_length // 2
    pos = torch.cat([torch.arange(c, device=device), torch.arange(c, device=device) + local_length])
    return pos[:, None] >= pos[None, :]


# --- the ring ------------------------------------------------------------------------------------------------

class _Ring:
    """Sends to the next cp rank and receives from the previous one (group ranks), one tensor per step."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group, self.rank, self.size = group, dist.get_rank(group), dist.get_world_size(group)
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size

    def shift(self, x: torch.Tensor, tag: int = 0) -> tuple[torch.Tensor, list[dist.Work]]:
        """Start passing ``x`` on; returns the buffer the previous rank's tensor arrives in and the requests."""
        recv = torch.empty_like(x)
        ops = [dist.P2POp(dist.isend, x, group=self.group, tag=tag, group_peer=self.next),
               dist.P2POp(dist.irecv, recv, group=self.group, tag=tag, group_peer=self.prev)]
        return recv, dist.batch_isend_irecv(ops)

    def source(self, step: int) -> int:
        """The rank whose K/V this rank holds at ring step ``step``."""
        return (self.rank - step) % self.size


def _wait(reqs: list[dist.Work]) -> None:
    for req in reqs:
        req.wait()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                causal: bool) -> torch.Tensor:
        b, heads, s, d = q.shape
        kv_heads = k.shape[1]
        scale = 1.0 / math.sqrt(d)
        ring = _Ring(group)
        qg = q.reshape(b, kv_heads, heads // kv_heads, s, d)
        c = s // 2
        kv = torch.stack([k, v]).contiguous()  # one message per step
        out = torch.empty(qg.shape, dtype=torch.float32, device=q.device)
        lse = torch.empty(qg.shape[:-1], dtype=torch.float32, device=q.device)
        for step in range(ring.size):
            reqs: list[dist.Work] = []
            if step + 1 < ring.size:
                incoming, reqs = ring.shift(kv)
            src = ring.source(step)
            bk, bv = kv[0], kv[1]
            if step == 0:
                mask = _own_block_mask(s, q.device) if causal else None
                out[:], lse[:] = _block_forward(qg, bk, bv, scale, mask)
            elif not causal:
                _merge(out, lse, *_block_forward(qg, bk, bv, scale, None))
            elif src < ring.rank:  # all queries, the early K/V chunk only
                _merge(out, lse, *_block_forward(qg, bk[:, :, :c], bv[:, :, :c], scale, None))
            else:  # the late query chunk, both K/V chunks
                _merge(out[..., c:, :], lse[..., c:], *_block_forward(qg[..., c:, :], bk, bv, scale, None))
            if reqs:
                _wait(reqs)
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal = group, causal
        return out.to(q.dtype).reshape(b, heads, s, d)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        b, heads, s, d = q.shape
        kv_heads = k.shape[1]
        scale = 1.0 / math.sqrt(d)
        ring = _Ring(ctx.group)
        c = s // 2
        qg = q.reshape(b, kv_heads, heads // kv_heads, s, d)
        dout = grad.float().reshape(qg.shape)
        delta = (dout * out).sum(-1)
        dq = torch.zeros(qg.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        # The gradient of the K/V block in hand travels with it: 0 = dk, 1 = dv.
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        for step in range(ring.size):
            kv_reqs: list[dist.Work] = []
            if step + 1 < ring.size:
                kv_next, kv_reqs = ring.shift(kv)
            src = ring.source(step)
            bk, bv = kv[0], kv[1]
            if step == 0 or not ctx.causal:
                mask = _own_block_mask(s, q.device) if ctx.causal else None
                gq, gk, gv = _block_backward(dout, qg, bk, bv, lse, delta, scale, mask)
                dq += gq
                dkv[0] += gk
                dkv[1] += gv
            elif src < ring.rank:
                gq, gk, gv = _block_backward(dout, qg, bk[:, :, :c], bv[:, :, :c], lse, delta, scale, None)
                dq += gq
                dkv[0, :, :, :c] += gk
                dkv[1, :, :, :c] += gv
            else:
                gq, gk, gv = _block_backward(dout[..., c:, :], qg[..., c:, :], bk, bv, lse[..., c:],
                                             delta[..., c:], scale, None)
                dq[..., c:, :] += gq
                dkv[0] += gk
                dkv[1] += gv
            # Pass the block's gradient on with the block; after the last step this hop brings it home. Its own
            # tag: gloo matches messages between two ranks by tag, and this one overlaps the K/V exchange.
            dkv, dkv_reqs = ring.shift(dkv, tag=1)
            _wait(kv_reqs + dkv_reqs)
            if kv_reqs:
                kv = kv_next
        dq_out = dq.to(q.dtype).reshape(b, heads, s, d)
        return dq_out, dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup,
                   causal: bool = True) -> torch.Tensor:
    """Attention of this cp rank's queries over the whole sequence's keys, ``scaled_dot_product_attention``'s
    layout: q (batch, heads, s, d), k and v (batch, kv_heads, s, d) with ``heads % kv_heads == 0``, where ``s``
    is this rank's two load-balanced chunks (``shard_sequence``) and rotary positions were already applied at
    the tokens' global positions (``chunk_positions``). Differentiable in q, k and v."""
    if dist.get_world_size(group) < 2:
        raise ValueError("ring attention needs a cp group of at least 2 ranks")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} K/V heads")
    out: torch.Tensor = _RingAttention.apply(q, k, v, group, causal)
    return out


def apply_context_parallel(model: nn.Module, group: dist.ProcessGroup) -> None:
    """Make every attention of ``model`` ring attention over the cp ``group``.

    The caller feeds each rank its load-balanced chunks (``worker.runtime.data.local_batch``) and averages
    gradients over dp x cp (the cp ranks replicate the weights)."""
    from worker.runtime.model import Attention

    for module in model.modules():
        if isinstance(module, Attention):
            module.context_group = group
