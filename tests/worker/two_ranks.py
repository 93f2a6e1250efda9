"""Run a function on real gloo processes (two, or ``n``) and collect what each returns (``measure`` must be
importable: ``mp.spawn`` pickles it by reference)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import free_port


def _on_rank(rank: int, port: int, out: dict[int, Any], measure: Callable[[int], Any], world: int = 2) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out[rank] = measure(rank)
    finally:
        dist.destroy_process_group()


def on_two_ranks(measure: Callable[[int], Any], n: int = 2) -> dict[int, Any]:
    """``measure(rank)`` on each of two (or ``n``) real gloo processes, by rank."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_on_rank, args=(free_port(), out, measure, n), nprocs=n)
        return dict(out)
