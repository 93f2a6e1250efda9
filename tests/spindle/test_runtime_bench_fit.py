"""The fits of bench/spindle_runtime.py's calibration recover known constants from synthetic timings, in the
Spindle cost model's own forms (so a calibrated request reproduces what was measured)."""

from __future__ import annotations

from types import ModuleType

import pytest

from solvers.spindle.cost import Topology, allreduce_by_node_s
from tests.bench_module import load_bench


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("spindle_runtime.py")


def test_layer_fit_recovers_slope_and_intercept(bench: ModuleType) -> None:
    points = [(b, 0.8 + 0.35 * b) for b in (2, 3, 4, 8)]
    fit = bench.fit_layer(points)
    assert fit["slope_ms_per_sample"] == pytest.approx(0.35) and fit["intercept_ms"] == pytest.approx(0.8)


def test_link_fit_reproduces_the_cost_models_all_reduce(bench: ModuleType) -> None:
    """Timings made by the Spindle cost model itself at a known latency and bandwidth are fitted back to them."""
    topo = Topology(num_devices=4, gpus_per_node=4, intra_Bps=2.5e9, inter_Bps_per_gpu=1e9, latency_s=300e-6)
    points = [(g, nbytes, allreduce_by_node_s(nbytes, g, 1, topo)) for g in (2, 4) for nbytes in (8e3, 6.4e4, 2.6e5)]
    latency, bandwidth = bench.fit_links(points)
    assert latency == pytest.approx(300e-6, rel=1e-6) and bandwidth == pytest.approx(2.5e9, rel=1e-6)
