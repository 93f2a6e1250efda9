"""``worker.profiler``'s timing rule: with every rank measuring at once, a repeat lasts as long as its slowest rank
took (a synchronised plan waits for the last rank), on every rank alike."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from worker.profiler import layer_time, slowest_rank
from worker.runtime.model import ModelConfig

CFG = ModelConfig(num_layers=1, hidden_size=16, num_heads=2, num_kv_heads=2, head_dim=8, ffn_hidden_size=32,
                  vocab_size=32)


def test_each_part_of_a_repeat_takes_its_slowest_rank() -> None:
    ranks = [[[1.0, 2.0], [5.0, 1.0]],  # rank 0: (forward, backward) of repeats 0 and 1
             [[2.0, 1.5], [1.0, 3.0]]]  # rank 1
    assert slowest_rank(ranks) == [[2.0, 2.0], [5.0, 3.0]]
    assert slowest_rank([[[0.5]], [[0.25]], [[0.75]]]) == [[0.75]]


class _Slow(torch.nn.Module):
    """A linear layer whose forward sleeps ``delay`` seconds (on the rank that makes it so)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.lin, self.delay = torch.nn.Linear(16, 16), delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.lin(x)


def _rank(rank: int, port: int, out: dict[int, tuple[float, float]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        out[rank] = layer_time(CFG, 1, 4, torch.device("cpu"), 3, block=_Slow(0.08 if rank == 1 else 0.0))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_a_repeat_lasts_until_the_slowest_rank_is_done_on_every_rank() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(port, out), nprocs=2)
        times = dict(out)
    assert times[0] == times[1]  # the same on every rank
    forward, backward = times[0]
    assert forward >= 0.08 and backward < 0.08  # rank 1's slow forward (not rank 0's fast one), outside backward
    alone = layer_time(CFG, 1, 4, torch.device("cpu"), 3, block=_Slow(0.0))  # no process group: this process's own
    assert alone[0] < 0.08
