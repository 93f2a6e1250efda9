"""The runtime broken on purpose, one thing at a time: the negative controls of the equivalence and cp tests.

Each fault patches one attribute of the runtime for the duration of a ``with fault(name)`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

from worker.runtime.flexsp import Packed
from worker.runtime.flexsp import pack as _pack  # the real one, for the fault that replaces it


def _local_positions(local_length: int, cp_rank: int, cp: int, device: torch.device | None = None) -> torch.Tensor:
    return torch.arange(local_length, device=device)


def _contiguous_chunks(x: torch.Tensor, dim: int, cp_rank: int, cp: int) -> torch.Tensor:
    return x.chunk(cp, dim=dim)[cp_rank].contiguous()


def _unmerged(*args: Any) -> None:
    return None


def _dp_only(layout: Any) -> tuple[str, ...]:
    return ("dp",)


def _no_relayout(x: torch.Tensor, *_: Any) -> torch.Tensor:
    return x


def _no_reduction(self: Any) -> None:
    return None


def _one_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Any, causal: bool
                          ) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _pack_labels_across_sequences(sequences: Any, sp: int, sp_rank: int) -> Any:
    whole = _pack(sequences, 1, 0)
    inputs = whole.inputs[0]
    labels = torch.cat([inputs[1:], sequences[-1][-1:]])  # each sequence's last token predicts the next one's first
    pad = -len(inputs) % sp
    if pad:
        inputs, labels = torch.cat([inputs, inputs.new_zeros(pad)]), torch.cat([labels, labels.new_full((pad,), -100)])
    part = len(inputs) // sp
    sl = slice(sp_rank * part, (sp_rank + 1) * part)
    return Packed(inputs[sl][None], labels[sl][None], whole.segments + ((pad,) if pad else ()))


def _no_gradient_sum(model: Any) -> None:
    return None


FAULTS: dict[str, tuple[str, Callable[..., Any] | property]] = {
    # rotary at the rank's local positions 0..s/cp-1 instead of its chunks' global ones
    "local-positions": ("worker.runtime.model.chunk_positions", _local_positions),
    # each rank fed a contiguous 1/cp of the sequence, not the two load-balanced chunks the ring's masks assume
    "contiguous-chunks": ("worker.runtime.data.shard_sequence", _contiguous_chunks),
    # the ring steps after the first dropped: no rank's result takes in the other ranks' K/V
    "ring-unmerged": ("worker.runtime.ring_attention._merge", _unmerged),
    # gradients averaged over dp only, not over the cp ranks that replicate the weights
    "cp-grads-unsynced": ("worker.runtime.parallelize.data_dims", _dp_only),
    # every layer takes its input as the previous layer left it
    "skip-relayout": ("worker.runtime.layouts.relayout", _no_relayout),
    # ZeRO-0/1 parameters keep each rank's own gradient
    "skip-replicated-sync": ("worker.runtime.data_parallel.ReplicatedParameters.reduce_gradients", _no_reduction),
    # the re-layouts' backward does not rescale between layouts of different data-parallel sizes
    "unscaled-relayout": ("solvers.run_layout.LayerLayout.data_ranks", property(lambda self: 1)),
    # FlexSP: a group's packed sequence attended as one causal sequence (no block-diagonal mask)
    "flexsp-no-block-mask": ("worker.runtime.model.varlen_attention", _one_causal_attention),
    # FlexSP: labels shifted along the packed stream, not per sequence (a sequence's last token predicts the next
    # sequence's first)
    "flexsp-labels-across-sequences": ("worker.runtime.flexsp.pack", _pack_labels_across_sequences),
    # FlexSP: each rank steps with its own gradient, not the sum over all ranks
    "flexsp-grads-not-reduced": ("worker.runtime.flexsp.all_reduce_gradients", _no_gradient_sum),
}


@contextlib.contextmanager
def fault(name: str | None) -> Iterator[None]:
    """Run the block with fault ``name`` in place (None: as the runtime is)."""
    if name is None:
        yield
        return
    target, replacement = FAULTS[name]
    with mock.patch(target, replacement):
        yield
