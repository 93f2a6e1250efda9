"""On small micro-batches (≤ 12 sequences, 8 GPUs) the MILP's optimum equals exhaustive search."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.flexsp.cost import cost_table
from solvers.flexsp.milp import MilpSettings, solve_micro_batch
from solvers.flexsp.packing import PackingContext, best_greedy, max_load_ms
from solvers.flexsp.plan import check_plan
from tests.flexsp.conftest import gpt7b_constants
from tests.flexsp.oracle import exhaustive_min_load_ms

EXACT = dict(max_deterministic_time_s=30.0, max_nodes=10**6, exact_up_to=64, max_sequences=64)


def _case(seed: int, n: int, nodes: int, gpn: int):
    c = gpt7b_constants(nodes=nodes, gpus_per_node=gpn)
    rng = np.random.default_rng(seed)
    # Mixed lengths from 128 up to what the 8 GPUs can hold, so every degree is in play.
    cap = c.token_capacity_per_gpu * nodes * gpn
    lengths = np.minimum((np.exp(rng.uniform(np.log(128), np.log(cap), n)) // 128 + 1) * 128, cap // 128 * 128)
    total_cap = cap
    while lengths.sum() > total_cap:  # keep the micro-batch feasible memory-wise
        lengths = np.maximum(128, lengths // 2 // 128 * 128)
    table = cost_table(c, lengths)
    return table, PackingContext(table, nodes * gpn)


@pytest.mark.parametrize("seed,n,nodes,gpn", [(0, 6, 1, 8), (1, 8, 1, 8), (2, 9, 2, 4), (3, 10, 1, 8), (4, 12, 1, 8)])
def test_cpsat_equals_exhaustive(seed: int, n: int, nodes: int, gpn: int) -> None:
    table, ctx = _case(seed, n, nodes, gpn)
    rows = list(range(n))
    opt = exhaustive_min_load_ms(table, rows, nodes * gpn)
    warm = best_greedy(ctx, rows)
    mb = solve_micro_batch(ctx, rows, MilpSettings(backend="cpsat", **EXACT), warm=warm).plan
    assert mb is not None
    assert check_plan(table, [mb], nodes * gpn) == []
    assert max_load_ms(table, mb) == pytest.approx(opt, rel=1e-6, abs=0.05)
    # The greedy is an upper bound the MILP never loses to.
    assert warm is None or max_load_ms(table, warm) >= opt - 0.05


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_pulp_backends_equal_exhaustive(backend: str) -> None:
    table, ctx = _case(7, 8, 1, 8)
    rows = list(range(8))
    opt = exhaustive_min_load_ms(table, rows, 8)
    mb = solve_micro_batch(ctx, rows, MilpSettings(backend=backend, **EXACT), warm=best_greedy(ctx, rows)).plan
    assert mb is not None and check_plan(table, [mb], 8) == []
    assert max_load_ms(table, mb) == pytest.approx(opt, rel=1e-6, abs=0.05)


def test_bucketed_model_is_feasible_and_no_worse_than_warm_start() -> None:
    table, ctx = _case(11, 40, 1, 8)
    rows = list(range(40))
    warm = best_greedy(ctx, rows)
    assert warm is not None
    mb = solve_micro_batch(ctx, rows, MilpSettings(exact_up_to=8, max_buckets=6), warm=warm).plan
    assert mb is not None and check_plan(table, [mb], 8) == []
