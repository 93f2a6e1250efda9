"""GEMMs at each GPU's measured share of its peak (issue 34): the constants describe an A100's GEMMs; a GPU whose
largest matmul reaches a smaller share of its datasheet peak is priced that much slower, and the estimate says
whether the share was measured or assumed."""

from __future__ import annotations

from typing import Any

import pytest

from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.matmul import REFERENCE_SHARE
from solvers.errors import SpecError
from solvers.presets import GPU_PRESETS
from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec
from tests.contract_json import estimate, solve
from tests.gpus import datasheet_only

BIG = (16384.0, 16384.0, 16384.0)  # compute-bound on every preset: the HBM roofline does not bind
H100_DATASHEET = datasheet_only("h100-sxm")


def _request(gpu: Any, precision: str = "bf16") -> dict[str, Any]:
    return {"kind": "hybrid", "model": {"preset": "llama3-8b", "num_layers": 4},
            "cluster": {"gpu": gpu, "nodes": 1, "gpus_per_node": 8},
            "training": {"global_batch_size": 16, "seq_length": 4096, "precision": precision},
            "strategy": {"tp": 2, "dp": 4, "micro_batch_size": 1}}


def _model(gpu: Any, precision: str = "bf16") -> AnalyticCostModel:
    req = _request(gpu, precision)
    return AnalyticCostModel(ModelSpec.model_validate(req["model"]), ClusterSpec.model_validate(req["cluster"]),
                             TrainingSpec.model_validate(req["training"]))


@pytest.mark.parametrize("preset", ["a100-40gb", "a100-80gb"])
def test_the_reference_gpu_is_priced_as_the_constants_were_fitted(preset: str) -> None:
    """The A100 presets carry the reference's own measurement: scale 1, so the fitted data sets are unchanged."""
    m = _model(preset)
    assert m.matmul.linear == pytest.approx(1.0) and m.matmul.measured
    assert m.gemm_flops == pytest.approx(m.peak_flops)


@pytest.mark.parametrize(("precision", "share"), [("bf16", 794.5 / 989), ("fp8", 1402.6 / 1979)])
def test_an_h100s_gemms_take_the_reference_share_over_its_measured_share_longer(precision: str, share: float) -> None:
    """Against the same H100 without the measured figures (priced at the A100's share, as before), a compute-
    bound GEMM takes REFERENCE_SHARE / share as long; under fp8 the 16-bit GEMMs (attention) keep the bf16 share."""
    measured, assumed = _model("H100-SXM", precision), _model(H100_DATASHEET, precision)
    ratio = float(measured._gemm(*BIG) / assumed._gemm(*BIG))
    assert ratio == pytest.approx(REFERENCE_SHARE / share, rel=1e-9)
    assert ratio > 1.05  # the negative control: the measured share is not the reference's
    attention = float(measured._attention_head(8192, 8192, 128) / assumed._attention_head(8192, 8192, 128))
    assert attention <= REFERENCE_SHARE / (794.5 / 989) + 1e-9


def test_the_estimate_states_the_share_it_priced_and_whether_it_was_measured() -> None:
    """Through the public estimate: the measured H100 is slower than the same datasheet without the figure, and
    each estimate says which share it used and where it came from."""
    measured = estimate(_request("H100-SXM", "fp8"))
    assumed = estimate(_request(H100_DATASHEET, "fp8"))
    assert measured["step_time_s"] > assumed["step_time_s"]
    [m] = measured["matmul"]
    assert m["gpu"] == "H100-SXM" and m["measured"] and m["precision"] == "fp8"
    assert m["share_of_peak"] == pytest.approx(1402.6 / 1979) and m["share_of_peak_16bit"] == pytest.approx(0.8033,
                                                                                                            abs=1e-4)
    assert m["scale"] == pytest.approx(1402.6 / 1979 / REFERENCE_SHARE)
    assert m["note"].startswith("GEMMs priced at 70.9 % of the fp8 peak (measured: cluster.gpu.matmul_tflops_fp8); "
                                "16-bit ones (attention core, LM head) at 80.3 % of the bf16 peak (measured")
    [a] = assumed["matmul"]
    assert not a["measured"] and a["scale"] == pytest.approx(1.0)
    assert "86.9 % of the fp8 peak (assumed: no cluster.gpu.matmul_tflops_fp8 for the h100-sxm-datasheet)" in a["note"]


def test_a_gpu_measured_at_one_precision_only_says_which_share_was_assumed() -> None:
    """An FP8 figure without the 16-bit one: the linear GEMMs at the measured FP8 share, the attention core at the
    reference's, and the estimate not called measured."""
    gpu = {**H100_DATASHEET, "matmul_tflops_fp8": 1402.6}
    m = _model(gpu, "fp8")
    assert m.matmul.linear == pytest.approx(1402.6 / 1979 / REFERENCE_SHARE) and m.matmul.sixteen_bit == 1.0
    [doc] = estimate(_request(gpu, "fp8"))["matmul"]
    assert not doc["measured"]
    assert "70.9 % of the fp8 peak (measured: cluster.gpu.matmul_tflops_fp8)" in doc["note"]
    assert "86.9 % of the bf16 peak (assumed: no cluster.gpu.matmul_tflops for the h100-sxm-datasheet)" in doc["note"]


def test_a_gpu_faster_than_the_reference_is_priced_faster_and_the_sizing_floor_stays_below_the_plan() -> None:
    """A share above the A100's prices GEMMs faster (scale > 1); the sizing floor (matrix multiplies at the
    curve's best) must use the same scaled peak, or it would claim more time than the plan takes."""
    from solvers.hybrid.sizing import step_floor_s

    fast = {**H100_DATASHEET, "name": "fast-h100", "matmul_tflops": 0.95 * 989}
    req, plain = _request(fast), _request(H100_DATASHEET)
    assert estimate(req)["step_time_s"] < estimate(plain)["step_time_s"]
    assert step_floor_s(req) == pytest.approx(step_floor_s(plain) * REFERENCE_SHARE / 0.95, rel=1e-12)
    planned = solve({k: v for k, v in req.items() if k != "strategy"})
    assert 0 < step_floor_s(req) <= planned["estimate"]["step_time_s"]


@pytest.mark.parametrize(("field", "value", "why"), [
    ("matmul_tflops", 1000.0, "cannot exceed peak_tflops 989"),
    ("matmul_tflops_fp8", 2000.0, "cannot exceed peak_tflops_fp8 1979"),
])
def test_a_measured_matmul_above_the_peak_is_refused_naming_the_field(field: str, value: float, why: str) -> None:
    with pytest.raises(SpecError) as err:
        estimate(_request({**H100_DATASHEET, field: value}))
    [problem] = err.value.problems
    assert problem.loc[:2] == ("cluster", "gpu") and field in problem.msg and why in problem.msg


def test_an_fp8_figure_needs_an_fp8_peak() -> None:
    gpu = {k: v for k, v in H100_DATASHEET.items() if k != "peak_tflops_fp8"}
    with pytest.raises(SpecError) as err:
        estimate(_request({**gpu, "matmul_tflops_fp8": 1000.0}))
    assert "needs peak_tflops_fp8" in err.value.problems[0].msg


def test_every_preset_with_a_figure_names_its_source_and_stays_below_its_peak() -> None:
    for name, preset in GPU_PRESETS.items():
        if preset.get("matmul_tflops") is not None:
            assert "matmul_tflops" in preset["source"], name
            assert 0.4 < preset["matmul_tflops"] / preset["peak_tflops"] < 0.9, name
