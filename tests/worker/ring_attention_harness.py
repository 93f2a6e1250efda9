"""Run by torchrun (4 ranks) from test_ring_attention.py: ring attention against full attention on one process.

Attention alone: every rank builds the same whole-sequence q, k, v and output gradient, computes the reference
with ``scaled_dot_product_attention`` and its input gradients, then runs ring attention on its load-balanced
chunks over cp groups of 2 ({0, 1}, {2, 3}) and of 4: {case: largest absolute error over the ranks} for the
output and each input gradient.

The model: the decoder with ring attention on its cp rank's chunks of a batch (``data.local_batch``: inputs,
labels, rotary at global positions) against the single-process decoder: the loss, and each parameter's gradient
(averaged over the cp ranks, as data parallelism over dp x cp does) as the largest error relative to the
reference gradient's largest entry. Rank 0 writes all of it as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.worker.faults import fault
from worker.runtime.data import global_batch, local_batch
from worker.runtime.model import ModelConfig, build_model, lm_loss
from worker.runtime.ring_attention import apply_context_parallel, ring_attention, shard_sequence, unshard_sequence

# the equivalence plans' model (tests/worker/plans.py), two layers
TINY = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, ffn_hidden_size=128,
                   vocab_size=128)


def contiguous(x: torch.Tensor, dim: int, rank: int, cp: int) -> torch.Tensor:
    """The naive split (rank r holds the r-th contiguous 1/cp): not the layout ring attention assumes."""
    return x.chunk(cp, dim=dim)[rank].contiguous()


def check(group: dist.ProcessGroup, causal: bool, heads: int, kv_heads: int, split: str) -> dict[str, float]:
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    gen = torch.Generator().manual_seed(7)
    b, s, d = 2, 8 * cp, 8
    q = torch.randn(b, heads, s, d, generator=gen, requires_grad=True)
    k = torch.randn(b, kv_heads, s, d, generator=gen, requires_grad=True)
    v = torch.randn(b, kv_heads, s, d, generator=gen, requires_grad=True)
    dout = torch.randn(b, heads, s, d, generator=gen)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != heads)
    ref.backward(dout)
    assert q.grad is not None and k.grad is not None and v.grad is not None
    shard = shard_sequence if split == "load-balanced" else contiguous
    local = [shard(t.detach(), 2, rank, cp).requires_grad_() for t in (q, k, v)]
    out = ring_attention(local[0], local[1], local[2], group, causal=causal)
    out.backward(shard(dout, 2, rank, cp))
    errors = {"out": (out.detach() - shard(ref.detach(), 2, rank, cp)).abs().max()}
    for name, mine, full in zip(("dq", "dk", "dv"), local, (q.grad, k.grad, v.grad), strict=True):
        assert mine.grad is not None
        errors[name] = (mine.grad - shard(full, 2, rank, cp)).abs().max()
    worst = torch.stack(list(errors.values()))
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return dict(zip(errors, worst.tolist(), strict=True))


def check_model(group: dist.ProcessGroup, broken: str | None = None) -> dict[str, float]:
    rank, cp = dist.get_rank(group), dist.get_world_size(group)
    cfg = TINY
    tokens = global_batch(cfg.vocab_size, 2, 32, seed=3, step=0)
    reference = build_model(cfg, seed=5)
    ref_loss = lm_loss(reference(tokens[:, :-1]), tokens[:, 1:])
    ref_loss.backward()
    model = build_model(cfg, seed=5)
    apply_context_parallel(model, group)
    with fault(broken):
        inputs, labels = local_batch(tokens, 0, 1, cp_rank=rank, cp=cp)
        loss = lm_loss(model(inputs), labels)  # the mean over this rank's tokens; every rank has as many
        loss.backward()
    mean = loss.detach().clone()
    dist.all_reduce(mean, group=group)
    worst = 0.0
    for (name, p), ref in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and ref.grad is not None, name
        grad = p.grad.clone()
        dist.all_reduce(grad, group=group)
        worst = max(worst, float((grad / cp - ref.grad).abs().max() / ref.grad.abs().max()))
    result = torch.tensor([float((mean / cp - ref_loss.detach()).abs()), worst])
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return {"loss": float(result[0]), "grad_rel": float(result[1])}


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    cp2, cp4 = pairs[rank // 2], dist.new_group([0, 1, 2, 3])
    assert unshard_sequence([shard_sequence(torch.arange(16), 0, r, 4) for r in range(4)], 0).tolist() == \
        list(range(16))
    results = {
        "cp2-gqa-causal": check(cp2, True, 4, 2, "load-balanced"),
        "cp4-gqa-causal": check(cp4, True, 4, 2, "load-balanced"),
        "cp4-mha-causal": check(cp4, True, 4, 4, "load-balanced"),
        "cp4-gqa-full": check(cp4, False, 6, 2, "load-balanced"),
        # negative control: the same ring fed contiguous chunks (the wrong layout) must not match
        "control-cp4-contiguous": check(cp4, True, 4, 2, "contiguous"),
    }
    model_results = {
        "cp2": check_model(cp2),
        "cp4": check_model(cp4),
        # negative controls: rotary at the rank's local positions; the rank's tokens a contiguous 1/cp
        "control-cp4-local-positions": check_model(cp4, "local-positions"),
        "control-cp4-contiguous-chunks": check_model(cp4, "contiguous-chunks"),
    }
    if rank == 0:
        out.write_text(json.dumps({"attention": results, "model": model_results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
