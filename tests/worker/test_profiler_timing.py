"""``worker.profiler``'s timing rules: with every rank measuring at once, a repeat lasts as long as its slowest rank
took (a synchronised plan waits for the last rank), on every rank alike; FSDP2's overhead, a small difference of
two large timings, is taken from paired rounds."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import pytest
import torch

from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.cost_model.fitting import CollectiveMeasurement, profile_measurements
from solvers.cost_model.profile import Profile
from tests.worker.two_ranks import on_two_ranks
from worker.profiler import (
    fsdp_overheads,
    host_contention,
    layer_time,
    paired_fsdp_overheads,
    paired_slowdown,
    profile_collectives,
    profile_heads,
    slowest_rank,
)
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


def _layer_time_with_a_slow_rank_1(rank: int) -> tuple[float, float]:
    return layer_time(CFG, 1, 4, torch.device("cpu"), 3, block=_Slow(0.08 if rank == 1 else 0.0))


@pytest.mark.timeout(60)
def test_a_repeat_lasts_until_the_slowest_rank_is_done_on_every_rank() -> None:
    times = on_two_ranks(_layer_time_with_a_slow_rank_1)
    assert times[0] == times[1]  # the same on every rank
    forward, backward = times[0]
    assert forward >= 0.08 and backward < 0.08  # rank 1's slow forward (not rank 0's fast one), outside backward
    alone = layer_time(CFG, 1, 4, torch.device("cpu"), 3, block=_Slow(0.0))  # no process group: this process's own
    assert alone[0] < 0.08


# (forward, backward) seconds of one plain block and FSDP2's own per-layer overhead, with and without resharding
PLAIN, GATHER, SCATTER = (0.30, 0.55), 0.004, 0.005
RESHARD, KEEP = (0.010, 0.030), (0.006, 0.012)


def _rounds(loads: list[float]) -> list[list[float]]:
    """Paired rounds of two plain blocks, two sharded with resharding, two without, each round under its own
    load (a multiple of the compute)."""
    rows = []
    for load in loads:
        f, b = 2 * PLAIN[0] * load, 2 * PLAIN[1] * load
        rows.append([f, b, f + 2 * (GATHER + RESHARD[0]), b + 2 * (SCATTER + GATHER + RESHARD[1]),
                     f + 2 * (GATHER + KEEP[0]), b + 2 * (SCATTER + KEEP[1])])
    return rows


def test_the_fsdp_overhead_is_the_median_paired_difference_whatever_the_load_of_each_round() -> None:
    loads = [1.0, 2.5, 1.4, 3.0, 1.1, 2.0, 1.7, 2.8, 1.2]  # a shared host: the load swings 3x between rounds
    got = {o["reshard"]: o for o in paired_fsdp_overheads(_rounds(loads), GATHER, SCATTER)}
    for reshard, (forward, backward) in ((True, RESHARD), (False, KEEP)):
        assert got[reshard]["parallelism"] == "fsdp"
        assert got[reshard]["forward_ms"] == pytest.approx(1e3 * forward)
        assert got[reshard]["backward_ms"] == pytest.approx(1e3 * backward)
    # negative control: the same timings unpaired (each sharded pass set against the plain pass of the next round)
    rows = _rounds(loads)
    shifted = [[*rows[(i + 1) % len(rows)][:2], *row[2:]] for i, row in enumerate(rows)]
    off = {o["reshard"]: o for o in paired_fsdp_overheads(shifted, GATHER, SCATTER)}
    assert abs(off[True]["backward_ms"] - 1e3 * RESHARD[1]) > 50


def test_the_host_slowdown_is_the_median_paired_ratio_whatever_the_load_of_each_round() -> None:
    loads = [1.0, 2.5, 1.4, 3.0, 1.1, 2.0, 1.7, 2.8, 1.2]
    rows = [[0.6 * 2.2 * load, 1.1 * 2.2 * load, 1.7 * load] for load in loads]  # busy 2.2x slower than alone
    assert paired_slowdown(rows) == pytest.approx(2.2)
    assert paired_slowdown([[0.5, 0.5, 1.5]]) == 1.0  # never faster busy than alone
    # negative control: each busy pass set against the next round's alone pass
    shifted = [[*row[:2], rows[(i + 1) % len(rows)][2]] for i, row in enumerate(rows)]
    assert abs(paired_slowdown(shifted) - 2.2) > 0.3


def _fsdp_and_host(rank: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    collectives = profile_collectives(2, torch.device("cpu"), 2)
    return (fsdp_overheads(CFG, 1, 4, torch.device("cpu"), 1, collectives),
            host_contention(CFG, 1, 4, torch.device("cpu"), 1))


@pytest.mark.timeout(120)
def test_fsdp_overheads_and_host_contention_are_measured_on_real_ranks_and_agree_on_every_rank() -> None:
    got = on_two_ranks(_fsdp_and_host)
    assert got[0] == got[1]  # one figure for the node, whichever rank reports it
    overheads, host = got[0]
    assert sorted(o["reshard"] for o in overheads) == [False, True]
    assert all(0 <= o["forward_ms"] < 1e4 and 0 <= o["backward_ms"] < 1e4 for o in overheads)
    assert host["busy_ranks"] == 2 and 1.0 <= host["slowdown"] < 100
    Profile.model_validate({"overheads": overheads, "host": host})  # the profile document takes them as they come


def _heads(rank: int) -> list[dict[str, Any]]:
    return profile_heads(CFG, [1, 8], [16], [2], torch.device("cpu"), 3)


@pytest.mark.timeout(120)
def test_the_head_is_timed_as_the_runtime_runs_it_on_every_tp_and_agrees_on_every_rank() -> None:
    """The final norm, LM head and loss at tp 1 and vocabulary-parallel over the 2 ranks (DTensor logits, the loss
    under loss_parallel: without it the sharded loss's backward raises), one figure for the node."""
    got = on_two_ranks(_heads)
    assert got[0] == got[1]
    rows = {(r["tp"], r["batch"]): r for r in got[0]}
    assert set(rows) == {(1, 1), (1, 8), (2, 1), (2, 8)}
    assert all(r["seq"] == 16 and 0 < r["forward_ms"] < 1e4 and 0 < r["backward_ms"] < 1e4 for r in rows.values())
    profile = Profile.model_validate({"head_times": got[0]})  # the profile document takes them as they come
    assert profile.head_s(8, 16, 2) is not None and profile.head_s(8, 16, 4) is None


def _collectives_on_two_nodes_of_one_rank(rank: int) -> list[dict[str, Any]]:
    os.environ["LOCAL_WORLD_SIZE"] = "1"  # as torchrun sets it on each of two nodes of one rank
    return profile_collectives(2, torch.device("cpu"), 2, sizes=[2**10, 2**16])


@pytest.mark.timeout(120)
def test_collectives_across_nodes_state_the_nodes_they_spanned_and_fit_the_network() -> None:
    """On two real gloo ranks launched as two nodes of one rank each, every collective and the send/recv pair span
    both nodes and say so: a profile of them (its launch's one rank per node) is a set of measurements of the
    network, which a calibration fit then prices."""
    got = on_two_ranks(_collectives_on_two_nodes_of_one_rank)
    assert got[0] == got[1]
    assert {(c["op"], c["across_nodes"], c.get("nodes")) for c in got[0]} == {
        (op, True, 2) for op in ("allreduce", "allgather", "reduce_scatter", "alltoall", "p2p")}
    model = {"name": "tiny", "num_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 32}
    profile = Profile.model_validate({
        "model": model, "stack": {"framework": "paraplan"}, "gpus_per_node": 1, "collectives": got[0],
        "layer_times": [{"batch": 1, "seq": 16, "tp": 1, "forward_ms": 1.0, "backward_ms": 2.0}]})
    measured = [m for m in profile_measurements(profile, "cpu") if isinstance(m, CollectiveMeasurement)]
    assert len(measured) == len(got[0]) and all(m.ranks_per_node == 1 and m.cluster.nodes == 2 for m in measured)
    slow_net = replace(DEFAULT_CALIBRATION, inter_efficiency=DEFAULT_CALIBRATION.inter_efficiency / 2)
    assert all(m.predicted_s(slow_net) > m.predicted_s(DEFAULT_CALIBRATION) for m in measured)


def _collectives_on_a_node_of_three_ranks(rank: int) -> list[dict[str, Any]]:
    return profile_collectives(3, torch.device("cpu"), 2, sizes=[2**10])


@pytest.mark.timeout(120)
def test_a_node_of_an_odd_rank_count_times_the_pair_that_fits_while_the_third_rank_sits_it_out() -> None:
    """Three real gloo ranks on one node: the pair of ranks 0 and 1 is timed (rank 2 sits the set out, joining only
    the barrier and the slowest-group maximum: before, no pair was timed at all), every rank has the same points,
    and every point states the one node it ran on, the send/recv pair's too (before, an odd node's pairs were
    recorded across two nodes even on one; ``_group_sets``: on several nodes of an odd rank count no group
    straddles them unevenly)."""
    got = on_two_ranks(_collectives_on_a_node_of_three_ranks, n=3)
    assert got[0] == got[1] == got[2]
    placed = {(c["op"], c["group_size"], c["across_nodes"], c.get("nodes")) for c in got[0]}
    ops = ("allreduce", "allgather", "reduce_scatter", "alltoall")
    assert {(op, 2, False, 1) for op in ops} <= placed and all(c["time_ms"] > 0 for c in got[0])
    assert all(not c["across_nodes"] and c.get("nodes") == 1 for c in got[0])  # (the send/recv pair too)
