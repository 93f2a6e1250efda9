"""The fits of bench/flexsp_runtime.py's calibration recover known constants from synthetic timings."""

from __future__ import annotations

import random
from types import ModuleType

import pytest

from tests.bench_module import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("flexsp_runtime.py")


def cost(pieces: tuple[int, ...], beta: float, alpha2: float, alpha1: float) -> float:
    return beta + alpha2 * sum(pieces) + alpha1 * sum(s * s for s in pieces)


def test_the_compute_fit_recovers_beta_alpha2_alpha1(bench: ModuleType) -> None:
    grid = [(n,) for n in bench.COMPUTE_SINGLE] + list(bench.COMPUTE_PACKED)
    rng = random.Random(0)
    points = [(p, cost(p, 12.0, 0.8, 0.002) * rng.uniform(0.98, 1.02)) for p in grid]
    fit = bench.fit_compute(points)
    assert fit["beta_ms"] == pytest.approx(12.0, rel=0.5)
    assert fit["alpha2_ms_per_token"] == pytest.approx(0.8, rel=0.1)
    assert fit["alpha1_ms_per_token2"] == pytest.approx(0.002, rel=0.1)
    assert fit["rel_rms"] < 0.05


def test_the_compute_fit_keeps_constants_non_negative(bench: ModuleType) -> None:
    # linear timings with a negative intercept: least squares would give beta < 0; the fit clamps it at 0
    points = [((n,), 0.5 * n - 20.0) for n in (64, 128, 256, 512, 768)]
    fit = bench.fit_compute(points)
    assert fit["beta_ms"] == 0.0 and fit["alpha1_ms_per_token2"] >= 0.0 and fit["alpha2_ms_per_token"] > 0.0
    for (n,), ms in points[2:]:  # (alpha1 takes up the curvature a zero beta leaves)
        assert cost((n,), fit["beta_ms"], fit["alpha2_ms_per_token"], fit["alpha1_ms_per_token2"]) == pytest.approx(
            ms, rel=0.1)


def test_the_bandwidth_fit_is_megabytes_per_millisecond(bench: ModuleType) -> None:
    points = [(mb, mb / 0.03) for mb in (0.5, 1.0, 2.0, 3.0)]  # 0.03 GB/s = 0.03 MB/ms
    assert bench.fit_bandwidth(points) == pytest.approx(0.03)


def test_the_activation_fit_is_the_slope_in_megabytes(bench: ModuleType) -> None:
    points = [(n, 4096.0 + n * 25_000.0) for n in bench.ACTIVATION_LENGTHS]
    per_token, at_zero = bench.fit_activation(points)
    assert per_token == pytest.approx(25_000 / 2**20) and at_zero == pytest.approx(4096 / 2**20, abs=1e-9)


def test_the_memory_limit_leaves_the_stated_tokens_per_gpu(bench: ModuleType) -> None:
    from solvers.flexsp.request import parse_request

    cal = {"compute": {"beta_ms": 1.0, "alpha2_ms_per_token": 1.0, "alpha1_ms_per_token2": 1e-3},
           "alltoall_GBps_by_group_size": {2: 0.03, 4: 0.02}, "activation_mb_per_token": 0.0242,
           "params_billion": 0.00046}
    for name, (_, _, capacity, _) in bench.PLANS.items():
        _, consts = parse_request(bench.request(cal, name, [100, 200]))
        assert consts.token_capacity_per_gpu == capacity


def test_the_in_step_bandwidth_is_what_the_time_exceeds_the_compute_by(bench: ModuleType) -> None:
    compute = {"beta_ms": 10.0, "alpha2_ms_per_token": 0.3, "alpha1_ms_per_token2": 2e-4}
    mb_per_token, d, bw = 0.004, 4, 0.02  # bw in MB/ms
    points = [(s, 10.0 + (0.3 * s + 2e-4 * s * s) / d + mb_per_token * s / d / bw) for s in bench.SP_LENGTHS]
    assert bench.fit_in_step_bandwidth(points, d, compute, mb_per_token) == pytest.approx(bw)
    # faster than the compute alone (noise): the communication is floored, the bandwidth stays finite
    fast = [(s, 10.0 + (0.3 * s) / d) for s in bench.SP_LENGTHS]
    assert 0 < bench.fit_in_step_bandwidth(fast, d, compute, mb_per_token) < float("inf")
