"""The Galvatron export of every corpus plan (and of its Megatron baseline), read by hetu-galvatron 2.4.0's own
config reader (#33): accepted, and read back per layer as the plan Galvatron runs (``EXPORTER.run_plan``): tp,
ZeRO, recomputation, the stage split, the global batch and the chunks; where that differs from the plan, the
file's notes say so, each difference priced. The embedding's ZeRO-3 is written under both versions' keys. Plans
with context or expert parallelism or interleaving, which Galvatron lacks, are written as the nearest plan it
runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from solvers.exports import export
from solvers.exports.galvatron import EXPORTER
from solvers.specs import ModelSpec
from solvers.strategy import PlanStrategy
from tests.frameworks.conftest import Validator
from tests.frameworks.plans import CORPUS, solved

pytestmark = pytest.mark.timeout(1500)


def _strategies(name: str) -> list[tuple[str, PlanStrategy]]:
    result = solved(name)
    out = [("plan", result.strategy.to_plan())]
    base = result.baselines.get("megatron")
    if base is not None and base.strategy is not None:
        out.append(("megatron", base.strategy.to_plan()))
    return out


CASES = [pytest.param(name, of, id=f"{name}-{of}") for name in CORPUS for of, _ in _strategies(name)]


def _per_layer(value: Any, layers: int) -> list[Any]:
    return list(value) if isinstance(value, list) else [value] * layers


@pytest.mark.parametrize(("name", "of"), CASES)
def test_galvatron_reads_the_export_back_as_planned(name: str, of: str, validators: dict[str, Validator],
                                                    tmp_path: Path) -> None:
    spec = CORPUS[name]
    request = spec.request()
    plan = dict(_strategies(name))[of]
    text = export(solved(name), "galvatron", request, of=of)
    config = json.loads(text)
    assert config["vocab_sdp"] == config["embed_sdp"] == (1 if plan.embedding.zero == 3 else 0)
    layers = ModelSpec.model_validate(request["model"]).num_layers
    path = tmp_path / f"galvatron_config_{name}.json"
    path.write_text(text)
    got = validators["galvatron"].check(path, spec.gpus, gpu_arch=spec.arch, num_layers=layers)
    assert got["accepted"], f"Galvatron refuses the export of {name} ({of}): {got['error']}"
    read = got["read_back"]
    run = EXPORTER.run_plan(plan, None, request)
    assert run is not None
    assert sorted(read["ignored_keys"]) == ["_paraplan_notes", "num_gpus", "sequence_parallel", "vocab_sdp"]
    assert read["world_size"] == spec.gpus and read["pp"] == plan.pp
    assert read["global_batch_size"] == spec.batch and read["grad_accumulation"] == plan.micro_batches
    assert read["stage_layers"] == list(plan.stage_layers)
    assert _per_layer(read["tp"], layers) == [x.tp for x in run.layers]
    assert [x.tp for x in plan.layers] == [x.tp for x in run.layers] or any(x.cp > 1 for x in plan.layers)
    # a layer without data parallelism shards nothing, whatever default_dp_type says
    dps = _per_layer(read["dp"], layers)
    zero = [z if dp > 1 else 0 for z, dp in zip(_per_layer(read["zero_stage"], layers), dps, strict=True)]
    assert dps == [x.dp for x in run.layers] and zero == [x.zero for x in run.layers]
    assert _per_layer(read["recompute"], layers) == [x.recompute for x in run.layers]
    # what Galvatron runs differently from the plan is stated, one note per kind of change
    notes = config["_paraplan_notes"]
    for key in ("zero", "recompute"):
        changed = [a for a, b in zip(plan.layers, run.layers, strict=True) if getattr(a, key) != getattr(b, key)]
        if changed:
            said = f"ZeRO-{changed[0].zero}" if key == "zero" else f"recompute {changed[0].recompute}"
            assert any(said in n for n in notes), (key, notes)
    if run != plan:
        assert any("difference(s) from the plan, each estimated alone" in n for n in notes), notes
