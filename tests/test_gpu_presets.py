"""GPU presets (issue 34): the current accelerators, each with its peaks, memory and links from a named source,
and each planning through the public entry point."""

from __future__ import annotations

import pytest

from solvers.errors import SpecError
from solvers.presets import GPU_PRESETS
from solvers.specs import GPUSpec
from tests.contract_json import solve

ISSUE_GPUS = ["A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "B200", "MI300X", "L40S"]
FP8 = {"H100-SXM", "H100-PCIe", "H200", "B200", "MI300X", "L40S"}


def _request(gpu: str, precision: str = "bf16", batch: int = 32) -> dict[str, object]:
    return {"kind": "hybrid", "model": {"preset": "gpt3-1.3b"},
            "cluster": {"gpu": gpu, "nodes": 2, "gpus_per_node": 8},
            "training": {"global_batch_size": batch, "seq_length": 2048, "precision": precision}}


@pytest.mark.parametrize("gpu", ISSUE_GPUS)
def test_preset_has_its_figures_and_their_source(gpu: str) -> None:
    spec = GPUSpec.model_validate(GPU_PRESETS[gpu.lower()])
    assert spec.name == gpu and spec.source and "data sheet" in spec.source.lower().replace("datasheet", "data sheet")
    assert spec.peak_tflops > 100 and spec.memory_gib > 30 and spec.memory_bandwidth_GBps > 800
    assert spec.intra_node_bandwidth_GBps > 0 and spec.inter_node_bandwidth_Gbps > 0
    assert (spec.peak_tflops_fp8 is not None) == (gpu in FP8)
    if spec.peak_tflops_fp8 is not None:  # FP8 tensor cores run twice the 16-bit rate on every one of them
        assert spec.peak_tflops_fp8 == pytest.approx(2 * spec.peak_tflops, rel=0.02)


@pytest.mark.parametrize("gpu", ISSUE_GPUS)
def test_each_preset_plans_through_the_api(gpu: str) -> None:
    out = solve(_request(gpu))
    est = out["estimate"]
    assert est["fits"] and 0.05 < est["mfu"] < 0.9 and est["peak_memory_gib"] <= GPU_PRESETS[gpu.lower()]["memory_gib"]
    if gpu in FP8:
        # at a batch where the GEMMs, not the kernel launches, set the step (at 32 sequences the H200, B200 and
        # MI300X steps are launch-bound): fp8 speeds up the linear layers' GEMMs only
        bf16 = solve(_request(gpu, batch=256))["estimate"]
        fp8 = solve(_request(gpu, "fp8", batch=256))["estimate"]
        assert fp8["fits"] and fp8["step_time_s"] < bf16["step_time_s"] and fp8["stack"]["fp8_recipe"] == "delayed"
    else:
        with pytest.raises(SpecError) as err:
            solve(_request(gpu, "fp8"))
        assert [p.loc for p in err.value.problems] == [("training", "precision")]


def test_faster_links_and_peaks_make_faster_steps() -> None:
    """The same plan request on successive generations: each is faster than the one before."""
    steps = [solve(_request(gpu))["estimate"]["step_time_s"] for gpu in ("A100-80GB", "H100-SXM", "B200")]
    assert steps[0] > steps[1] > steps[2]
