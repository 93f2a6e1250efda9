"""Every corpus plan's DeepSpeed export (and its Megatron baseline's), parsed by DeepSpeed 0.19.8's own
``DeepSpeedConfig`` as ``deepspeed.initialize`` would build it (#33): accepted, and what DeepSpeed reads back
(world, degrees, batch arithmetic, ZeRO stage, Ulysses group) is the run the export's header prices."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.conftest import Validator
from tests.frameworks.plans import CORPUS, solved

pytestmark = pytest.mark.timeout(1500)  # the first test may build the frameworks venv


def _cases() -> list[Any]:
    return [pytest.param(name, of, id=f"{name}-{of}") for name in CORPUS for of in ("plan", "megatron")]


def _expected(name: str, of: str) -> dict[str, Any]:
    """The degrees and batch of the run the header prices (``EXPORTER.run_plan``), as DeepSpeed names them."""
    from solvers.exports.deepspeed import EXPORTER
    from solvers.exports.layout import dominant
    from solvers.request import HybridRequest, parse

    result, request = solved(name), CORPUS[name].request()
    model = parse(HybridRequest, request).model
    doc = result.strategy if of == "plan" else result.baselines["megatron"].strategy  # type: ignore[union-attr]
    assert doc is not None
    plan = doc.to_plan()
    experts = [model.is_moe_layer(i) for i in range(model.num_layers)] if model.moe else None
    run = EXPORTER.run_plan(plan, experts, request)
    assert run is not None
    s = dominant(run)
    uly = s.sp == "ulysses"
    batch = CORPUS[name].batch
    return {"plan": plan, "run": run, "read_back": {
        "world_size": s.world * run.pp, "tp": 1 if uly else s.tp, "ulysses_sp": s.tp if uly else 1, "pp": run.pp,
        "dp": s.dp, "micro_batch_size": batch // run.micro_batches // s.dp, "global_batch_size": batch,
        "grad_accumulation": run.micro_batches, "zero_stage": s.zero}}


@pytest.mark.parametrize(("name", "of"), _cases())
def test_deepspeed_accepts_the_export_and_reads_back_the_priced_run(
        name: str, of: str, validators: dict[str, Validator], tmp_path: Path) -> None:
    from solvers.exports import export

    result = solved(name)
    base = result.baselines.get("megatron")
    if of == "megatron" and (base is None or base.strategy is None):
        pytest.skip(f"{name} has no Megatron baseline to export")
    expected = _expected(name, of)
    text = export(result, "deepspeed", CORPUS[name].request(), of=of)
    path = tmp_path / "ds.json"
    path.write_text(text)
    got = validators["deepspeed"].check(path, CORPUS[name].gpus)
    assert got["accepted"], f"DeepSpeed refuses the export of {name} ({of}): {got['error']}\n{text}"
    want = expected["read_back"]
    assert {k: got["read_back"][k] for k in want} == want, text
    notes = json.loads(text)["_paraplan_notes"]
    assert notes[0].startswith("as DeepSpeed runs it, estimated step"), notes
    assert any(n.startswith("lossless") for n in notes) == (expected["run"] == expected["plan"]), notes


@pytest.mark.parametrize(("precision", "section"), [("fp16", "fp16"), ("fp8", "bf16"), ("bf16", "bf16")])
def test_precision_is_written_and_fp8_said_to_be_inexpressible(
        precision: str, section: str, validators: dict[str, Validator], tmp_path: Path) -> None:
    from solvers.exports import export

    name = "llama3-8b-1x8-h100"
    request = CORPUS[name].request()
    request["training"]["precision"] = precision
    text = export(solved(name), "deepspeed", request)
    cfg = json.loads(text)
    assert cfg[section] == {"enabled": True}
    assert ("fp16" in cfg) == (precision == "fp16") and ("bf16" in cfg) == (precision != "fp16")
    assert any("fp8 is not expressible" in n for n in cfg["_paraplan_notes"]) == (precision == "fp8")
    path = tmp_path / "ds.json"
    path.write_text(text)
    got = validators["deepspeed"].check(path, CORPUS[name].gpus)
    assert got["accepted"], got["error"]
    assert got["read_back"]["bf16"] == (precision != "fp16")
