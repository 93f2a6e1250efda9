"""Context parallelism broken on purpose, one thing at a time: the negative controls of the cp tests.

Each fault patches one function of the runtime for the duration of a ``with fault(name)`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch


def _local_positions(local_length: int, cp_rank: int, cp: int, device: torch.device | None = None) -> torch.Tensor:
    return torch.arange(local_length, device=device)


def _contiguous_chunks(x: torch.Tensor, dim: int, cp_rank: int, cp: int) -> torch.Tensor:
    return x.chunk(cp, dim=dim)[cp_rank].contiguous()


def _unmerged(*args: Any) -> None:
    return None


def _dp_only(mesh: Any, plan: Any) -> Any:
    return mesh["dp"]


FAULTS: dict[str, tuple[str, Callable[..., Any]]] = {
    # rotary at the rank's local positions 0..s/cp-1 instead of its chunks' global ones
    "local-positions": ("worker.runtime.model.chunk_positions", _local_positions),
    # each rank fed a contiguous 1/cp of the sequence, not the two load-balanced chunks the ring's masks assume
    "contiguous-chunks": ("worker.runtime.data.shard_sequence", _contiguous_chunks),
    # the ring steps after the first dropped: no rank's result takes in the other ranks' K/V
    "ring-unmerged": ("worker.runtime.ring_attention._merge", _unmerged),
    # gradients averaged over dp only, not over the cp ranks that replicate the weights
    "cp-grads-unsynced": ("worker.runtime.parallelize.data_parallel_mesh", _dp_only),
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
