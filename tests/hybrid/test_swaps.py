"""Layer swaps: what a single or two-layer change is priced at equals the stage summed afresh."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers.hybrid import swaps
from solvers.hybrid.planner import Planner
from solvers.hybrid.space import SearchSpace
from tests.hybrid.synthetic import SyntheticCostModel
from tests.hybrid.test_exactness import EXACT, small_case


def _stage_afresh(stage: swaps._Stage, change: dict[int, int]) -> swaps._Stage:
    trial = swaps._Stage(stage.inputs, stage.kinds, list(stage.choice))
    for pos, c in change.items():
        trial.choice[pos] = c
    trial.total()
    return trial


def _peak(stage: swaps._Stage) -> float:
    return max(float(stage.inputs.costs[k].peak_extra_bytes[c]) for k, c in stage.pairs())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_case(), st.integers(0, 2**32 - 1))
def test_moves_price_the_stage_as_summed_afresh(case: tuple[SyntheticCostModel, SearchSpace], seed: int) -> None:
    """Each change's stage time and step time, from the layers' increments (with the re-layout between two
    adjacent changed layers made the new pair's), equal the stage's totals summed again, and it fits."""
    cm, space = case
    planner = Planner(cm, space, kinds=None if cm.layer_scale else [0] * cm.num_layers, options=EXACT)
    rng = np.random.default_rng(seed)
    for cfg in space.pipeline_configs():
        cc = planner.config_costs(cfg)
        if cc is None:
            continue
        kinds = list(planner.kinds)  # (every layer on the first stage: the prices are the stage's sums either way)
        stage = swaps._Stage(cc.stages[0], kinds, [int(rng.integers(len(cc.candidates))) for _ in kinds])
        stage.total()
        limit = (stage.resident + _peak(stage)) * float(rng.uniform(0.8, 1.5))  # some changes fit, some not
        moves: list[tuple[dict[int, int], float, float]] = []
        for pos in range(len(kinds)):
            cands, t, u = swaps._moves(stage, pos, limit)
            moves += [({pos: int(c)}, float(a), float(b)) for c, a, b in zip(cands, t, u, strict=True)]
            for b in range(pos + 1, len(kinds)):
                xs, ys, t2, u2 = swaps._pair_moves(stage, pos, b, limit)
                assert not np.any((xs == stage.choice[pos]) | (ys == stage.choice[b]))  # both layers change
                moves += [({pos: int(x), b: int(y)}, float(a), float(c))
                          for x, y, a, c in zip(xs, ys, t2, u2, strict=True)]
        for change, t_new, u_new in moves:
            trial = _stage_afresh(stage, change)
            assert t_new == pytest.approx(trial.time_s, rel=1e-9, abs=1e-12), change
            assert u_new == pytest.approx(trial.step_s, rel=1e-9, abs=1e-12), change
            assert trial.resident + _peak(trial) <= limit
            assert t_new <= stage.time_s or u_new <= stage.step_s  # (faster in one, up to rounding)


def test_a_pair_of_layers_trading_strategies_is_found_where_no_single_change_helps() -> None:
    """Four layers of different sizes on one stage, Galvatron's formula: the plan of single-layer swaps is
    0.40 % slower than enumeration's, which gives two layers each other's strategy."""
    from tests.hybrid.brute_force import best_step_time
    from tests.hybrid.synthetic import MIB

    cm = SyntheticCostModel(num_layers=4, num_gpus=4, memory_limit_bytes=1482 * MIB, global_batch=8,
                            layer_scale=[0.5, 2.0, 1.5, 2.0], gpus_per_node=4, dp_sync_s=0.02,
                            act_mib_per_sample=16.0, param_mib=5.0, linear_pipeline=False, galvatron_formula=True)
    space = SearchSpace(num_gpus=4, gpus_per_node=4, num_layers=4, global_batch_size=8, seq_length=1024, heads=12,
                        kv_heads=12, max_tp=4, max_pp=4, max_cp=1, sp_kinds=(None, "megatron"), zero_levels=(0, 3),
                        recomputes=("none", "full"), schedules=("1f1b",))
    plan = Planner(cm, space, options=EXACT).search().plan
    assert cm.evaluate(plan).step_time_s == pytest.approx(best_step_time(cm, space), rel=1e-9)
    tp = [layer.tp for layer in plan.layers]
    assert sorted(tp) == [1, 1, 2, 2] and tp != [1, 2, 2, 1]  # the same strategies, two of them traded
