"""The planner's parts on their own: bucketing (vs brute force), blaster cuts, moves between micro-batches."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers.flexsp.baselines import static_sp_plan
from solvers.flexsp.blaster import partition
from solvers.flexsp.bucketing import bucket_sequences
from solvers.flexsp.cost import cost_table
from solvers.flexsp.filling import fill_micro_batches
from solvers.flexsp.packing import PackingContext, longest_first
from solvers.flexsp.plan import check_plan, step_time_ms
from solvers.flexsp.rebalance import dissolve_light_micro_batches, move_off_slowest_groups
from solvers.flexsp.workloads import synthetic_lengths
from tests.flexsp.conftest import gpt7b_constants


def _padding(lengths: np.ndarray, groups: list[list[int]]) -> int:
    return sum(int(lengths[g].max()) * len(g) - int(lengths[g].sum()) for g in groups)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bucketing_minimises_padding_like_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, 9) * 128
    rows = list(range(9))
    k = 3
    buckets = bucket_sequences(rows, lengths, k)
    assert sorted(r for b in buckets for r in b.members) == rows
    assert all(b.boundary == max(lengths[list(b.members)]) for b in buckets)
    got = _padding(lengths, [list(b.members) for b in buckets])
    order = sorted(rows, key=lambda r: -lengths[r])
    best = min(
        _padding(lengths, [order[a:b] for a, b in itertools.pairwise((0, *cuts, 9))])
        for n in range(1, k) for cuts in itertools.combinations(range(1, 9), n)
    )
    # The DP cuts only between distinct lengths; splitting equal ones never saves padding.
    assert got == best


def test_blaster_cuts_are_consecutive_and_fit_the_cluster() -> None:
    c = gpt7b_constants()
    table = cost_table(c, synthetic_lengths())
    ctx = PackingContext(table, 64)
    order = longest_first(table, list(range(512)))
    cuts = partition(ctx, order, range(16, 19))
    assert cuts, "some micro-batch count must be feasible token-wise"
    for k, chunks in cuts.items():
        assert len(chunks) == k
        assert [r for ch in chunks for r in ch] == order
        assert all(table.lengths[ch].sum() <= 64 * c.token_capacity_per_gpu for ch in chunks)


@pytest.mark.parametrize("d", [32, 64])
def test_moves_between_micro_batches_keep_plans_valid_and_never_slower(d: int) -> None:
    c = gpt7b_constants()
    table = cost_table(c, synthetic_lengths(200, seed=4))
    ctx = PackingContext(table, 64)
    for plan in (static_sp_plan(table, d, 64), fill_micro_batches(ctx)):
        assert plan is not None
        before = step_time_ms(table, plan)
        dissolved = dissolve_light_micro_batches(ctx, plan)
        moved = move_off_slowest_groups(ctx, dissolved)
        assert check_plan(table, moved, 64) == []
        assert step_time_ms(table, dissolved) <= before + 1e-6
        assert step_time_ms(table, moved) <= step_time_ms(table, dissolved) + 1e-6
