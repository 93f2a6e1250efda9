"""Run on 4 gloo ranks (``python -m tests.moe.ep_harness OUT.json``): expert-parallel MoE against the
single-process layer, and LSH compression on clustered / unclustered tokens. Rank 0 writes the figures;
test_runtime.py asserts on them (asserting here would leave the other ranks hanging in a collective)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from worker.runtime.lsh import LSHCompression
from worker.runtime.moe import MoELayer

WORLD = 4
GELU_MAX_SLOPE = 1.1290  # sup of |gelu'(x)|: gelu is Lipschitz with this constant


def _max_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    assert a is not None and b is not None
    return float((a - b).abs().max())


def _run(layer: MoELayer, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = layer(x)
    (out * g).sum().backward()
    assert x.grad is not None
    return out.detach(), x.grad


def equivalence(rank: int, capacity: float | None, gated: bool) -> dict[str, Any]:
    """EP layer vs the full layer on this rank's own tokens; expert gradients summed over ranks."""
    torch.manual_seed(0)
    full = MoELayer(16, 24, num_experts=8, top_k=2, gated=gated, capacity_factor=capacity)
    ep = MoELayer.sharded_from(full, dist.group.WORLD)
    torch.manual_seed(100 + rank)
    x, g = torch.randn(3, 10, 16), torch.randn(3, 10, 16)
    ref_out, ref_dx = _run(full, x, g)
    out, dx = _run(ep, x, g)
    lo, n = rank * ep.experts.count, ep.experts.count
    expert_diff = 0.0
    for name in ("w1", "w2", "w3"):
        ref_w, w = getattr(full.experts, name), getattr(ep.experts, name)
        if w is None:
            continue
        total = ref_w.grad.clone()
        dist.all_reduce(total)  # an expert's gradient collects the contributions of every rank's tokens
        expert_diff = max(expert_diff, _max_diff(total[lo:lo + n], w.grad))
    with torch.no_grad():
        kept = int(full._route(x.reshape(-1, 16)).token.numel())
    return {"out": _max_diff(out, ref_out), "dx": _max_diff(dx, ref_dx), "experts": expert_diff,
            "router": _max_diff(ep.router.gate.weight.grad, full.router.gate.weight.grad),
            "out_scale": float(ref_out.abs().max()), "kept_copies": kept,
            "rate": ep.stats.compression_rate, "calls": ep.stats.calls}


def lsh(rank: int, spread: float) -> dict[str, Any]:
    """Tokens = one of 8 random centers (norm ~sqrt(h)) + Gaussian noise of std ``spread`` per coordinate;
    ``spread`` = 1 makes them unclustered. GELU experts so that their Lipschitz constant is known."""
    h, experts, tokens = 32, 8, 256
    torch.manual_seed(0)
    full = MoELayer(h, 64, num_experts=experts, top_k=2, gated=False)
    plain = MoELayer.sharded_from(full, dist.group.WORLD)
    packed = MoELayer.sharded_from(full, dist.group.WORLD)
    packed.compression = LSHCompression(h, num_hashes=6, seed=7)
    centers = torch.randn(8, h)
    torch.manual_seed(100 + rank)
    which = torch.randint(0, 8, (tokens,))
    noise = spread * torch.randn(tokens, h) if spread < 1 else torch.randn(tokens, h)
    x = (centers[which] + noise if spread < 1 else noise)[None]
    g = torch.randn_like(x)
    y, _ = _run(plain, x, g)
    y_lsh, dx = _run(packed, x, g)
    # Lipschitz constant of the worst expert anywhere: gelu slope x ||W1||_2 x ||W2||_2
    with torch.no_grad():
        lips = [GELU_MAX_SLOPE * float(torch.linalg.matrix_norm(full.experts.w1[e], 2)
                                       * torch.linalg.matrix_norm(full.experts.w2[e], 2)) for e in range(experts)]
    err = (y_lsh - y)[0]
    grads_reach_experts = all(w.grad is not None and float(w.grad.abs().sum()) > 0
                              for w in (packed.experts.w1, packed.experts.w2))
    return {"rate": packed.stats.compression_rate, "plain_rate": plain.stats.compression_rate,
            "bytes_sent": packed.stats.bytes_sent, "bytes_uncompressed": packed.stats.bytes_uncompressed,
            "alltoall_s": packed.stats.seconds, "rel_err": float(err.norm() / y.norm()),
            "err": float(err.norm()), "stream_norm": float((x + y).norm()),
            "noise_sq": float((noise ** 2).sum()), "spread_rel": float(noise.norm() / x.norm()),
            "lipschitz": max(lips), "top_k": 2,
            "dx_finite": bool(torch.isfinite(dx).all()), "grads_reach_experts": grads_reach_experts}


def _worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # equivalence to rounding, not to a loose tolerance
    res: dict[str, Any] = {
        "equal": equivalence(rank, None, gated=True),
        "equal_gelu": equivalence(rank, None, gated=False),
        "equal_capacity": equivalence(rank, 1.0, gated=True),
    }
    torch.set_default_dtype(torch.float32)
    res["lsh_clustered"] = lsh(rank, spread=0.05)
    res["lsh_unclustered"] = lsh(rank, spread=1.0)
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, res)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def main() -> None:
    out = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(str(Path(tmp) / "store"), out), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
