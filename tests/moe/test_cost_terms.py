"""MoE cost terms against brute-force counts on small cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers.cost_model import communication as comm
from solvers.cost_model import moe

DIMS = moe.MoEDims(hidden=64, ffn=128, gated=True, num_experts=8, top_k=2, capacity_factor=1.25)
LINKS = comm.Links(intra_Bps=400e9, inter_Bps=40e9, gpus_per_node=8, intra_latency_s=0.0, inter_latency_s=0.0)
PEAK = 1e15


def flop_gemm(m: object, n: object, k: object) -> np.ndarray:
    """A GEMM at exactly peak: time is FLOPs / peak, so sums of times are sums of FLOPs."""
    return 2.0 * np.asarray(m, dtype=float) * np.asarray(n, dtype=float) * np.asarray(k, dtype=float) / PEAK


def test_load_is_the_imbalance_capped_by_the_capacity_factor() -> None:
    assert DIMS.load == pytest.approx(moe.LOAD_IMBALANCE)
    tight = moe.MoEDims(64, 128, True, 8, 2, capacity_factor=1.0)
    assert tight.load == 1.0  # tokens above capacity are dropped: no rank sees more than the mean
    assert moe.routed_rows(100.0, tight) == 200.0


@pytest.mark.parametrize(("ep", "etp", "crosses"), [(8, 1, False), (4, 2, False), (8, 2, True), (16, 1, True),
                                                    (2, 8, True), (1, 8, False)])
def test_ep_group_placement(ep: int, etp: int, crosses: bool) -> None:
    # brute force: ranks etp*i for i in range(ep) (stride etp), nodes of 8 consecutive ranks
    nodes = {(etp * i) // 8 for i in range(ep)}
    assert (len(nodes) > 1) == crosses
    assert bool(moe.alltoall_crosses_nodes(ep, etp, 8)) == crosses


def test_expert_compute_conserves_the_layers_flops() -> None:
    """Summed over every rank, expert GEMM time = the FLOPs of every routed copy through its expert."""
    tokens = 512.0  # per rank
    world = 16
    gated_mats = 3
    total_rows = tokens * world * DIMS.top_k * DIMS.load
    expected = 2.0 * total_rows * gated_mats * DIMS.hidden * DIMS.ffn / PEAK
    router = 2.0 * tokens * world * DIMS.num_experts * DIMS.hidden / PEAK
    for ep, etp in itertools.product((1, 2, 4, 8), (1, 2)):
        per_rank = moe.expert_forward_s(flop_gemm, tokens, ep, etp, False, DIMS)
        assert world * float(per_rank) == pytest.approx(expected + router, rel=1e-12)


def test_expert_tp_splits_weights_not_work() -> None:
    base = moe.expert_forward_s(flop_gemm, 256.0, 4, 1, False, DIMS)
    split = moe.expert_forward_s(flop_gemm, 256.0, 4, 2, False, DIMS)
    assert float(split) == pytest.approx(float(base))  # twice the rows (gathered), half the width
    assert float(moe.expert_tp_forward_s(256.0, 1, False, DIMS, 2.0, LINKS)) == 0.0
    assert float(moe.expert_tp_forward_s(256.0, 2, False, DIMS, 2.0, LINKS)) > 0.0


def test_alltoall_uses_the_right_link_and_lsh_scales_bytes() -> None:
    tokens = 4096.0
    intra = float(moe.alltoall_forward_s(tokens, 8, 1, False, DIMS, 2.0, LINKS))
    inter = float(moe.alltoall_forward_s(tokens, 8, 8, False, DIMS, 2.0, LINKS))
    nbytes = tokens * DIMS.top_k * DIMS.load * DIMS.hidden * 2.0
    # brute force: an all-to-all sends (n-1)/n of the rows; two of them (dispatch, combine)
    assert intra == pytest.approx(2 * 7 / 8 * nbytes / LINKS.intra_Bps)
    assert inter == pytest.approx(2 * 7 / 8 * nbytes / LINKS.inter_Bps)
    lsh = float(moe.alltoall_forward_s(tokens, 8, 8, True, DIMS, 2.0, LINKS))
    assert lsh == pytest.approx(moe.LSH_COMPRESSION_RATE * inter)
    assert float(moe.alltoall_forward_s(tokens, 1, 8, False, DIMS, 2.0, LINKS)) == 0.0


def test_lsh_costs_hashing_and_residual_memory_only_when_on() -> None:
    hbm = lambda b: np.asarray(b, dtype=float) / 3e12  # noqa: E731
    on = moe.lsh_hash_forward_s(flop_gemm, hbm, np.array([1024.0, 1024.0]), np.array([True, False]), DIMS, 2.0)
    assert on[0] > 0 and on[1] == 0
    res = moe.lsh_residual_bytes(1024.0, np.array([True, False]), DIMS, 2.0)
    assert res[0] == pytest.approx(1024 * 2 * DIMS.load * (64 * 2 + 8)) and res[1] == 0


def test_expert_states_shard_over_ep_and_etp_and_sync_over_the_rest() -> None:
    params = 8 * 3 * 64 * 128
    for ep, etp, world in [(1, 1, 8), (8, 1, 8), (4, 2, 16), (2, 4, 64)]:
        local = float(moe.expert_params_per_rank(params, ep, etp))
        edp = float(moe.expert_dp(world, ep, etp))
        assert local * ep * etp == pytest.approx(params)
        assert edp * ep * etp == world  # every rank belongs to exactly one (etp, ep, edp) coordinate
