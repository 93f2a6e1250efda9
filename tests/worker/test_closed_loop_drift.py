"""bench/closed_loop.py's ``drift_removed`` takes the host's round-to-round speed out of the interleaved
measurements: on synthetic samples built as plan time x round factor (x a little noise, one wild sample) it
recovers the plan times and the factors, where the plain median of the samples does not."""

from __future__ import annotations

import random
import statistics
from types import ModuleType

import pytest

from tests.bench_module import load_bench

STEPS = 2


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_bench("closed_loop.py")


def synthetic(plans: dict[str, float], factors: list[float], seed: int = 0) -> dict[str, list[float]]:
    """``STEPS`` samples a round, rounds in order, as ``interleaved_rank`` records them; 1 % noise."""
    rng = random.Random(seed)
    return {name: [t * f * (1 + 0.01 * rng.uniform(-1, 1)) for f in factors for _ in range(STEPS)]
            for name, t in plans.items()}


def test_plan_times_and_round_factors_are_recovered_where_the_median_is_thrown_by_the_drift(
        bench: ModuleType) -> None:
    # two plans 2 % apart; the host ran rounds 2 and 3 slow, and plan "a" happened to be sampled more in them
    plans = {"a": 1.00, "b": 1.02, "c": 1.50, "d": 2.00}
    factors = [1.0, 1.0, 1.3, 1.3]
    samples = synthetic(plans, factors)
    samples["a"][0] = samples["a"][1] = 1.4  # a slow spell hit only plan a's steps in round 0
    steady, got_factors = bench.drift_removed(samples, STEPS)
    # round effects: rounds 0-1 at one speed, 2-3 at 1.3 x it (factors are relative to the median round)
    assert got_factors[2] / got_factors[0] == pytest.approx(1.3, rel=0.02)
    assert got_factors[3] / got_factors[1] == pytest.approx(1.3, rel=0.02)
    scale = steady["c"] / plans["c"]  # the level is the median round's speed
    for name, t in plans.items():
        assert steady[name] / scale == pytest.approx(t, rel=0.02), name
    assert steady["a"] < steady["b"]
    # negative control: the plain median puts plan a behind b (its slow round-0 samples)
    median = {n: statistics.median(s) for n, s in samples.items()}
    assert median["a"] > median["b"]


def test_without_drift_it_is_the_samples_geometric_centre(bench: ModuleType) -> None:
    plans = {"a": 1.0, "b": 2.0, "c": 3.0}
    steady, factors = bench.drift_removed(synthetic(plans, [1.0, 1.0, 1.0], seed=1), STEPS)
    assert factors == pytest.approx([1.0, 1.0, 1.0], abs=0.02)
    assert steady == pytest.approx(plans, rel=0.02)


def test_launch_agreement_is_the_measurements_rank_correlation_between_launches(bench: ModuleType) -> None:
    names = ["a", "b", "c", "d", "e", "f"]
    first = {n: 1.0 + i for i, n in enumerate(names)}
    swapped = {**first, "c": first["d"], "d": first["c"]}  # one adjacent pair in the other order
    assert bench.launch_agreement([first, first], names) == pytest.approx([1.0])
    assert bench.launch_agreement([first, swapped], names) == pytest.approx([1 - 6 * 2 / (6 * 35)])  # 0.943
    # three launches: every pair, in order (1-2, 1-3, 2-3)
    reverse = {n: -t for n, t in first.items()}
    assert bench.launch_agreement([first, swapped, reverse], names) == pytest.approx(
        [1 - 6 * 2 / 210, -1.0, -(1 - 6 * 2 / 210)])
    # over a subset (the held-out plans): only their order counts
    assert bench.launch_agreement([first, swapped], ["a", "b", "e"]) == pytest.approx([1.0])
