"""Run a function on two real gloo processes and collect what each returns (``measure`` must be importable:
``mp.spawn`` pickles it by reference)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import free_port


def _on_rank(rank: int, port: int, out: dict[int, Any], measure: Callable[[int], Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out[rank] = measure(rank)
    finally:
        dist.destroy_process_group()


def on_two_ranks(measure: Callable[[int], Any]) -> dict[int, Any]:
    """``measure(rank)`` on each of two real gloo processes, by rank."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_on_rank, args=(free_port(), out, measure), nprocs=2)
        return dict(out)
