"""Profiler mode: measure this node for the cost model (``solvers.cost_model.profile.Profile``).

Run under ``torch.distributed.run`` with one process per device, so every number is taken while the whole
node is busy, as it is in training (on a CPU host the ranks share cores, and that is part of the truth):

- per-layer forward / backward time of one transformer block by batch and sequence, for each tensor-parallel
  degree as the runtime runs it (DTensor shards), less its own collectives (profiled apart);
- all-reduce / all-gather / reduce-scatter / all-to-all time by group size and message size, every group of
  that size running at once (as tp or dp groups do), and p2p send/recv between neighbouring ranks;
- the host's GEMM rate and memory bandwidth (for the parts the cost model keeps analytic).

Rank 0 writes ``{"profile": <Profile>, "device": {...}}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from solvers.cost_model.profile import CollectiveOp
from worker.runtime.model import Block, ModelConfig

MESSAGE_BYTES = (16 * 2**10, 256 * 2**10, 2 * 2**20, 8 * 2**20)


def _median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def layer_time(cfg: ModelConfig, batch: int, seq: int, device: torch.device, repeats: int,
               block: torch.nn.Module | None = None, seq_shards: int = 1) -> tuple[float, float]:
    """(forward, backward) seconds of one block (a fresh one, or ``block``) on a (batch, seq, hidden) input;
    with ``seq_shards`` > 1 each rank holds its sequence shard, as Megatron SP hands the residual between blocks."""
    torch.manual_seed(0)
    block = block if block is not None else Block(cfg).to(device)
    x = torch.randn(batch, seq // seq_shards, cfg.hidden_size, device=device, requires_grad=True)
    grad = torch.randn(batch, seq // seq_shards, cfg.hidden_size, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fwd, bwd = [], []
    for i in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        y = block(x)
        sync()
        t1 = time.perf_counter()
        y.backward(grad)
        sync()
        t2 = time.perf_counter()
        if i:  # the first pass warms allocator and kernels up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    # The median repeat, taken while every rank runs the same loop: training keeps all ranks busy, and the
    # fastest repeat is the one where a neighbour happened to idle (it underestimated every plan by ~25 %).
    return statistics.median(fwd), statistics.median(bwd)


def tensor_parallel_block(cfg: ModelConfig, tp: int, device: torch.device, sequence_parallel: bool = False
                          ) -> tuple[Block, DeviceMesh]:
    """One block sharded exactly as the runtime shards it (DTensor, Megatron layout, with or without SP) over
    contiguous groups of ``tp`` ranks, every group at once."""
    from torch.distributed.device_mesh import init_device_mesh

    from worker.runtime.model import Decoder
    from worker.runtime.tensor_parallel import apply_tensor_parallel

    mesh = init_device_mesh(device.type, (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Decoder(replace(cfg, num_layers=1)).to(device)
    model.tok_embeddings = model.norm = model.output = None
    apply_tensor_parallel(model, mesh["tp"], sequence_parallel=sequence_parallel)
    block = model.layers["0"]
    assert isinstance(block, Block)
    return block, mesh["tp"]


def tensor_parallel_layer_time(cfg: ModelConfig, block: Block, tp_mesh: DeviceMesh, sequence_parallel: bool,
                               batch: int, seq: int, device: torch.device, repeats: int) -> tuple[float, float]:
    """(forward, backward) seconds of a TP block as the runtime runs it, less its own collectives (two
    all-reduces of the activation each way, or under SP the all-gather + reduce-scatter pairs of the same
    ring cost, timed here as all-reduces on the same group): the profile's layer times exclude
    communication, which the cost model adds from the collective measurements."""
    fwd, bwd = layer_time(cfg, batch, seq, device, repeats, block=block,
                          seq_shards=tp_mesh.size() if sequence_parallel else 1)
    group = tp_mesh.get_group()
    act = torch.ones(batch * seq * cfg.hidden_size, device=device)
    comm = _median_time(lambda: [dist.all_reduce(act, group=group) for _ in range(2)], repeats)
    # Keep a floor: on a loaded host a collective can measure slower alone than inside the layer.
    return max(fwd - comm, 0.25 * fwd), max(bwd - comm, 0.25 * bwd)


def profile_layers(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int], tps: Sequence[int],
                   device: torch.device, repeats: int) -> list[dict[str, Any]]:
    """Layer times, averaged over ranks (all ranks measure at once). Tensor-parallel layers are timed as the
    runtime runs them (DTensor), so its per-operator overhead is part of the profile."""
    out = []
    for seq in seqs:
        for tp, sp in [(1, False)] + [(t, sp) for t in tps if t > 1 and seq % t == 0 for sp in (False, True)]:
            sharded = tensor_parallel_block(cfg, tp, device, sp) if tp > 1 else None
            for batch in batches:
                dist.barrier()
                if sharded is None:
                    f, b = layer_time(cfg, batch, seq, device, repeats)
                else:
                    f, b = tensor_parallel_layer_time(cfg, *sharded, sp, batch, seq, device, repeats)
                t = torch.tensor([f, b], dtype=torch.float64, device=device)
                dist.all_reduce(t)
                t /= dist.get_world_size()
                out.append({"batch": batch, "seq": seq, "tp": tp, "forward_ms": 1e3 * float(t[0]),
                            "backward_ms": 1e3 * float(t[1]), **({"sp": True} if sp else {})})
    return out


def profile_moe_layers(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int], device: torch.device,
                       repeats: int) -> list[dict[str, Any]]:
    """The model's MoE layer (router, capacity, all its experts on this rank: ep = etp = 1) by batch and sequence,
    ``layer_type`` "moe", averaged over ranks; none for a dense model. An expert-parallel rank computes the same
    routed rows of its experts (balanced routing); its all-to-alls are priced from the collectives."""
    moe_index = next((i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)), None)
    if moe_index is None:
        return []
    out = []
    for seq in seqs:
        for batch in batches:
            torch.manual_seed(0)
            block = Block(cfg, moe_index).to(device)
            dist.barrier()
            f, b = layer_time(cfg, batch, seq, device, repeats, block=block)
            t = torch.tensor([f, b], dtype=torch.float64, device=device)
            dist.all_reduce(t)
            t /= dist.get_world_size()
            out.append({"batch": batch, "seq": seq, "tp": 1, "forward_ms": 1e3 * float(t[0]),
                        "backward_ms": 1e3 * float(t[1]), "layer_type": "moe"})
    return out


def host_contention(cfg: ModelConfig, batch: int, seq: int, device: torch.device, repeats: int,
                    busy_s: float) -> dict[str, Any] | None:
    """How much slower a layer runs with every rank of the node busy (``busy_s``, measured by
    ``profile_layers``) than on one rank alone while the others wait: on a CPU host the ranks share cores,
    and the cost model gives an idle pipeline rank's cores back to the busy ones. None on GPUs (one each)."""
    if device.type != "cpu":
        return None
    alone = torch.zeros(1, dtype=torch.float64)
    dist.barrier()
    if dist.get_rank() == 0:
        alone[0] = sum(layer_time(cfg, batch, seq, device, repeats))
    dist.barrier()
    dist.broadcast(alone, src=0)
    return {"busy_ranks": dist.get_world_size(), "slowdown": max(1.0, busy_s / float(alone[0]))}


def fsdp_overheads(cfg: ModelConfig, batch: int, seq: int, device: torch.device, repeats: int,
                   collectives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """FSDP2's own cost per layer beyond the plain layer and its collectives (hooks, copy-in/copy-out,
    DTensor bookkeeping), with and without resharding after forward, over all ranks of the node.

    Two blocks under a parameterless root, as the runtime shards a model (the root's own parameters would
    not be resharded); their time less two plain blocks' time less the collectives FSDP issues for them
    (all-gather forward, reduce-scatter backward, all-gather again backward when resharding), timed by the
    collective fit of this same profile."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from solvers.cost_model.profile import CollectiveTime, Profile

    world = dist.get_world_size()
    if world < 2:
        return []
    fit = Profile(collectives=[CollectiveTime.model_validate(c) for c in collectives])
    mesh = init_device_mesh(device.type, (world,))

    def pair() -> torch.nn.Sequential:
        torch.manual_seed(0)
        return torch.nn.Sequential(Block(cfg), Block(cfg)).to(device)

    dist.barrier()
    plain_f, plain_b = layer_time(cfg, batch, seq, device, repeats, block=pair())
    param_bytes = float(sum(p.numel() * p.element_size() for p in Block(cfg).parameters()))

    def coll(op: CollectiveOp) -> float:
        t = float(fit.collective_s(op, np.array(param_bytes), np.array(world), np.array(False)))
        return t if math.isfinite(t) else 0.0

    gather, scatter = coll("allgather"), coll("reduce_scatter")
    out = []
    for reshard in (True, False):
        model = pair()
        for block in model:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        dist.barrier()
        f, b = layer_time(cfg, batch, seq, device, repeats, block=model)
        extra = torch.tensor([(f - plain_f) / 2 - gather, (b - plain_b) / 2 - scatter - (gather if reshard else 0.0)],
                             dtype=torch.float64)
        dist.all_reduce(extra)
        extra /= world
        out.append({"parallelism": "fsdp", "reshard": reshard, "forward_ms": 1e3 * max(0.0, float(extra[0])),
                    "backward_ms": 1e3 * max(0.0, float(extra[1]))})
    return out


def optimizer_s_per_param(cfg: ModelConfig, device: torch.device, repeats: int) -> float:
    """Seconds per parameter of one AdamW step (the runtime's optimizer) on a block, every rank at once."""
    torch.manual_seed(0)
    block = Block(cfg).to(device)
    for p in block.parameters():
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(block.parameters(), lr=1e-4)
    dist.barrier()
    t = torch.tensor([_median_time(opt.step, repeats, warmup=2)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0]) / dist.get_world_size() / sum(p.numel() for p in block.parameters())


def _groups(world: int, size: int) -> list[list[int]]:
    return [list(range(s, s + size)) for s in range(0, world, size)]


def _collective_fn(op: str, nbytes: int, group: dist.ProcessGroup, size: int, device: torch.device
                   ) -> Callable[[], object] | None:
    n = max(size, nbytes // 4 // size * size)  # fp32 elements, divisible by the group size
    full = torch.ones(n, device=device)
    part = torch.ones(n // size, device=device)
    if op == "allreduce":
        return lambda: dist.all_reduce(full, group=group)
    if op == "allgather":
        return lambda: dist.all_gather_into_tensor(full, part, group=group)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full, group=group)
    if op == "alltoall":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    return None


def profile_collectives(world: int, device: torch.device, repeats: int,
                        sizes: Sequence[int] = MESSAGE_BYTES) -> list[dict[str, Any]]:
    """Time per call of each collective by group size and message bytes (``message_bytes`` is the full
    tensor: the all-reduced buffer, the gathered output, the reduce-scattered input, the all-to-all buffer)."""
    rank = dist.get_rank()
    out: list[dict[str, Any]] = []
    group_sizes = [g for g in (2, 4, 8, 16) if g <= world and world % g == 0]
    for size in group_sizes:
        mine: dist.ProcessGroup | None = None
        for ranks in _groups(world, size):  # every rank creates every group, in the same order
            g = dist.new_group(ranks)
            if rank in ranks:
                mine = g
        assert mine is not None
        for op in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
            for nbytes in sizes:
                fn = _collective_fn(op, nbytes, mine, size, device)
                try:
                    assert fn is not None
                    dist.barrier()
                    t = _median_time(fn, repeats)
                except (RuntimeError, AssertionError):  # an op this backend lacks (older gloo)
                    continue
                agg = torch.tensor([t], dtype=torch.float64, device=device)
                dist.all_reduce(agg, op=dist.ReduceOp.MAX)  # a collective ends when its slowest member does
                out.append({"op": op, "group_size": size, "across_nodes": False, "message_bytes": float(nbytes),
                            "time_ms": 1e3 * float(agg[0])})
    out.extend(profile_p2p(world, device, repeats, sizes))
    return out


def profile_p2p(world: int, device: torch.device, repeats: int, sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Send/recv between ranks 2i and 2i+1, all pairs at once (pipeline neighbours)."""
    rank = dist.get_rank()
    if world < 2:
        return []
    out = []
    peer = rank ^ 1 if (rank ^ 1) < world else None
    for nbytes in sizes:
        buf = torch.ones(max(1, nbytes // 4), device=device)

        def exchange(buf: torch.Tensor = buf) -> None:
            if peer is None:
                return
            if rank % 2 == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)

        dist.barrier()
        t = _median_time(exchange, repeats) / 2  # a round trip is two transfers
        agg = torch.tensor([t], dtype=torch.float64, device=device)
        dist.all_reduce(agg, op=dist.ReduceOp.MAX)
        out.append({"op": "p2p", "group_size": 2, "across_nodes": False, "message_bytes": float(nbytes),
                    "time_ms": 1e3 * float(agg[0])})
    return out


def device_rates(device: torch.device, repeats: int = 5) -> dict[str, float]:
    """Achieved fp32 GEMM TFLOP/s and copy bandwidth (GB/s) per rank while all ranks run."""
    n = 512 if device.type == "cpu" else 8192
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def gemm() -> None:
        torch.mm(a, b)
        sync()

    src = torch.ones(16 * 2**20 // 4, device=device)
    dst = torch.empty_like(src)

    def copy() -> None:
        dst.copy_(src)
        sync()

    dist.barrier()
    tflops = 2 * n**3 / _median_time(gemm, repeats) / 1e12
    gbps = 2 * src.numel() * 4 / _median_time(copy, repeats) / 1e9
    t = torch.tensor([tflops, gbps], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return {"peak_tflops": float(t[0]), "memory_bandwidth_GBps": float(t[1])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="ModelSpec JSON (a preset name or an object)")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--seqs", default="128")
    ap.add_argument("--tps", default="", help="tensor-parallel degrees (default: those dividing heads and world)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from solvers.specs import ModelSpec

    raw = json.loads(args.model) if args.model.strip().startswith("{") else {"preset": args.model}
    # The dense layers of the model, and (below) its MoE layer if it has one
    full = ModelConfig.from_spec(ModelSpec.model_validate(raw))
    cfg = replace(full, moe=None)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()
    tps = [int(x) for x in args.tps.split(",") if x] or [
        t for t in (1, 2, 4, 8) if t <= world and cfg.num_heads % t == 0 and cfg.num_kv_heads % t == 0]
    started = time.perf_counter()
    layers = profile_layers(cfg, [int(x) for x in args.batches.split(",")], [int(x) for x in args.seqs.split(",")],
                            tps, device, args.repeats)
    layers += profile_moe_layers(full, [int(x) for x in args.batches.split(",")],
                                 [int(x) for x in args.seqs.split(",")], device, args.repeats)
    collectives = profile_collectives(world, device, args.repeats)
    # the overheads and the contention at a mid-sized batch of the first sequence length
    seq0 = layers[0]["seq"]
    plain = [x for x in layers if x["tp"] == 1 and x["seq"] == seq0]
    mid = plain[len(plain) // 2]
    overheads = fsdp_overheads(cfg, int(mid["batch"]), seq0, device, args.repeats, collectives)
    host = host_contention(cfg, int(mid["batch"]), seq0, device, args.repeats,
                           (mid["forward_ms"] + mid["backward_ms"]) / 1e3)
    rates = {**device_rates(device), "optimizer_s_per_param": optimizer_s_per_param(cfg, device, args.repeats)}
    if dist.get_rank() == 0:
        gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
        name = args.name or f"{gpu} x{world} {time.strftime('%Y-%m-%d %H:%M')}"
        doc = {"profile": {"name": name, "gpu": gpu, "layer_times": layers, "collectives": collectives,
                           "overheads": overheads, **({"host": host} if host else {})},
               "device": {"name": gpu, "ranks": world, **rates, "torch_version": torch.__version__,
                          "profile_time_s": time.perf_counter() - started}}
        args.out.write_text(json.dumps(doc, indent=1))
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # see worker.runtime.train: gloo subgroups can abort in interpreter teardown
