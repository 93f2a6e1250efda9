"""bench/fidelity.py --pairs: the model-free bound between two measured 1F1B runs (see its docstring)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]


def _row(fidelity: ModuleType, tp: int, dp: int, pp: int, mbs: int, measured: float) -> object:
    model = ModelSpec(name="m", num_layers=8, hidden_size=1024, num_attention_heads=16, vocab_size=1000, mlp="gelu")
    cluster = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8})
    training = TrainingSpec(global_batch_size=64, seq_length=512)
    return fidelity.Row(group="g", label=f"tp{tp} dp{dp} pp{pp} mbs{mbs}", model=model, cluster=cluster,
                        training=training, strategy={"tp": tp, "dp": dp, "pp": pp, "micro_batch_size": mbs},
                        measured=measured)


def test_work_ratio_needs_a_run_larger_in_every_respect(fidelity: ModuleType) -> None:
    a, b = _row(fidelity, 2, 4, 2, 2, 1.0), _row(fidelity, 4, 2, 2, 2, 1.0)
    assert fidelity.work_ratio(a, b) == 2.0
    assert fidelity.work_ratio(b, a) is None  # b splits more: it is the lighter run
    assert fidelity.work_ratio(_row(fidelity, 2, 4, 2, 4, 1.0), b) == 4.0  # twice the samples, half the split
    assert fidelity.work_ratio(_row(fidelity, 4, 2, 2, 1, 1.0), _row(fidelity, 2, 4, 2, 2, 1.0)) is None  # mixed
    assert fidelity.work_ratio(a, _row(fidelity, 4, 4, 1, 2, 1.0)) is None  # other pipeline depth
    assert fidelity.work_ratio(a, a) is None


def test_bound_is_tight_for_perfectly_scaling_runs(fidelity: ModuleType) -> None:
    """Runs whose micro-batch time scales exactly with the work meet the bound with equality, so one that is
    slower by x ms needs exactly x ms of per-step time outside the pipeline."""
    t_b, p = 10.0, 2
    light = _row(fidelity, 4, 2, p, 2, 0.0)
    m_b = 64 / (2 * 2)
    light = replace(light, measured=(m_b + p - 1) * t_b)
    heavy_time = (m_b / 2 + p - 1) * 2 * t_b
    assert fidelity.pipeline_bound(light, 2.0) * light.measured == pytest.approx(heavy_time)
    assert fidelity.consistency_pairs([light, _row(fidelity, 2, 4, p, 2, heavy_time)]) == []
    pairs = fidelity.consistency_pairs([light, _row(fidelity, 2, 4, p, 2, heavy_time + 7.0)])
    assert len(pairs) == 1 and pairs[0].needed_step_s == pytest.approx(7.0e-3)


@pytest.mark.skipif(not (ROOT.parent / "shared" / "calibration").is_dir(), reason="../shared/calibration absent")
def test_vtrain_39b_tp2_rows_contradict_tp4_rows(fidelity: ModuleType) -> None:
    """The measured finding the README quotes: 39.1B tp2 dp16 pp16 mbs3 is slower than tp4 dp8 pp16 mbs3 by
    far more than any split of the pipelined work allows."""
    rows = fidelity.vtrain_rows(fidelity.DATA / "vtrain_ground_truth_multi.csv")
    pairs = fidelity.consistency_pairs(rows)
    hit = [x for x in pairs if x.heavy.label.startswith("512gpu tp2 dp16 pp16 mbs3 ")
           and x.light.label.startswith("512gpu tp4 dp8 pp16 mbs3 ")]
    assert len(hit) == 1 and hit[0].needed_step_s > 5.0


def test_consistent_predictions_obey_the_bound_and_move_only_contradicted_rows(fidelity: ModuleType) -> None:
    p, t_b = 2, 10.0
    light = replace(_row(fidelity, 4, 2, p, 2, 0.0), measured=17 * t_b)  # m_b = 16
    heavy = _row(fidelity, 2, 4, p, 2, 180.0 + 40.0)  # 40 ms slower than the bound allows
    other = _row(fidelity, 4, 2, p, 4, 175.0)  # heavier than light (mbs 4): bound 170 * 20/17 = 200, consistent
    rows = [light, heavy, other]
    best = fidelity.consistent_predictions(rows, [0.0, 0.0, 0.0])
    bound = fidelity.pipeline_bound(light, 2.0)
    assert best[1] <= bound * best[0] + 1e-6
    # equal relative weights: the gap of 40 ms is split between the two rows, both moved
    assert best[1] < heavy.measured and best[0] > light.measured
    assert fidelity.consistent_predictions([light, other], [0.0, 0.0]) == pytest.approx([170.0, 175.0])
    # slack of the size of the gap makes the measurements themselves consistent
    assert fidelity.consistent_predictions(rows, [0.0, 0.04, 0.0]) == pytest.approx([170.0, 220.0, 175.0], rel=1e-6)
