"""Megatron tensor parallelism (+ sequence parallelism) with DTensor's ``parallelize_module``.

Attention projections and the MLP's first matrices are split by columns, ``wo`` / ``w2`` by rows, so a block
needs one all-reduce (or, with sequence parallelism, one all-gather + one reduce-scatter) per sub-layer.
With ``sequence_parallel`` the norms and residual stream hold 1/tp of the sequence between sub-layers; the norms'
weights are then replicated while each tp rank saw its own slice of the sequence, so their gradients are partial
sums, reduced once per step by ``reduce_partial_gradients`` (Megatron-LM's all-reduce of the sequence-parallel
norm gradients).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from worker.runtime.data_parallel import all_reduce_flat
from worker.runtime.model import FeedForward, blocks


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, sequence_parallel: bool,
                          vocab_parallel_loss: bool = False) -> None:
    """Shard ``model`` (a Decoder or a pipeline stage of one) over the 1-D ``mesh`` in place, every layer and the
    embedding / LM head alike (see ``tensor_parallel_ends`` and ``tensor_parallel_block``)."""
    tensor_parallel_ends(model, mesh, sequence_parallel, sequence_parallel, vocab_parallel_loss)
    for block in blocks(model).values():
        tensor_parallel_block(block, mesh, sequence_parallel)


def tensor_parallel_ends(model: nn.Module, mesh: DeviceMesh, embedding_sp: bool, head_sp: bool,
                         vocab_parallel_loss: bool = False) -> None:
    """Vocabulary-parallel embedding and LM head of ``model`` (those it has) over the 1-D ``mesh``, in place.

    ``embedding_sp``: the embedding's output is sharded over the sequence (reduce-scatter), else replicated
    (all-reduce); ``head_sp``: the final norm takes a sequence shard (Megatron SP) and the head gathers it.
    With ``vocab_parallel_loss`` the LM head returns logits sharded over the vocabulary (a DTensor) and the
    loss must run under ``torch.distributed.tensor.parallel.loss_parallel()`` (Megatron's vocab-parallel
    cross-entropy: no all-gather of the logits); otherwise the logits are all-gathered."""
    top: dict[str, Any] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                output_layouts=Shard(1) if embedding_sp else Replicate())
    head_input = Shard(1) if head_sp else Replicate()
    if getattr(model, "norm", None) is not None and head_sp:
        top["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        if vocab_parallel_loss:
            top["output"] = ColwiseParallel(input_layouts=head_input, output_layouts=Shard(-1),
                                            use_local_output=False)
        else:
            top["output"] = ColwiseParallel(input_layouts=head_input, output_layouts=Replicate())
    if top:
        parallelize_module(model, mesh, top)


def tensor_parallel_block(block: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron TP of one transformer block over the 1-D ``mesh``, in place; with ``sequence_parallel`` its input
    and output are sequence shards."""
    residual = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=residual),
    }
    # An MoE MLP (``moe.MoELayer``) is laid out by ``expert_parallel`` instead: it takes the residual
    # layout as it is (this rank's sequence shard under SP) and returns it so.
    dense = isinstance(block.get_submodule("feed_forward"), FeedForward)
    if dense:
        plan.update({"feed_forward.w1": ColwiseParallel(),
                     "feed_forward.w2": RowwiseParallel(output_layouts=residual)})
    if dense and getattr(block.get_submodule("feed_forward"), "w3", None) is not None:
        plan["feed_forward.w3"] = ColwiseParallel()
    # The sub-layer input becomes one DTensor at the attention / MLP boundary (all-gathered from the
    # sequence shards under SP), so backward reduces its gradient once per sub-layer as in Megatron,
    # not once per projection that reads it (q, k, v; w1, w3).
    enter = PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),))
    plan.update({"attention": enter, **({"feed_forward": enter} if dense else {})})
    if sequence_parallel:
        plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
    parallelize_module(block, mesh, plan)


@torch.no_grad()
def reduce_partial_gradients(params: Iterable[nn.Parameter]) -> None:
    """Sum the gradients that are partial over a mesh dimension (a Megatron-SP norm's: ``Partial``) over it, one
    flat all-reduce per (mesh, dimension) for all of them, leaving them ``Replicate`` there.

    Left partial, the optimizer would redistribute each such gradient inside every elementwise op that reads it:
    a few all-reduces per tensor and step, one tensor at a time (on 4 gloo ranks, AdamW on a tp4 x SP model took
    about 300 ms instead of about 30 ms)."""
    groups: dict[tuple[DeviceMesh, int, str], list[nn.Parameter]] = {}
    for p in params:
        if isinstance(g := p.grad, DTensor):
            for dim, placement in enumerate(g.placements):
                if isinstance(placement, Partial):
                    groups.setdefault((g.device_mesh, dim, placement.reduce_op), []).append(p)
    for (mesh, dim, reduce_op), ps in groups.items():
        if reduce_op not in ("sum", "avg"):
            raise ValueError(f"a gradient partial by {reduce_op!r}: only sum and avg are reduced")
        grads = [g for p in ps if isinstance(g := p.grad, DTensor)]  # all of them: only DTensor gradients got here
        # (under no_grad a DTensor's to_local is its very storage: reduced in place)
        all_reduce_flat([g.to_local() for g in grads], mesh.get_group(dim), mesh.size(dim) if reduce_op == "avg" else 1)
        for p, g in zip(ps, grads, strict=True):
            placements = [Replicate() if i == dim else x for i, x in enumerate(g.placements)]
            p.grad = DTensor.from_local(g.to_local(), mesh, placements, run_check=False, shape=g.shape,
                                        stride=g.stride())
