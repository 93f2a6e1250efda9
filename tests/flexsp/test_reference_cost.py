"""The explicit cost form must reproduce the reference's own figures (static baselines, capacity, bound)."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.flexsp.baselines import best_fit_decreasing, lower_bound_ms, static_sp_plan
from solvers.flexsp.constants import derived_constants
from solvers.flexsp.cost import allowed_group_sizes, cost_table
from solvers.flexsp.plan import step_time_ms
from solvers.flexsp.workloads import GPT7B_MODEL, synthetic_lengths
from solvers.specs import ClusterSpec, ModelSpec
from tests.flexsp.conftest import gpt7b_constants


def test_token_capacity_and_sizes() -> None:
    c = gpt7b_constants()
    # (30·1024 − 7.117·16·1024/64) / 4.480441895 = 6449.9 tokens per GPU, as the reference computes.
    assert c.token_capacity_per_gpu == 6449
    assert allowed_group_sizes(c) == [1, 2, 4, 8, 16, 32, 64]


def test_static_baselines_match_the_reference() -> None:
    """The issue quotes static SP64 101.9 s, SP32 96.9 s and a lower bound of about 71 s."""
    c = gpt7b_constants()
    table = cost_table(c, synthetic_lengths())
    sp64 = step_time_ms(table, static_sp_plan(table, 64, 64) or []) / 1e3
    sp32 = step_time_ms(table, static_sp_plan(table, 32, 64) or []) / 1e3
    assert sp64 == pytest.approx(101.9, abs=0.05)
    assert sp32 == pytest.approx(96.9, abs=0.05)
    assert lower_bound_ms(table, 64) / 1e3 == pytest.approx(71.1, abs=0.1)
    # A 191,872-token sequence needs 30 GPUs' memory: SP16 cannot hold it.
    assert static_sp_plan(table, 16, 64) is None


def test_best_fit_decreasing_respects_capacity_and_places_everything() -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 1000, 200)
    bins = best_fit_decreasing(lengths, 1000)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(lengths[b].sum() <= 1000 for b in bins)
    # Best fit never needs more than 2·OPT bins (and OPT ≥ total/capacity).
    assert len(bins) <= 2 * int(np.ceil(lengths.sum() / 1000))


def test_derived_constants_are_in_the_reference_range() -> None:
    """Derived from specs (A100, GPT-7B shape) the constants land near the reference's fitted ones."""
    model = ModelSpec.model_validate({**GPT7B_MODEL, "vocab_size": 51200})
    cluster = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": 8, "gpus_per_node": 8,
                                          "inter_node_bandwidth_Gbps": 400})
    c = derived_constants(model, cluster, "bf16", 30, 3)
    assert 0.5 < c.alpha2_ms_per_token / 0.1839576 < 2
    assert 0.5 < c.alpha1_ms_per_token2 / 5.128e-6 < 2
    assert 0.8 < c.activation_mb_per_token / 4.480441895 < 1.25
    bw = c.alltoall_GBps_by_group_size
    assert bw[2] > bw[8] > bw[16] > bw[64]  # NVLink inside a node, the NICs beyond
    assert 4000 < c.token_capacity_per_gpu < 9000
