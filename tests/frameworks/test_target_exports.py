"""A plan for a framework target (``constraints.target``) exported to that framework is accepted by the
framework's own parser and read back as planned, for every plan of the corpus the target can run."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from solvers.specs import ModelSpec
from tests.frameworks.conftest import Validator
from tests.frameworks.plans import CORPUS
from tests.frameworks.test_torchtitan_export import check_torchtitan

SUFFIX = {"megatron": ".sh", "deepspeed": ".json", "torchtitan": ".sh"}


@functools.cache
def _solved(name: str, target: str) -> tuple[Any, dict[str, Any]] | None:
    from solvers.errors import InfeasibleError
    from solvers.hybrid.api import solve

    request = CORPUS[name].request()
    request["constraints"]["target"] = target
    try:
        return solve(request), request
    except InfeasibleError:  # the schedule the request asks for is not the target's (checked in tests/hybrid)
        return None


@pytest.mark.parametrize("target", list(SUFFIX))
@pytest.mark.parametrize("name", list(CORPUS))
def test_target_export_is_accepted_and_read_back(name: str, target: str, validators: dict[str, Validator],
                                                 tmp_path: Path) -> None:
    from solvers.exports import export

    solved = _solved(name, target)
    if solved is None:
        pytest.skip(f"{target} runs no schedule {name} asks for")
    result, request = solved
    plan, case = result.plan(), CORPUS[name]
    path = tmp_path / f"{name}{SUFFIX[target]}"
    text = export(result, target, request)
    if target == "torchtitan":  # (a stand-in config where torchtitan has none for the model)
        got = check_torchtitan(validators[target], text, ModelSpec.model_validate(request["model"]), case, path)
    else:
        path.write_text(text)
        got = validators[target].check(path, case.gpus, gpu_arch=case.arch)
    assert got["accepted"], f"{target} refuses the target plan of {name}: {got['error']}"
    read, x = got["read_back"], plan.layers[0]
    uly = x.sp == "ulysses"
    assert read["world_size"] == case.gpus and read["global_batch_size"] == case.batch
    assert read["pp"] == plan.pp
    if target == "torchtitan":  # FSDP over dp_shard x cp: ZeRO-3, or ZeRO-1 pipelined (reshard after forward off)
        fsdp = read["dp_shard"] * read["cp"] > 1
        assert ((3 if plan.pp == 1 else 1) if fsdp else 0) == (x.zero if x.dp * x.cp > 1 else 0)
    else:
        assert read["zero_stage"] == x.zero
    assert read["micro_batch_size"] == case.batch // plan.micro_batches // x.dp
    if target == "deepspeed":  # Ulysses is DeepSpeed's sequence_parallel_size, its data parallel world beside it
        assert (read["tp"], read["ulysses_sp"]) == ((1, x.tp) if uly else (x.tp, 1))
        assert read["dp"] == x.dp
    else:
        assert (read["tp"], read["dp"], read["cp"]) == (x.tp, x.dp, x.cp)
    if target == "megatron":
        assert read["virtual_pp"] == (plan.virtual_stages if plan.schedule == "interleaved" else 1)
        assert read["sequence_parallel"] == (x.sp == "megatron")
        assert read["recompute"] == x.recompute
