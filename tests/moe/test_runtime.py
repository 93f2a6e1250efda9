"""Expert-parallel MoE and LSH-MoE compression on 4 gloo ranks (one spawn for every case: ep_harness.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("moe") / "result.json"
    proc = subprocess.run([sys.executable, "-m", "tests.moe.ep_harness", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: list[dict[str, Any]] = json.loads(out.read_text())
    assert len(result) == 4
    return result


@pytest.mark.parametrize("case", ["equal", "equal_gelu", "equal_capacity"])
def test_expert_parallel_matches_single_process(ranks: list[dict[str, Any]], case: str) -> None:
    for r in ranks:
        c = r[case]
        assert c["out_scale"] > 0.1  # outputs are not trivially zero
        # float64 on both sides: only summation order differs
        assert c["out"] < 1e-12 and c["dx"] < 1e-12
        assert c["router"] < 1e-12 and c["experts"] < 1e-12
        assert c["rate"] == 1.0  # without compression every byte is sent
        assert c["calls"] == 5  # counts, dispatch, combine forward; combine, dispatch backward
    if case == "equal_capacity":  # capacity factor 1.0 drops copies on at least one rank, identically
        assert min(r[case]["kept_copies"] for r in ranks) < 60
    else:
        assert all(r[case]["kept_copies"] == 60 for r in ranks)


def test_lsh_compresses_clustered_tokens_to_a_quarter(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        c = r["lsh_clustered"]
        assert c["plain_rate"] == 1.0
        assert c["rate"] <= 0.25, c
        assert c["bytes_sent"] < c["bytes_uncompressed"]
        assert c["alltoall_s"] > 0
        assert c["dx_finite"] and c["grads_reach_experts"]


def test_lsh_error_is_bounded_by_the_cluster_spread(ranks: list[dict[str, Any]]) -> None:
    """Per token copy routed to expert E with weight w: the error is w (E(c) - E(x) + x - c), so
    |err| <= w (1 + Lip(E)) |x - c|. A bucket holds copies of one cluster (centers ~ sqrt(h) apart, noise
    spread 5%), so x - c = n_x - mean(n over the bucket), and per bucket sum |n_i - mean|^2 <= sum |n_i|^2.
    Summing over top_k copies (w <= 1): |dY|_F <= (1 + Lip) sqrt(top_k sum_i |n_i|^2). Relative to the
    residual stream x + y that the next layer reads, this bound is ~ (1 + Lip) sqrt(2) x spread."""
    for r in ranks:
        c = r["lsh_clustered"]
        bound = (1 + c["lipschitz"]) * math.sqrt(c["top_k"] * c["noise_sq"])
        assert c["err"] <= bound, c
        assert c["err"] / c["stream_norm"] <= bound / c["stream_norm"] <= 0.25
        assert c["err"] > 0  # compression is approximate on noisy clusters: the test measures something


def test_lsh_does_not_compress_unclustered_tokens(ranks: list[dict[str, Any]]) -> None:
    # 6 hashes x 32 buckets each: independent Gaussian tokens almost never share every code
    for r in ranks:
        assert r["lsh_unclustered"]["rate"] > 0.9
