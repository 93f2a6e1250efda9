"""Profiler mode: measure this node for the cost model (``solvers.cost_model.profile.Profile``).

Run under ``torch.distributed.run`` with one process per device, so every number is taken while the whole
node is busy, as it is in training (on a CPU host the ranks share cores, and that is part of the truth):

- per-layer forward / backward time of one transformer block by batch and sequence, for each tensor-parallel
  degree as the runtime runs it (DTensor shards), less its own collectives (profiled apart); every rank runs
  each repeat at once and the repeat lasts as long as its slowest rank took (``layer_time``);
- forward / backward time of the final norm, LM head and loss by batch, sequence and tensor-parallel degree, as
  the runtime runs them (vocabulary-parallel logits and loss at tp > 1, their exchanges included: ``head_time``);
- all-reduce / all-gather / reduce-scatter / all-to-all time by group size and message size, every group of
  that size running at once (as tp or dp groups do), and p2p send/recv between neighbouring ranks;
- the host's GEMM rate and memory bandwidth (for the parts the cost model keeps analytic).

Rank 0 writes ``{"profile": <Profile>, "device": {...}}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from solvers.cost_model.profile import CollectiveOp
from solvers.run_layout import RUNTIME_STACK
from worker.runtime.groups import shared_process_groups
from worker.runtime.model import Block, ModelConfig, lm_loss

# up to 32 MiB: a small model's whole gradient (the closed loop's is 25 MB) is one flat all-reduce in the runtime
MESSAGE_BYTES = (16 * 2**10, 256 * 2**10, 2 * 2**20, 8 * 2**20, 32 * 2**20)


def _group(ranks: Sequence[int]) -> dist.ProcessGroup:
    """The process group of ``ranks`` (collective: every rank asks for every group, in the same order)."""
    group = dist.new_group(list(ranks))
    assert group is not None
    return group


def _median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def slowest_rank(samples: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """Per repeat, each part's (e.g. forward, backward) longest time over the ranks: ``samples`` holds each rank's
    rows, one per repeat of parts the ranks started together, as ``_gathered`` returns them."""
    return [[max(rank[i][j] for rank in samples) for j in range(len(samples[0][i]))] for i in range(len(samples[0]))]


def _gathered(rows: list[list[float]]) -> list[list[list[float]]]:
    """Every rank's ``rows`` (the same shape on every rank), in rank order; just this rank's without a group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [rows]
    mine = torch.tensor(rows, dtype=torch.float64)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def _timed_passes(block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor | None, count: int, together: bool
                  ) -> list[list[float]]:
    """This rank's (forward, backward) seconds of ``count`` passes of ``block`` on ``x``; ``together``: every rank
    starts each pass's forward at once, then its backward at once (the process group is up)."""
    cuda = x.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows: list[list[float]] = []
    for _ in range(count):
        sync()
        if together:
            # every rank starts each repeat together, as data-parallel ranks start each micro-batch: left to drift
            # apart, a rank's repeats overlapped its neighbours' idle waits and measured uncontended speed
            dist.barrier()
        t0 = time.perf_counter()
        # on a GPU the runtime computes under bf16 autocast (its default precision; a CPU run computes in fp32)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=cuda):
            y = block(x)
        sync()
        t1 = time.perf_counter()
        if together:
            # and the backward together: a rank left to start it early ran it while others still computed forward
            # (contended forward, uncontended backward: the split came out ~1.6 : 1 for a layer that runs 1 : 1.8)
            dist.barrier()
        t2 = time.perf_counter()
        y.backward(grad)
        sync()
        rows.append([t1 - t0, time.perf_counter() - t2])
    return rows


def _layer_input(cfg: ModelConfig, batch: int, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A (batch, seq, hidden) input to a block and the gradient its output gets back, the same on every rank."""
    torch.manual_seed(0)
    x = torch.randn(batch, seq, cfg.hidden_size, device=device, requires_grad=True)
    return x, torch.randn(batch, seq, cfg.hidden_size, device=device)


def layer_time(cfg: ModelConfig, batch: int, seq: int, device: torch.device, repeats: int,
               block: torch.nn.Module | None = None, seq_shards: int = 1, together: bool = True
               ) -> tuple[float, float]:
    """(forward, backward) seconds of one block (a fresh one, or ``block``) on a (batch, seq, hidden) input;
    with ``seq_shards`` > 1 each rank holds its sequence shard, as Megatron SP hands the residual between blocks.
    ``together`` (with a process group): every rank runs each repeat's forward at once, then its backward at
    once, and each counts as long as its slowest rank took (the same result on every rank)."""
    torch.manual_seed(0)
    block = block if block is not None else Block(cfg).to(device)
    x, grad = _layer_input(cfg, batch, seq // seq_shards, device)
    return _median_passes(block, x, grad, repeats, together)


def _median_passes(block: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor | None, repeats: int,
                   together: bool = True) -> tuple[float, float]:
    """(forward, backward) seconds of ``block`` on ``x`` (``grad`` back into its output, None for a scalar loss):
    the median of ``repeats`` passes after one to warm up, each the slowest rank's with ``together``
    (``layer_time``)."""
    together = together and dist.is_initialized()
    rows = _timed_passes(block, x, grad, repeats + 1, together)[1:]  # the first pass warms allocator and kernels up
    if together:
        # A pass lasts until its slowest rank is done: ranks sharing a host's cores do not progress evenly (one
        # finishes early and idles at the next barrier, lending its core to the others), and whatever synchronises
        # them next (a gradient all-reduce, a pipeline send) waits for the last. Each rank's own median, averaged
        # over the ranks, was 20-35 % below the per-layer time of the plans run beside it on 4 ranks of a 2-core
        # host; the slowest rank's matched them.
        rows = slowest_rank(_gathered(rows))
    # The median repeat, taken while every rank runs the same loop: training keeps all ranks busy, and the
    # fastest repeat is the one where a neighbour happened to idle (it underestimated every plan by ~25 %).
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)


def _tp_mesh(device: torch.device, tp: int) -> DeviceMesh:
    """The 1-D mesh of this rank's group of ``tp`` contiguous ranks (every group formed at once), as the runtime
    lays out tensor parallelism."""
    return init_device_mesh(device.type, (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))["tp"]


class _HeadLoss(torch.nn.Module):
    """A model's final norm, LM head and loss on fixed labels, the last layer's output in, the mean loss out."""

    def __init__(self, model: torch.nn.Module, labels: torch.Tensor) -> None:
        super().__init__()
        self.model, self.labels = model, labels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.model(x), self.labels)


def head_module(cfg: ModelConfig, tp: int, device: torch.device) -> torch.nn.Module:
    """The final norm and LM head as the runtime shards them over contiguous groups of ``tp`` ranks, every group at
    once: at tp > 1 vocabulary-parallel, the logits a DTensor sharded over the vocabulary."""
    from worker.runtime.model import Decoder
    from worker.runtime.tensor_parallel import tensor_parallel_ends

    torch.manual_seed(0)
    model = Decoder(replace(cfg, num_layers=0)).to(device)
    model.tok_embeddings = None
    if tp > 1:
        tensor_parallel_ends(model, _tp_mesh(device, tp), embedding_sp=False, head_sp=False, vocab_parallel_loss=True)
    return model


def head_time(cfg: ModelConfig, head: torch.nn.Module, vocab_parallel: bool, batch: int, seq: int,
              device: torch.device, repeats: int) -> tuple[float, float]:
    """(forward, backward) seconds of ``head`` (``head_module``) and the loss on a (batch, seq, hidden) input, its
    exchanges in the time; ``_median_passes``' statistics."""
    from torch.distributed.tensor.parallel import loss_parallel

    x, _ = _layer_input(cfg, batch, seq, device)
    labels = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    # a vocabulary-parallel loss's forward and backward both run inside loss_parallel, as in the runtime's step
    with loss_parallel() if vocab_parallel else contextlib.nullcontext():
        return _median_passes(_HeadLoss(head, labels), x, None, repeats)


def tensor_parallel_block(cfg: ModelConfig, tp: int, device: torch.device, sequence_parallel: bool = False
                          ) -> tuple[Block, DeviceMesh]:
    """One block sharded exactly as the runtime shards it (DTensor, Megatron layout, with or without SP) over
    contiguous groups of ``tp`` ranks, every group at once."""
    from worker.runtime.model import Decoder
    from worker.runtime.tensor_parallel import apply_tensor_parallel

    mesh = _tp_mesh(device, tp)
    torch.manual_seed(0)
    model = Decoder(replace(cfg, num_layers=1)).to(device)
    model.tok_embeddings = model.norm = model.output = None
    apply_tensor_parallel(model, mesh, sequence_parallel=sequence_parallel)
    block = model.layers["0"]
    assert isinstance(block, Block)
    return block, mesh


def moe_block(cfg: ModelConfig, moe_index: int, tp: int, ep: int, device: torch.device, sequence_parallel: bool
              ) -> tuple[Block, DeviceMesh | None]:
    """The model's MoE block as the runtime runs it in a layer of tensor parallelism ``tp`` whose experts keep the
    default expert TP (etp = tp) and are dealt over ``ep`` ranks, every group at once: the runtime's fold mesh
    edp x ep x etp over the ranks (``worker.runtime.expert_parallel``: etp groups are the contiguous tp groups, ep
    ranks etp apart), attention sharded as ``tensor_parallel_block``, every expert's MLP split over the tp ranks,
    the router replicated. Returns the block and its tp mesh (None at tp = 1)."""
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    from worker.runtime.moe import MoELayer
    from worker.runtime.tensor_parallel import tensor_parallel_block as shard_block

    torch.manual_seed(0)
    block = Block(cfg, moe_index).to(device)
    if tp == ep == 1:
        return block, None
    world = dist.get_world_size()
    ep_group = None
    if ep > 1:  # (the fold mesh only where there are experts to deal: every mesh adds gloo groups to each rank)
        fold = init_device_mesh(device.type, (world // (ep * tp), ep, tp), mesh_dim_names=("edp", "ep", "etp"))
        ep_group = fold["ep"].get_group()
    tp_mesh = _tp_mesh(device, tp) if tp > 1 else None
    tp_group = tp_mesh.get_group() if tp_mesh is not None else None
    full = block.feed_forward
    assert isinstance(full, MoELayer)
    # without SP the tp ranks hold the same tokens and each routes its 1/tp of them
    layer = MoELayer.sharded_from(full, ep_group, tp_group, None if sequence_parallel else tp_group)
    block.feed_forward = layer
    if tp_mesh is not None:
        parallelize_module(layer.router.gate, tp_mesh, SequenceParallel(sequence_dim=0, use_local_output=True))
        shard_block(block, tp_mesh, sequence_parallel)
    return block, tp_mesh


def tensor_parallel_layer_time(cfg: ModelConfig, block: Block, tp_mesh: DeviceMesh, sequence_parallel: bool,
                               batch: int, seq: int, device: torch.device, repeats: int, sublayers: int = 2
                               ) -> tuple[float, float]:
    """(forward, backward) seconds of a TP block as the runtime runs it, less its own collectives (two
    all-reduces of the activation each way, or under SP the all-gather + reduce-scatter pairs of the same
    ring cost, timed here as all-reduces on the same group): the profile's layer times exclude
    communication, which the cost model adds from the collective measurements. ``sublayers`` = 1: only the
    attention's is subtracted (an MoE block's experts exchange rows over expert TP instead, kept in its time)."""
    fwd, bwd = layer_time(cfg, batch, seq, device, repeats, block=block,
                          seq_shards=tp_mesh.size() if sequence_parallel else 1)
    group = tp_mesh.get_group()
    # (the activation as the layer exchanges it: bf16 under a GPU's autocast)
    act = torch.ones(batch * seq * cfg.hidden_size, device=device,
                     dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    comm = _median_time(lambda: [dist.all_reduce(act, group=group) for _ in range(sublayers)], repeats)
    # Keep a floor: on a loaded host a collective can measure slower alone than inside the layer.
    return max(fwd - comm, 0.25 * fwd), max(bwd - comm, 0.25 * bwd)


def _layer_row(forward_s: float, backward_s: float, device: torch.device, **keys: Any) -> dict[str, Any]:
    """A row of the profile's layer table: ``keys`` and the (forward, backward) times in ms, the ranks' mean (one
    figure for the node on every rank)."""
    t = torch.tensor([forward_s, backward_s], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return {**keys, "forward_ms": 1e3 * float(t[0]), "backward_ms": 1e3 * float(t[1])}


Pause = Callable[[], None] | None  # called between measurements (see ``measure_node``)


def profile_layers(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int], tps: Sequence[int],
                   device: torch.device, repeats: int, pause: Pause = None) -> list[dict[str, Any]]:
    """Layer times, all ranks measuring at once (each repeat the slowest rank's: ``layer_time``). Tensor-parallel
    layers are timed as the runtime runs them (DTensor), so its per-operator overhead is part of the profile."""
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
                out.append(_layer_row(f, b, device, batch=batch, seq=seq, tp=tp, **({"sp": True} if sp else {})))
                if pause:
                    pause()
    return out


def _contiguous_group(size: int) -> dist.ProcessGroup:
    """This rank's group of ``size`` contiguous ranks (every rank creates every group, in the same order)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mine: dist.ProcessGroup | None = None
    for start in range(0, world, size):
        g = _group(range(start, start + size))
        if start <= rank < start + size:
            mine = g
    assert mine is not None
    return mine


def context_parallel_block(cfg: ModelConfig, cp: int, device: torch.device) -> Block:
    """One block whose attention is the runtime's ring attention over contiguous groups of ``cp`` ranks, every
    group at once."""
    from worker.runtime.ring_attention import apply_context_parallel

    torch.manual_seed(0)
    block = Block(cfg).to(device)
    apply_context_parallel(block, _contiguous_group(cp))
    return block


def profile_heads(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int], tps: Sequence[int],
                  device: torch.device, repeats: int, pause: Pause = None) -> list[dict[str, Any]]:
    """Head times (``head_time``) by batch, sequence and tensor-parallel degree (tp 1 and each of ``tps``)."""
    out = []
    for seq in seqs:
        for tp in [1, *(t for t in tps if t > 1 and cfg.vocab_size % t == 0)]:
            head = head_module(cfg, tp, device)
            for batch in batches:
                dist.barrier()
                f, b = head_time(cfg, head, tp > 1, batch, seq, device, repeats)
                out.append(_layer_row(f, b, device, batch=batch, seq=seq, tp=tp))
                if pause:
                    pause()
    return out


def _sequence_sharded_layers(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int], degrees: Sequence[int],
                             device: torch.device, repeats: int, pause: Pause, key: str,
                             fits: Callable[[int, int], bool], block_of: Callable[[int], Block]
                             ) -> list[dict[str, Any]]:
    """Rows of a layout that splits the sequence over contiguous groups of ``degree`` ranks (tp = 1), keyed
    ``key``: for each sequence and each degree above 1 that ``fits(seq, degree)``, the block ``block_of(degree)``
    timed at every batch, each rank on ``batch`` samples of its ``seq / degree`` tokens, the slowest rank's."""
    out = []
    for seq in seqs:
        for degree in degrees:
            if degree < 2 or not fits(seq, degree):
                continue
            block = block_of(degree)
            for batch in batches:
                dist.barrier()
                f, b = layer_time(cfg, batch, seq, device, repeats, block=block, seq_shards=degree)
                out.append(_layer_row(f, b, device, batch=batch, seq=seq, tp=1, **{key: degree}))
                if pause:
                    pause()
    return out


def profile_context_parallel_layers(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int],
                                    cps: Sequence[int], device: torch.device, repeats: int, pause: Pause = None
                                    ) -> list[dict[str, Any]]:
    """Ring-attention layers (``cp`` > 1, tp = 1) as the runtime runs them, each rank on ``batch`` samples of its
    ``seq / cp`` tokens (two load-balanced chunks), the slowest rank's; the time includes the ring's K/V
    exchanges (P2P within the cp group), its per-step kernels and merges."""
    return _sequence_sharded_layers(cfg, batches, seqs, cps, device, repeats, pause, "cp",
                                    lambda seq, cp: seq % (2 * cp) == 0,
                                    lambda cp: context_parallel_block(cfg, cp, device))


def ulysses_block(cfg: ModelConfig, degree: int, device: torch.device) -> Block:
    """One block whose attention trades sequence for heads over contiguous groups of ``degree`` ranks
    (DeepSpeed-Ulysses, as the runtime runs it), every group at once."""
    from worker.runtime.ulysses import apply_ulysses

    torch.manual_seed(0)
    block = Block(cfg).to(device)
    apply_ulysses(block, _contiguous_group(degree))
    return block


def profile_ulysses_layers(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int], degrees: Sequence[int],
                           device: torch.device, repeats: int, pause: Pause = None) -> list[dict[str, Any]]:
    """Ulysses layers (``ulysses`` > 1, tp = 1) as the runtime runs them, each rank on ``batch`` samples of its
    ``seq / ulysses`` tokens, the slowest rank's; the time includes the all-to-alls around attention (the layer
    is the tp = 1 layer's work plus those exchanges and their copies, which the cost model would otherwise price
    from the collectives alone)."""
    return _sequence_sharded_layers(
        cfg, batches, seqs, degrees, device, repeats, pause, "ulysses",
        lambda seq, u: seq % u == 0 and cfg.num_heads % u == 0 and cfg.num_kv_heads % u == 0,
        lambda u: ulysses_block(cfg, u, device))


def moe_layouts(cfg: ModelConfig, seq: int, tps: Sequence[int], world: int) -> list[tuple[int, bool, int]]:
    """The (tp, sp, ep) layouts ``profile_moe_layers`` measures the MoE layer in at ``seq``: tp 1 and each degree of
    ``tps`` that divides the sequence and the expert width (with and without SP), each at ep 1 and at every ep of
    2, 4, 8 that divides the experts with ep x tp dividing the world."""
    assert cfg.moe is not None
    tp_sp = [(1, False)] + [(t, sp) for t in tps if t > 1 and seq % t == 0 and cfg.moe.ffn_hidden_size % t == 0
                            for sp in (False, True)]
    return [(tp, sp, ep) for tp, sp in tp_sp for ep in (1, 2, 4, 8)
            if cfg.moe.num_experts % ep == 0 and world % (tp * ep) == 0]


def profile_moe_layers(cfg: ModelConfig, batches: Sequence[int], seqs: Sequence[int], device: torch.device,
                       repeats: int, pause: Pause = None, tps: Sequence[int] = ()) -> list[dict[str, Any]]:
    """The model's MoE layer (router, capacity, experts) as the runtime runs it in each layout of ``moe_layouts``
    (``moe_block``), by batch and sequence, ``layer_type`` "moe", the slowest rank's; none for a dense model. Under
    TP, less its attention's collectives: its expert-TP exchanges stay in the time; under expert parallelism
    (``ep`` > 1) so do its token dispatch and combine all-to-alls, as the runtime issues them (the count exchange,
    uneven splits, a rank's experts on the rows all ep ranks routed to them)."""
    moe_index = next((i for i in range(cfg.num_layers) if cfg.is_moe_layer(i)), None)
    if moe_index is None:
        return []
    out = []
    for seq in seqs:
        for tp, sp, ep in moe_layouts(cfg, seq, tps, dist.get_world_size()):
            block, tp_mesh = moe_block(cfg, moe_index, tp, ep, device, sp)
            for batch in batches:
                dist.barrier()
                if tp_mesh is None:
                    f, b = layer_time(cfg, batch, seq, device, repeats, block=block)
                else:
                    f, b = tensor_parallel_layer_time(cfg, block, tp_mesh, sp, batch, seq, device, repeats,
                                                      sublayers=1)
                out.append(_layer_row(f, b, device, batch=batch, seq=seq, tp=tp, layer_type="moe",
                                      **({"sp": True} if sp else {}), **({"ep": ep} if ep > 1 else {})))
                if pause:
                    pause()
    return out


def _paired_rounds(repeats: int) -> int:
    """How many rounds a paired measurement (``host_contention``, ``fsdp_overheads``) takes: a median of rounds
    needs more of them than a median of ``repeats`` passes of one timing."""
    return max(9, 3 * repeats)


def paired_slowdown(rows: Sequence[Sequence[float]]) -> float:
    """How much slower a layer runs with every rank busy than on one rank alone, from rounds of paired timings: each
    row is one round's (forward, backward) seconds with every rank busy, then the seconds alone, back to back; the
    median round's ratio, at least 1. A round's two timings share its load, which on a shared host swings between
    rounds (as ``paired_fsdp_overheads``)."""
    return max(1.0, statistics.median((r[0] + r[1]) / r[2] for r in rows))


def host_contention(cfg: ModelConfig, batch: int, seq: int, device: torch.device, repeats: int
                    ) -> dict[str, Any] | None:
    """How much slower a layer runs with every rank of the node busy than on one rank alone while the others
    wait (``paired_slowdown`` over ``_paired_rounds(repeats)`` rounds; the same on every rank): on a CPU host the ranks
    share cores, and the cost model gives an idle pipeline rank's cores back to the busy ones. None on GPUs (one
    each)."""
    if device.type != "cpu":
        return None
    torch.manual_seed(0)
    block = Block(cfg).to(device)
    x, grad = _layer_input(cfg, batch, seq, device)
    _timed_passes(block, x, grad, 1, together=True)  # warm-up
    rows = []
    for _ in range(_paired_rounds(repeats)):
        busy = _timed_passes(block, x, grad, 1, together=True)[0]
        dist.barrier()
        alone = sum(_timed_passes(block, x, grad, 1, together=False)[0]) if dist.get_rank() == 0 else 0.0
        dist.barrier()
        rows.append([*busy, alone])  # the other ranks' 0 s alone: the slowest rank's is rank 0's
    return {"busy_ranks": dist.get_world_size(), "slowdown": paired_slowdown(slowest_rank(_gathered(rows)))}


def paired_fsdp_overheads(rows: Sequence[Sequence[float]], gather_s: float, scatter_s: float
                          ) -> list[dict[str, Any]]:
    """FSDP2's per-layer overhead entries from rounds of paired timings: each row is one round's (forward,
    backward) seconds of two plain blocks, then of the two blocks sharded with resharding, then without, run
    back to back. Per round, the sharded pair's time less the plain pair's, halved, less the collectives FSDP
    issues for one layer (all-gather forward, reduce-scatter backward, all-gather again backward when
    resharding); the median round.

    The overhead is a small difference of two large timings: taken as the difference of two medians, each over a
    few repeats minutes apart, a load swing on a shared host between them became the overhead (24-211 ms per
    layer over four passes of one launch). A round's timings share its load, so the swing cancels in the pair."""
    out = []
    for col, reshard in ((2, True), (4, False)):
        forward = statistics.median((r[col] - r[0]) / 2 - gather_s for r in rows)
        backward = statistics.median((r[col + 1] - r[1]) / 2 - scatter_s - (gather_s if reshard else 0.0)
                                     for r in rows)
        out.append({"parallelism": "fsdp", "reshard": reshard, "forward_ms": 1e3 * max(0.0, forward),
                    "backward_ms": 1e3 * max(0.0, backward)})
    return out


def fsdp_overheads(cfg: ModelConfig, batch: int, seq: int, device: torch.device, repeats: int,
                   collectives: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """FSDP2's own cost per layer beyond the plain layer and its collectives (hooks, copy-in/copy-out,
    DTensor bookkeeping), with and without resharding after forward, over all ranks of the node
    (``paired_fsdp_overheads``; the same on every rank).

    Two blocks under a parameterless root, as the runtime shards a model (the root's own parameters would
    not be resharded), against two plain blocks, the three run in turn in each of ``_paired_rounds(repeats)`` rounds
    (each pass as long as its slowest rank took, as ``layer_time``); the collectives FSDP issues are timed by the
    collective fit of this same profile."""
    from torch.distributed.fsdp import fully_shard

    from solvers.cost_model.profile import CollectiveTime, Profile

    world = dist.get_world_size()
    if world < 2:
        return []
    fit = Profile(collectives=[CollectiveTime.model_validate(c) for c in collectives])
    per_node = world // _nodes(world)  # the world group spans the nodes of a multi-node launch
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))

    def pair(reshard: bool | None) -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Sequential(Block(cfg), Block(cfg)).to(device)
        if reshard is not None:
            for block in model:
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model

    param_bytes = float(sum(p.numel() * p.element_size() for p in Block(cfg).parameters()))

    def coll(op: CollectiveOp) -> float:
        t = float(fit.collective_s(op, np.array(param_bytes), np.array(world), np.array(per_node)))
        return t if math.isfinite(t) else 0.0

    models = [pair(None), pair(True), pair(False)]
    x, grad = _layer_input(cfg, batch, seq, device)
    for model in models:  # warm-up
        _timed_passes(model, x, grad, 1, together=True)
    rows = []
    for i in range(_paired_rounds(repeats)):
        # each model first in a third of the rounds: a load that builds up within a round hits all three alike
        times = {k: _timed_passes(models[k], x, grad, 1, together=True)[0] for k in ((i + j) % 3 for j in range(3))}
        rows.append([t for k in range(3) for t in times[k]])
    return paired_fsdp_overheads(slowest_rank(_gathered(rows)), coll("allgather"), coll("reduce_scatter"))


def optimizer_s_per_param(cfg: ModelConfig, device: torch.device, repeats: int, blocks: int = 1) -> float:
    """Seconds per parameter of one AdamW step (the runtime's optimizer) on ``blocks`` blocks' parameters, every
    rank at once (the median step of the slowest rank's, as ``layer_time``). The whole model's layers
    (``measure_node``) rather than one block: one block's states stay in a CPU's caches, a model's do not (one
    block's rate was half the model's on this bench's CPU host)."""
    torch.manual_seed(0)
    params = [p for _ in range(blocks) for p in Block(cfg).to(device).parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)  # as worker.runtime.parallelize makes it
    for _ in range(2):
        opt.step()
    rows = []
    for _ in range(repeats):
        dist.barrier()  # every rank steps at once, as after a step's gradient sync; the slowest decides (layer_time)
        start = time.perf_counter()
        opt.step()
        rows.append([time.perf_counter() - start])
    return statistics.median(r[0] for r in slowest_rank(_gathered(rows))) / sum(p.numel() for p in params)


def _nodes(world: int) -> int:
    """Nodes of this launch: torchrun's ``LOCAL_WORLD_SIZE`` ranks per node (one node without it)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return max(1, world // max(1, local))


def _group_sets(world: int, nodes: int) -> list[tuple[list[list[int]], int]]:
    """Sets of disjoint groups to time at once, each with how many nodes each of its groups spans: contiguous
    groups of 2, 4, 8, 16 ranks (as tp groups, or dp groups over contiguous ranks, are laid out), and on a multi-node
    launch also the groups of one rank per node (a dp group across nodes under tp or cp inside a node). Where a
    node's ranks are not a multiple of a smaller group's, the groups that fit inside each node (the rest of its ranks
    sit the set out); a larger group that is not whole nodes is not timed: contiguous groups would straddle nodes
    unevenly, a layout no point could state. The set's time is its slowest group's."""
    local = world // nodes
    sets: list[tuple[list[list[int]], int]] = []
    for size in (2, 4, 8, 16):
        if local % size == 0 or (size % local == 0 and world % size == 0):
            sets.append(([list(range(s, s + size)) for s in range(0, world, size)], max(1, size // local)))
        elif size < local:
            sets.append(([list(range(n * local + i * size, n * local + (i + 1) * size))
                          for n in range(nodes) for i in range(local // size)], 1))
    if nodes > 1 and local > 1:
        sets.append(([[r + n * local for n in range(nodes)] for r in range(local)], nodes))
    return sets


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
                        sizes: Sequence[int] = MESSAGE_BYTES, pause: Pause = None) -> list[dict[str, Any]]:
    """Time per call of each collective by group size, placement (across nodes or not) and message bytes
    (``message_bytes`` is the full tensor: the all-reduced buffer, the gathered output, the reduce-scattered
    input, the all-to-all buffer)."""
    rank = dist.get_rank()
    out: list[dict[str, Any]] = []
    for groups, spans in _group_sets(world, _nodes(world)):
        mine: dist.ProcessGroup | None = None
        for ranks in groups:  # every rank creates every group, in the same order
            g = _group(ranks)
            if rank in ranks:
                mine = g
        size = len(groups[0])
        for op in ("allreduce", "allgather", "reduce_scatter", "alltoall"):
            for nbytes in sizes:
                # (a rank in no group of the set sits it out, joining only the barrier and the slowest-group max)
                fn = _collective_fn(op, nbytes, mine, size, device) if mine is not None else lambda: None
                dist.barrier()
                try:
                    assert fn is not None
                    t, lacking = _median_time(fn, repeats), 0.0
                except (RuntimeError, AssertionError):  # an op this backend lacks (older gloo)
                    t, lacking = 0.0, 1.0
                # a collective ends when its slowest member does; skipped on every rank where any lacks it
                agg = torch.tensor([t, lacking], dtype=torch.float64, device=device)
                dist.all_reduce(agg, op=dist.ReduceOp.MAX)
                if agg[1] > 0:
                    continue
                out.append({"op": op, "group_size": size, "across_nodes": spans > 1, "nodes": spans,
                            "message_bytes": float(nbytes),
                            "time_ms": 1e3 * float(agg[0])})
            if pause:
                pause()
    out.extend(profile_p2p(world, device, repeats, sizes))
    return out


def profile_p2p(world: int, device: torch.device, repeats: int, sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Send/recv between ranks 2i and 2i+1, all pairs at once (pipeline neighbours): within a node where a node's
    ranks pair up (or there is one node: an odd last rank sits out), else some pair spans two nodes and the slowest
    pair is the time."""
    rank = dist.get_rank()
    if world < 2:
        return []
    nodes = _nodes(world)
    across = nodes > 1 and (world // nodes) % 2 == 1
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
        out.append({"op": "p2p", "group_size": 2, "across_nodes": across, "nodes": 2 if across else 1,
                    "message_bytes": float(nbytes), "time_ms": 1e3 * float(agg[0])})
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


def measure_node(full: ModelConfig, batches: Sequence[int], seqs: Sequence[int], tps: Sequence[int] | None,
                 device: torch.device, repeats: int, name: str = "", pause: Pause = None,
                 cps: Sequence[int] | None = None) -> dict[str, Any]:
    """Every measurement of this module on the launched ranks (the process group is up): ``{"profile":
    <Profile>, "device": {...}}``, the same on every rank. ``full`` is the model (its dense layers are timed, and
    its MoE layer if it has one); ``tps`` default to the degrees dividing the heads and the world (the dense
    layer is also timed under DeepSpeed-Ulysses at each of them above 1), ``cps`` (ring attention) to 2, 4, 8
    where they divide the world (``[]``: none). ``pause``, if given, is called on every rank between two
    measurements (about 50 calls a pass), as the same collective code: a caller may run other work there (the
    closed-loop bench spreads its plans' steps over the pass). Its process groups are shared
    (``worker.runtime.groups``): made once a pass, and once for all its passes where the caller holds
    ``shared_process_groups`` open (the closed loop runs many passes in one launch; every gloo group adds threads)."""
    with shared_process_groups():
        return _measure_node(full, batches, seqs, tps, device, repeats, name, pause, cps)


def _measure_node(full: ModelConfig, batches: Sequence[int], seqs: Sequence[int], tps: Sequence[int] | None,
                  device: torch.device, repeats: int, name: str, pause: Pause, cps: Sequence[int] | None
                  ) -> dict[str, Any]:
    cfg = replace(full, moe=None)
    world = dist.get_world_size()
    tps = list(tps or []) or [t for t in (1, 2, 4, 8)
                              if t <= world and cfg.num_heads % t == 0 and cfg.num_kv_heads % t == 0]
    started = time.perf_counter()
    layers = profile_layers(cfg, batches, seqs, tps, device, repeats, pause)
    layers += profile_moe_layers(full, batches, seqs, device, repeats, pause, tps)
    cps = [c for c in (2, 4, 8) if c <= world and world % c == 0] if cps is None else cps
    layers += profile_context_parallel_layers(cfg, batches, seqs, cps, device, repeats, pause)
    layers += profile_ulysses_layers(cfg, batches, seqs, tps, device, repeats, pause)
    heads = profile_heads(cfg, batches, seqs, tps, device, repeats, pause)
    collectives = profile_collectives(world, device, repeats, pause=pause)
    # the overheads and the contention at a mid-sized batch of the first sequence length
    seq0 = layers[0]["seq"]
    plain = [x for x in layers if x["tp"] == 1 and x["seq"] == seq0 and x.get("layer_type", "dense") == "dense"
             and x.get("cp", 1) == 1 and x.get("ulysses", 1) == 1]
    mid = plain[len(plain) // 2]
    overheads = fsdp_overheads(cfg, int(mid["batch"]), seq0, device, repeats, collectives)
    if pause:
        pause()
    host = host_contention(cfg, int(mid["batch"]), seq0, device, repeats)
    if pause:
        pause()
    # as many of the model's blocks as fit in 2^26 parameters (a small model's whole stack; one block of a large one)
    with torch.device("meta"):
        block_params = sum(p.numel() for p in Block(cfg).parameters())
    blocks = max(1, min(full.num_layers, 2**26 // max(1, block_params)))
    rates = {**device_rates(device), "optimizer_s_per_param": optimizer_s_per_param(cfg, device, repeats, blocks)}
    cuda = device.type == "cuda"
    gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
    name = name or f"{gpu} x{world} {time.strftime('%Y-%m-%d %H:%M')}"
    return {"profile": {"name": name, "gpu": gpu, "stack": RUNTIME_STACK.model_dump(mode="json", exclude_unset=True),
                        "gpus_per_node": world // _nodes(world), "layer_times": layers, "head_times": heads,
                        "collectives": collectives, "overheads": overheads, **({"host": host} if host else {})},
            "device": {"name": gpu, "ranks": world, **rates, "torch_version": torch.__version__,
                       "profile_time_s": time.perf_counter() - started}}


def merge_profiles(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One document from several ``measure_node`` passes of the same launch: each measured point (a layer at a
    batch / seq / tp / sp / cp / ep / ulysses / type, a collective at an op / group / placement / size, an
    overhead) and each rate the median of its passes, so that a pass hit by a burst of background load does not
    decide it."""
    if not docs:
        raise ValueError("no profile passes to merge")

    def merged(entries: list[list[dict[str, Any]]], key: tuple[str, ...], values: tuple[str, ...]
               ) -> list[dict[str, Any]]:
        groups: dict[tuple[object, ...], list[dict[str, Any]]] = {}
        for pass_entries in entries:
            for e in pass_entries:
                groups.setdefault(tuple(e.get(k) for k in key), []).append(e)
        out = []
        for same in groups.values():
            row = dict(same[0])
            for v in values:
                if all(e.get(v) is not None for e in same):
                    row[v] = statistics.median(float(e[v]) for e in same)
            out.append(row)
        return out

    profiles = [d["profile"] for d in docs]
    profile = dict(profiles[0])
    profile["layer_times"] = merged([p["layer_times"] for p in profiles],
                                    ("batch", "seq", "tp", "sp", "cp", "ep", "ulysses", "layer_type"),
                                    ("forward_ms", "backward_ms"))
    profile["head_times"] = merged([p.get("head_times", []) for p in profiles], ("batch", "seq", "tp"),
                                   ("forward_ms", "backward_ms"))
    profile["collectives"] = merged([p["collectives"] for p in profiles],
                                    ("op", "group_size", "across_nodes", "nodes", "message_bytes"), ("time_ms",))
    profile["overheads"] = merged([p.get("overheads", []) for p in profiles], ("parallelism", "reshard"),
                                  ("forward_ms", "backward_ms"))
    hosts = [p["host"] for p in profiles if p.get("host")]
    if hosts:
        profile["host"] = {**hosts[0], "slowdown": statistics.median(h["slowdown"] for h in hosts)}
    device = dict(docs[0]["device"])
    for k in ("peak_tflops", "memory_bandwidth_GBps", "optimizer_s_per_param"):
        if all(k in d["device"] for d in docs):
            device[k] = statistics.median(d["device"][k] for d in docs)
    device["profile_time_s"] = sum(d["device"].get("profile_time_s", 0.0) for d in docs)
    device["passes"] = len(docs)
    return {"profile": profile, "device": device}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="ModelSpec JSON (a preset name or an object)")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--seqs", default="128")
    ap.add_argument("--tps", default="", help="tensor-parallel degrees (default: those dividing heads and world)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--inter-node-bandwidth-Gbps", type=float, default=None,
                    help="the nodes' network per node, as stated by whoever profiles (recorded, not measured)")
    args = ap.parse_args(argv)
    from solvers.specs import ModelSpec

    raw = json.loads(args.model) if args.model.strip().startswith("{") else {"preset": args.model}
    spec = ModelSpec.model_validate(raw)
    full = ModelConfig.from_spec(spec)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    doc = measure_node(full, [int(x) for x in args.batches.split(",")], [int(x) for x in args.seqs.split(",")],
                       [int(x) for x in args.tps.split(",") if x], device, args.repeats, args.name)
    doc["profile"]["model"] = spec.model_dump(mode="json", exclude_none=True)  # the layer shapes it timed
    if args.inter_node_bandwidth_Gbps is not None:
        doc["profile"]["inter_node_bandwidth_Gbps"] = args.inter_node_bandwidth_Gbps
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps(doc, indent=1))
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # see worker.runtime.train: gloo subgroups can abort in interpreter teardown
