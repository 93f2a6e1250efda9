"""The torchtitan export of every corpus plan (and of its Megatron baseline where it has one) through torchtitan
0.3.0's own ConfigManager and the Trainer's pre-GPU checks (#33): accepted wherever torchtitan has the model, and
read back as the plan the exporter says torchtitan runs (``EXPORTER.run_plan``): degrees, micro-batch, local and
global batch, accumulation, recomputation and the stage split. Where torchtitan has no config for the model the
export says so and names the config to add; the same command with a torchtitan config of the same depth
(else llama3_8b) standing in is then checked the same way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from solvers.cost_model.pipeline import chunks
from solvers.exports import export
from solvers.exports.layout import dominant
from solvers.exports.torchtitan import EXPORTER, TORCHTITAN_CONFIGS
from solvers.specs import ModelSpec
from solvers.strategy import PlanStrategy
from tests.frameworks.conftest import Validator
from tests.frameworks.plans import CORPUS, solved

pytestmark = pytest.mark.timeout(1500)

# a torchtitan config to check a command for a model torchtitan lacks: one of the same depth where there is one,
# else llama3_8b (torchtitan checks no module name of the pipeline split against the model's layers)
STAND_IN = {layers: config for (layers, *_), (_, config) in TORCHTITAN_CONFIGS.items()}
TORCHAO = {"llama3_405b": "llama3_70b"}  # configs that need torchao (float8), absent from the validators' venv


def check_torchtitan(validator: Validator, text: str, model: ModelSpec, spec: Any, path: Path) -> dict[str, Any]:
    """torchtitan's answer for an export. Where torchtitan has no config for the model, the header must name what is
    missing and what to add, and the command is checked with a stand-in config of that depth; where the config
    needs torchao (absent from the validators' venv), the header must say so and a bf16 config stands in."""
    config = re.search(r"--module (\S+) --config (\S+)", text)
    assert config is not None
    known = any(config.group(2) == c for _, c in TORCHTITAN_CONFIGS.values())
    if not known:
        assert f"torchtitan 0.3.0 has no config for {model.name}" in text and f"{config.group(2)}()" in text
        text = text.replace(config.group(0), f"--module llama3 --config {STAND_IN.get(model.num_layers, 'llama3_8b')}")
    path.write_text(text)
    got = validator.check(path, spec.gpus, gpu_arch=spec.arch)
    if not got["accepted"] and got["error"].startswith("torchao is not installed") and config.group(2) in TORCHAO:
        # torchtitan checks no module name of the split against the model, so a bf16 config of another depth serves
        assert "torchao required" in text
        path.write_text(text.replace(config.group(0), f"--module llama3 --config {TORCHAO[config.group(2)]}"))
        got = validator.check(path, spec.gpus, gpu_arch=spec.arch)
    elif known or model.num_layers in STAND_IN:
        assert got["accepted"] is False or got["read_back"]["num_layers"] == model.num_layers
    return got


def _cases() -> list[Any]:
    cases = []
    for name in CORPUS:
        result = solved(name)
        for of in ("plan", "megatron"):
            base = result.baselines.get("megatron")
            if of == "megatron" and (base is None or base.strategy is None):
                continue
            cases.append(pytest.param(name, of, id=f"{name}-{of}"))
    return cases


def _expected(plan: PlanStrategy, run: PlanStrategy, batch: int, request: dict[str, Any]) -> dict[str, Any]:
    s = dominant(run)
    stack = request["training"].get("stack", {})
    micro = batch // run.micro_batches // s.dp
    pipelined = run.pp > 1
    recompute = {x.recompute for x in run.layers}
    assert len(recompute) == 1  # torchtitan runs one setting
    return {"tp": s.tp, "pp": run.pp, "dp": s.dp, "cp": s.cp, "dp_shard": s.dp if s.zero else 1,
            "dp_replicate": 1 if s.zero else s.dp, "micro_batch_size": micro,
            "local_batch_size": micro * run.micro_batches if pipelined else micro, "global_batch_size": batch,
            "micro_batches": run.micro_batches, "recompute": recompute.pop(),
            "virtual_pp": chunks(run.schedule, run.virtual_stages) if pipelined else 1,
            "stage_layers": list(run.stage_layers) if pipelined else None,
            "fsdp_zero": (1 if pipelined else 3) if s.zero or s.cp > 1 else 0, "run_zero": s.zero,
            # torch.compile wherever the request's stack prices fused elementwise ops (its default)
            "compile": stack.get("elementwise", "fused") == "fused"}


def _read(got: dict[str, Any], gpus: int) -> dict[str, Any]:
    r = got["read_back"]
    pipelined = r["pp"] > 1
    parts = r["stage_layers"]
    return {"tp": r["tp"], "pp": r["pp"], "dp": r["dp"], "cp": r["cp"], "dp_shard": r["dp_shard"],
            "dp_replicate": r["dp_replicate"], "micro_batch_size": r["micro_batch_size"],
            "local_batch_size": r["local_batch_size"], "global_batch_size": r["global_batch_size"],
            "micro_batches": r["grad_accumulation"] * (r["pipeline_microbatches"] or 1),
            "recompute": r["recompute"], "virtual_pp": r["virtual_pp"],
            # rank k holds the model parts k, k + pp, ... (torchtitan's looped schedules)
            "stage_layers": [sum(parts[k::r["pp"]]) for k in range(r["pp"])] if pipelined else None,
            # FSDP (over dp_shard x cp) without a pipeline reshards after forward (ZeRO-3); pipelined it keeps the
            # weights (ZeRO-1)
            "fsdp_zero": (3 if not pipelined else 1) if r["dp_shard"] * r["cp"] > 1 else 0,
            "run_zero": None, "compile": r["compile"], "world_size": r["world_size"], "_gpus": gpus}


@pytest.mark.parametrize(("name", "of"), _cases())
def test_torchtitan_accepts_the_export_and_runs_it_as_planned(name: str, of: str, validators: dict[str, Validator],
                                                              tmp_path: Path) -> None:
    spec = CORPUS[name]
    request = spec.request()
    result = solved(name)
    text = export(result, "torchtitan", request, of=of)
    model = ModelSpec.model_validate(request["model"])
    plan = (result.strategy if of == "plan" else result.baselines["megatron"].strategy).to_plan()  # type: ignore
    moe = [model.is_moe_layer(i) for i in range(model.num_layers)] if model.moe else None
    run = EXPORTER.run_plan(plan, moe, request)
    assert run is not None
    assert "torchtitan 0.3.0" in text
    got = check_torchtitan(validators["torchtitan"], text, model, spec, tmp_path / f"{name}.sh")
    assert got["accepted"], f"torchtitan refuses the export of {name} ({of}): {got['error']}\n{text}"
    read = _read(got, spec.gpus)
    assert read.pop("world_size") == read.pop("_gpus")
    want = _expected(plan, run, spec.batch, request)
    want["run_zero"] = read["run_zero"] = None  # the FSDP stage is compared through fsdp_zero
    if want["fsdp_zero"]:
        assert {x.zero for x in run.layers} == {want["fsdp_zero"]}
    assert read == want
    # the plan's own stage split (not only the run's): torchtitan takes any split by module names
    if plan.pp > 1:
        assert read["stage_layers"] == list(plan.stage_layers)


def test_an_eager_stack_is_exported_without_torch_compile(validators: dict[str, Validator], tmp_path: Path) -> None:
    """The export runs what the request's stack prices: fused elementwise ops (the default) with torch.compile,
    which torchtitan's llama3_8b leaves off; an eager stack (training.stack.elementwise) with it off. torchtitan
    reads both back so."""
    name = "llama3-8b-1x8-h100"
    spec, result = CORPUS[name], solved(name)
    request = spec.request()
    eager = {**request, "training": {**request["training"], "stack": {"elementwise": "eager"}}}
    model = ModelSpec.model_validate(request["model"])
    read = {}
    for label, req in (("fused", request), ("eager", eager)):
        got = check_torchtitan(validators["torchtitan"], export(result, "torchtitan", req), model, spec,
                               tmp_path / f"{label}.sh")
        assert got["accepted"], got["error"]
        read[label] = got["read_back"]["compile"]
    assert read == {"fused": True, "eager": False}
