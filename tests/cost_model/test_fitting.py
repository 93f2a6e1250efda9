"""The constants' fit against a loss whose optimum is known, and which constants a loss pins down
(``solvers.cost_model.fitting``)."""

from __future__ import annotations

from dataclasses import replace

from solvers.cost_model.calibration import DEFAULT_CALIBRATION, AnalyticCalibration
from solvers.cost_model.fitting import FIT_KEYS, coordinate_fit, identified_keys


def _loss(c: AnalyticCalibration) -> float:
    # depends on two constants only: the GEMM plateau strongly, the NVLink efficiency (optimum at its bound) weakly
    return abs(c.gemm_eta_max - 0.6) + 0.02 * (1.0 - c.intra_efficiency)


def test_the_fit_moves_only_what_the_loss_sees_and_finds_its_optimum() -> None:
    fitted = coordinate_fit(_loss, replace(DEFAULT_CALIBRATION, intra_efficiency=0.8), FIT_KEYS, max_sweeps=40)
    assert abs(fitted.gemm_eta_max - 0.6) < 0.02 and fitted.intra_efficiency == 1.0  # capped at its bound
    for key in FIT_KEYS:
        if key not in ("gemm_eta_max", "intra_efficiency"):
            assert getattr(fitted, key) == getattr(DEFAULT_CALIBRATION, key), key


def test_identified_keys_are_those_a_twenty_percent_move_costs_more_than_the_tolerance() -> None:
    at_optimum = replace(DEFAULT_CALIBRATION, gemm_eta_max=0.6, intra_efficiency=1.0)
    # gemm_eta_max: ±20 % costs 0.12; intra_efficiency: +20 % is capped at 1.0, −20 % costs 0.004
    assert identified_keys(_loss, at_optimum, FIT_KEYS) == ["gemm_eta_max"]
    assert identified_keys(_loss, at_optimum, FIT_KEYS, tolerance=0.003) == ["gemm_eta_max", "intra_efficiency"]
    assert identified_keys(_loss, at_optimum, ["kernel_overhead_s", "dp_overlap"], tolerance=0.0) == []
