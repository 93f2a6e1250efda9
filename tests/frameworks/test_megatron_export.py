"""Megatron-LM exports of every corpus plan and of its uniform Megatron-style baseline (#33): Megatron-LM
core_r0.19's own parse_args + validate_args accept them, and what it reads back is the run the export's header
prices (``EXPORTER.run_plan``) on the request's model: the parallel degrees, the pipeline split and interleaving,
the batch arithmetic, the recomputation of every layer, the experts' layout and the model's shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from solvers.cost_model.pipeline import chunks
from solvers.exports import export
from solvers.exports.layout import dominant, expert_layout
from solvers.exports.megatron import EXPORTER
from solvers.specs import ModelSpec
from solvers.strategy import PlanStrategy
from tests.frameworks.conftest import Validator
from tests.frameworks.plans import CORPUS, solved

pytestmark = pytest.mark.timeout(1500)  # the first test may build the frameworks venv


def _stage_layers(read: dict[str, Any]) -> list[int]:
    """The pipeline split Megatron-LM runs: the first and last stages as given, the rest even."""
    pp, n = read["pp"], read["num_layers"]
    first, last = read["first_stage_layers"], read["last_stage_layers"]
    inner = pp - (first is not None) - (last is not None)
    middle = (n - (first or 0) - (last or 0)) // inner if inner else 0
    sizes = [middle] * pp
    if first is not None:
        sizes[0] = first
    if last is not None:
        sizes[-1] = last
    return sizes


def _recompute_per_layer(read: dict[str, Any], stages: list[int]) -> list[str]:
    """What Megatron-LM recomputes on each layer: selective everywhere, full on every layer (uniform; each
    recomputed unit of --recompute-num-layers layers is whole) or on the first N of every model chunk (block)."""
    mode, v = read["recompute"], read["virtual_pp"]
    if mode != "full":
        return [mode] * read["num_layers"]
    if read["recompute_method"] == "uniform":
        return ["full"] * read["num_layers"]
    n = read["recompute_num_layers"]
    return ["full" if i % (size // v) < n else "none" for size in stages for i in range(size)]


@pytest.mark.parametrize("of", ["plan", "megatron"])
@pytest.mark.parametrize("name", list(CORPUS))
def test_megatron_accepts_the_export_and_runs_what_its_header_prices(name: str, of: str,
                                                                     validators: dict[str, Validator],
                                                                     tmp_path: Path) -> None:
    spec = CORPUS[name]
    result, request = solved(name), spec.request()
    if of == "plan":
        doc = result.strategy
    else:
        base = result.baselines.get("megatron")
        if base is None or base.strategy is None:
            pytest.skip(f"{name} has no uniform Megatron-style plan: {base.note if base else 'no baseline'}")
        doc = base.strategy
    text = export(result, "megatron", request, of=of)
    path = tmp_path / "megatron.sh"
    path.write_text(text)
    got = validators["megatron"].check(path, spec.gpus, gpu_arch=spec.arch)
    assert got["accepted"], f"Megatron-LM refuses the export of {name} ({of}): {got['error']}\n{text}"
    read = got["read_back"]

    model = ModelSpec.model_validate(request["model"])
    experts = [model.is_moe_layer(i) for i in range(model.num_layers)] if model.moe else None
    plan = doc.to_plan()
    run = EXPORTER.run_plan(plan, experts, request)
    assert isinstance(run, PlanStrategy)
    s = dominant(run)
    v = chunks(run.schedule, run.virtual_stages)
    expected = {
        "world_size": spec.gpus, "tp": s.tp, "pp": run.pp, "cp": s.cp, "dp": s.dp, "virtual_pp": v,
        "global_batch_size": spec.batch, "grad_accumulation": run.micro_batches,
        "micro_batch_size": spec.batch // (run.micro_batches * s.dp), "zero_stage": s.zero,
        "sequence_parallel": s.sp == "megatron", "num_layers": model.num_layers, "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_size, "seq_length": spec.seq,
    }
    assert {k: read[k] for k in expected} == expected, text
    # without --group-query-attention Megatron-LM builds one query group per head (its num_query_groups unused)
    groups = read["num_query_groups"] if "--group-query-attention" in text.split() else read["num_attention_heads"]
    assert groups == model.kv_heads
    stages = _stage_layers(read)
    assert stages == list(run.stage_layers)
    assert _recompute_per_layer(read, stages) == [x.recompute for x in run.layers], text
    if model.moe is not None:
        ep, _ = expert_layout(run)
        moe_layer = next(x for x, m in zip(run.layers, experts or [], strict=True) if m)
        assert (read["num_experts"], read["ep"], read["etp"]) == (model.moe.num_experts, ep, moe_layer.expert_tp)
    if s.tp > 1 or s.cp > 1:
        assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in text
    assert ("# lossless: Megatron-LM runs this plan as it is" in text) == (run == plan), text
    if of == "megatron":  # the best uniform Megatron-style plan is what Megatron-LM runs
        assert run == plan


@pytest.mark.parametrize(("precision", "flags"), [("fp16", ["--fp16"]), ("fp32", []),
                                                  ("fp8", ["--bf16", "--fp8-format", "hybrid"])])
def test_the_request_precision_is_the_one_megatron_runs(precision: str, flags: list[str],
                                                        validators: dict[str, Validator], tmp_path: Path) -> None:
    from solvers.hybrid.api import solve

    request = {"kind": "hybrid", "model": {"preset": "llama3-8b", "num_layers": 8},
               "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
               "training": {"global_batch_size": 32, "seq_length": 4096, "precision": precision}}
    text = export(solve(request), "megatron", request)
    path = tmp_path / "megatron.sh"
    path.write_text(text)
    got = validators["megatron"].check(path, 8, gpu_arch=9)
    assert got["accepted"], got["error"]
    words = text.split()
    assert all(f in words for f in flags) and ("--fp16" in words) == (precision == "fp16")
    assert got["read_back"]["bf16"] == (precision in ("bf16", "fp8"))
