"""The default calibration against the measured-data goals of bench/fidelity.py (issues 3 and 34): in-sample
figures (the constants were fitted on these sets); goals not met are strict expected failures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "calibration"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/calibration is not present")


@pytest.fixture(scope="module")
def reports(fidelity: ModuleType) -> dict[str, object]:
    return {r.name.split(" (")[0]: r for r in fidelity.run(fidelity.DEFAULT_CALIBRATION, fidelity.data_sets())}


def test_vtrain_mape(reports: dict[str, object]) -> None:
    assert reports["vTrain multi-node"].ape.mean() <= 0.10  # type: ignore[attr-defined]
    assert reports["vTrain single-node"].ape.mean() <= 0.10  # type: ignore[attr-defined]


def test_sc21_every_row_within_ten_percent(reports: dict[str, object]) -> None:
    assert reports["Megatron SC21 Table 1"].ape.max() <= 0.10  # type: ignore[attr-defined]


def test_spearman_helper_matches_scipy(fidelity: ModuleType) -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 20, 50).astype(float)  # with ties
    b = a + rng.normal(0, 5, 50)
    assert fidelity.spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, rel=1e-12)


# Groups whose measurements contradict each other under any model whose micro-batch time scales at most linearly
# with work (README, Fidelity; ``bench/fidelity.py --pairs``): the rank goal is checked there too, and fails.
RANK_GOAL_MISSED = {"18.4": "Spearman 0.707: a bias by TP degree no mechanism examined explains",
                    "39.1": "Spearman 0.557: 26 measured pairs break the pipelined-work bound"}


@pytest.mark.parametrize("group", [
    "3.6", "175", *(pytest.param(g, marks=pytest.mark.xfail(strict=True, reason=why))
                    for g, why in RANK_GOAL_MISSED.items())])
def test_rank_goal_in_every_multi_node_group(fidelity: ModuleType, reports: dict[str, object], group: str) -> None:
    """Spearman >= 0.9 within each model size of vTrain multi-node; the groups that miss it are expected
    failures (strict: one that starts passing fails the suite until it is moved out)."""
    rep = reports["vTrain multi-node"]
    idx = [i for i, r in enumerate(rep.rows) if r.group == group]  # type: ignore[attr-defined]
    assert idx
    rho = fidelity.spearman([rep.rows[i].measured for i in idx], [rep.predicted[i] for i in idx])  # type: ignore[attr-defined]
    assert rho >= 0.9, group


def _regret(fidelity: ModuleType, reports: dict[str, object], name: str) -> np.ndarray:
    rep = reports[name]
    return np.array(list(fidelity.planner_regret(rep.rows, rep.predicted).values()))  # type: ignore[attr-defined]


def test_planner_regret_is_measured_against_measured(fidelity: ModuleType) -> None:
    """The regret of a group is the measured time of the model's first choice over the measured best."""
    rows = fidelity.vtrain_rows(DATA / "vtrain_ground_truth_multi.csv")
    measured = [r.measured for r in rows]
    assert all(v == 0 for v in fidelity.planner_regret(rows, measured).values())  # a perfect ranking
    worst = {k: max(rows[i].measured for i in idx) / min(rows[i].measured for i in idx) - 1
             for k, idx in fidelity.regret_groups(rows).items()}
    assert fidelity.planner_regret(rows, [-m for m in measured]) == pytest.approx(worst)  # the worst ranking


def test_planner_regret_goal_on_vtrain_multi_node(fidelity: ModuleType, reports: dict[str, object]) -> None:
    regret = _regret(fidelity, reports, "vTrain multi-node")
    assert len(regret) == 4 and regret.mean() <= 0.02 and regret.max() <= 0.10


@pytest.mark.xfail(strict=True, reason="with the shipped constants: mean 4.0 %, worst 39.1 % over 144 groups")
def test_planner_regret_goal_on_vtrain_single_node(fidelity: ModuleType, reports: dict[str, object]) -> None:
    regret = _regret(fidelity, reports, "vTrain single-node")
    assert regret.mean() <= 0.02 and regret.max() <= 0.10


def test_planner_regret_on_vtrain_single_node_does_not_regress(fidelity: ModuleType,
                                                               reports: dict[str, object]) -> None:
    """Until the goal above is met: no worse than measured when it was first reported (mean 4.0 %, worst 39.1 %)."""
    regret = _regret(fidelity, reports, "vTrain single-node")
    assert len(regret) == 144 and regret.mean() <= 0.041 and regret.max() <= 0.392


# --- the profile path: vTrain single-node priced from per-layout layer times, held out by layer count -------------

# The profile path's test: the hidden-2048 groups at 16 and 24 layers (each hidden size's profile is derived from its
# own runs; each layer count is held out in turn), among them the analytic model's worst miss; a quarter of the
# cost of all 144 groups, which ``bench/fidelity.py --profiled`` prints.
PROFILED_COUNTS = (16, 24)


@pytest.fixture(scope="module")
def profiled_regret(fidelity: ModuleType, reports: dict[str, object]) -> dict[str, float]:
    rows = [r for r in reports["vTrain single-node"].rows if r.model.hidden_size == 2048]  # type: ignore[attr-defined]
    _, predicted = fidelity.profiled_held_out(rows, counts=PROFILED_COUNTS)  # (layers and head profiled)
    return dict(fidelity.planner_regret([r for r in rows if r.model.num_layers in PROFILED_COUNTS], predicted))


def test_planner_regret_goal_from_a_profile_on_vtrain_single_node(fidelity: ModuleType, reports: dict[str, object],
                                                                  profiled_regret: dict[str, float]) -> None:
    """Where the analytic model's ranking of small layers fails (worst 39.1 %), a profile of the layer and head
    layouts ranks them: every group's plans priced from the times the other layer counts' runs give."""
    rep = reports["vTrain single-node"]
    analytic = fidelity.planner_regret(rep.rows, rep.predicted)  # type: ignore[attr-defined]
    worst = max(analytic, key=lambda k: analytic[k])
    assert len(profiled_regret) == 36 and worst in profiled_regret and analytic[worst] > 0.30
    regret = np.array(list(profiled_regret.values()))
    assert regret.mean() <= 0.02 and regret.max() <= 0.10


def test_a_profiled_prediction_never_sees_its_own_run(fidelity: ModuleType) -> None:
    """Leave one layer count out: changing the runs of one layer count changes the other counts' predictions (their
    profiles are derived from them), never their own."""
    rows = [r for r in fidelity.vtrain_rows(DATA / "vtrain_ground_truth_single.csv")
            if r.model.hidden_size == 1024 and r.cluster.num_gpus == 8 and r.training.global_batch_size == 16
            and r.strategy["pp"] == 1]
    assert {r.model.num_layers for r in rows} == {12, 16, 20, 24}
    changed = [replace(r, measured=2 * r.measured) if r.model.num_layers == 24 else r for r in rows]
    # both the layers-only and the layers-and-head predictions
    for before, after in zip(fidelity.profiled_held_out(rows), fidelity.profiled_held_out(changed), strict=True):
        for r, a, b in zip(rows, before, after, strict=True):
            assert (a == b) == (r.model.num_layers == 24), r.label


def test_a_profile_is_derived_under_the_constants_it_is_priced_with(fidelity: ModuleType) -> None:
    """Under other constants (a held-out fold's), one configuration's layer and head times are derived with those
    constants: its runs at the other layer counts then put the held-out count on their measured line, whatever the
    constants price outside the layers (here a gradient sync half exposed, slower links, a dearer micro-batch). Read
    with the shipped constants and priced with others, the times would carry the difference into the prediction."""
    rows = [r for r in fidelity.vtrain_rows(DATA / "vtrain_ground_truth_single.csv")
            if r.model.hidden_size == 2048 and r.cluster.num_gpus == 8 and r.training.global_batch_size == 16
            and r.strategy["tp"] == 1 and r.strategy["pp"] == 1 and r.strategy["micro_batch_size"] == 1]
    assert sorted(r.model.num_layers for r in rows) == [12, 16, 20, 24] and rows[0].strategy["dp"] == 8
    cal = replace(fidelity.DEFAULT_CALIBRATION, dp_overlap=0.5, intra_efficiency=0.6,
                  microbatch_overhead_s=3 * fidelity.DEFAULT_CALIBRATION.microbatch_overhead_s)
    _, predicted = fidelity.profiled_held_out(rows, cal=cal)
    for r, got in zip(rows, predicted, strict=True):
        others = [x for x in rows if x is not r]
        line = np.polyfit([x.model.num_layers for x in others], [x.measured for x in others], 1)
        assert got == pytest.approx(np.polyval(line, r.model.num_layers), rel=0.01), r.label
