"""Without the service, a hybrid request is priced with the shipped constants and says so; a named set (which
only the service resolves) is refused at its field; a resolution the service wrote is priced (issue 34)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from solvers.api import estimate
from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.cost_model.fitting import fit_calibration, measurement_of, predict_s
from solvers.errors import SpecError

REQ = {"kind": "hybrid", "model": {"preset": "llama2-7b"},
       "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
       "training": {"global_batch_size": 64, "seq_length": 2048}, "strategy": {"tp": 2, "micro_batch_size": 2}}


def test_shipped_constants_are_said_to_be() -> None:
    used = estimate(REQ).to_json()["calibration_set"]
    assert used["chosen_by"] == "shipped" and used["name"] is None
    assert "names no calibration set and none is stored" in used["note"]


def test_a_named_set_needs_the_service() -> None:
    with pytest.raises(SpecError) as err:
        estimate({**REQ, "cost_model": {"calibration_set": "h100"}})
    assert [p.loc for p in err.value.problems] == [("cost_model", "calibration_set")]


def test_a_resolved_set_prices_with_its_constants() -> None:
    slow = {"name": "slow", "version": 3, "chosen_by": "request", "note": "test",
            "constants": {"gemm_eta_max": 0.4}}
    base = estimate(REQ).to_json()
    priced = estimate({**REQ, "cost_model": {"resolved_calibration_set": slow}}).to_json()
    assert priced["calibration_set"]["name"] == "slow" and priced["step_time_s"] > base["step_time_s"]
    with pytest.raises(SpecError) as err:
        estimate({**REQ, "cost_model": {"resolved_calibration_set": {**slow, "constants": {"gemm_eta_max": -1}}}})
    assert err.value.problems[0].loc[:3] == ("cost_model", "resolved_calibration_set", "constants")


def test_the_fit_finds_constants_that_predict_what_it_did_not_see() -> None:
    truth = replace(DEFAULT_CALIBRATION, gemm_eta_max=0.6)
    strategies = [{"tp": 2, "micro_batch_size": 2}, {"tp": 4, "micro_batch_size": 4}]
    seen = [measurement_of(REQ, s, predict_s(measurement_of(REQ, s, 1.0), truth)) for s in strategies]
    fit = fit_calibration(seen)
    assert fit.report.fit_mape < 0.01 < fit.report.start_mape
    assert fit.report.held_out_mape is not None and fit.report.held_out_mape < fit.report.start_mape
    # what the runs measured, and what they could not: one node's steps say nothing of the network
    assert fit.report.identified is not None
    assert "gemm_eta_max" in fit.report.identified and "inter_efficiency" not in fit.report.identified
    unseen = {"tp": 1, "pp": 2, "micro_batch_size": 1, "zero": 1}
    m = measurement_of(REQ, unseen, predict_s(measurement_of(REQ, unseen, 1.0), truth))
    assert abs(predict_s(m, fit.constants) / m.step_time_s - 1) < abs(predict_s(m, DEFAULT_CALIBRATION)
                                                                     / m.step_time_s - 1) / 3
