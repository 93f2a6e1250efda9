"""The default calibration keeps meeting the measured-data goals of bench/fidelity.py (issue 3)."""

from __future__ import annotations

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


def test_rank_goal_holds_where_the_measurements_allow_it(fidelity: ModuleType, reports: dict[str, object]) -> None:
    """Spearman >= 0.9 within the 3.6B and 175B groups. 18.4B and 39.1B miss it (README, Fidelity): their
    measurements contradict each other under any model whose micro-batch time scales at most linearly with work
    (``bench/fidelity.py --pairs``)."""
    rep = reports["vTrain multi-node"]
    for group in ("3.6", "175"):
        idx = [i for i, r in enumerate(rep.rows) if r.group == group]  # type: ignore[attr-defined]
        rho = fidelity.spearman([rep.rows[i].measured for i in idx], [rep.predicted[i] for i in idx])  # type: ignore[attr-defined]
        assert rho >= 0.9, group
