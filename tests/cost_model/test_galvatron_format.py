"""Galvatron's plan file <-> PlanStrategy."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from solvers.errors import SpecError
from solvers.formats.galvatron import plan_from_galvatron_config, plan_to_galvatron_config, read_galvatron_config
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy
from tests.contract_json import estimate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.path.join(ROOT, "bench", "data", "galvatron", "cases")
REFERENCE_PROFILES = os.path.normpath(os.path.join(ROOT, "..", "shared", "reference", "galvatron", "profiles"))
SHIPPED = "galvatron_config_llama2-7b_1nodes_8gpus_per_node_36GB_bf16.json"


def configs() -> list[tuple[str, dict[str, Any], int, bool]]:
    out = []
    for f in sorted(os.listdir(CASES)):
        with open(os.path.join(CASES, f)) as fh:
            case = json.load(fh)
        out.append((f, case["plan"]["galvatron_config"], case["inputs"]["gpus"], case["inputs"]["sequence_parallel"]))
    return out


def test_shipped_config_reads() -> None:
    cfg = read_galvatron_config(SHIPPED, [REFERENCE_PROFILES])
    plan = plan_from_galvatron_config(cfg, 8)
    assert plan.pp == 1 and plan.micro_batches == 1 and plan.stage_layers == (32,)
    assert plan.layers[0] == LayerStrategy(tp=1, dp=8, zero=3, recompute="full")
    assert plan.layers[31] == LayerStrategy(tp=1, dp=8, zero=3, recompute="none")
    assert sum(x.recompute == "full" for x in plan.layers) == 20
    assert plan.embedding == EmbeddingStrategy(tp=2, dp=4, zero=3, sp="ulysses")  # vtp 2, embed_sdp 1, vsp 1
    assert plan.schedule == "1f1b"


@pytest.mark.parametrize(("name", "cfg", "gpus", "sp"), configs())
def test_galvatron_plans_round_trip(name: str, cfg: dict[str, Any], gpus: int, sp: bool) -> None:
    plan = plan_from_galvatron_config(cfg, gpus, sequence_parallel=sp)
    out = plan_to_galvatron_config(plan, global_batch_size=cfg["global_bsz"])
    for key in ("pp_deg", "tp_sizes_enc", "tp_consecutive_flags", "dp_types_enc", "use_sp", "checkpoint",
                "global_bsz", "chunks", "pp_division", "pipeline_type", "vtp", "embed_sdp", "vsp"):
        assert out[key] == cfg[key], key
    # default_dp_type only matters where some layer (or the embedding) is not ZeRO-3
    if any(x.zero != 3 and x.dp > 1 for x in plan.layers) or not cfg["embed_sdp"]:
        assert out["default_dp_type"] == cfg["default_dp_type"]
    assert plan_from_galvatron_config(out, gpus) == plan  # the file now says whether SP is on


def test_layer_fields() -> None:
    cfg = {"pp_deg": 2, "tp_sizes_enc": "1,2,4,8", "dp_types_enc": "1,0,1,0", "use_sp": "0,1,0,0",
           "checkpoint": "0,0,1,1", "pp_division": "1,3", "chunks": 4, "default_dp_type": "ddp", "vtp": 4,
           "pipeline_type": "gpipe"}
    plan = plan_from_galvatron_config(cfg, 16)
    assert plan.layers == (
        LayerStrategy(tp=1, dp=8, sp=None, zero=3),
        LayerStrategy(tp=2, dp=4, sp="ulysses", zero=0),
        LayerStrategy(tp=4, dp=2, sp="megatron", zero=3, recompute="full"),
        LayerStrategy(tp=8, dp=1, sp="megatron", zero=0, recompute="full"),
    )
    assert plan.stage_layers == (1, 3) and plan.schedule == "gpipe" and plan.micro_batches == 4
    assert plan.embedding == EmbeddingStrategy(tp=4, dp=2, zero=0)
    no_sp = plan_from_galvatron_config(cfg, 16, sequence_parallel=False)
    assert no_sp.layers[2].sp is None and no_sp.layers[1].sp == "ulysses"
    even = {k: v for k, v in cfg.items() if k != "pp_division"}
    assert plan_from_galvatron_config(even, 16).stage_layers == (2, 2)


def test_lossy_export_rules() -> None:
    layers = (LayerStrategy(tp=2, dp=4, sp="megatron", zero=1, recompute="selective"),
              LayerStrategy(tp=2, dp=4, sp="megatron", zero=3))
    plan = PlanStrategy(pp=1, micro_batches=2, layers=layers, stage_layers=(2,),
                        embedding=EmbeddingStrategy(tp=2, dp=4, zero=0))
    out = plan_to_galvatron_config(plan, num_gpus=8)
    assert out["checkpoint"] == "1,0"  # selective -> full: still fits
    assert out["dp_types_enc"] == "0,1" and out["default_dp_type"] == "zero2"  # ZeRO-1 -> Galvatron's ZeRO-2
    back = plan_from_galvatron_config(out)  # num_gpus travels in the file
    assert back.layers[0].zero == 2 and back.layers[0].recompute == "full"
    with pytest.raises(SpecError) as err:
        plan_to_galvatron_config(PlanStrategy(pp=1, micro_batches=1, layers=(LayerStrategy(tp=2, cp=2, dp=2),),
                                              stage_layers=(1,)))
    assert ("strategy", "layers", 0) in [p.loc for p in err.value.problems]
    # a deep context-parallel plan is one problem naming how many layers, not one per layer
    deep = tuple([LayerStrategy(tp=2, dp=4)] * 2 + [LayerStrategy(tp=2, cp=2, dp=2)] * 78)
    with pytest.raises(SpecError) as err:
        plan_to_galvatron_config(PlanStrategy(pp=1, micro_batches=1, layers=deep, stage_layers=(80,)))
    assert [p.loc for p in err.value.problems] == [("strategy", "layers", 2)]
    assert "78 of 80 layers, from layer 2, use context or expert parallelism" in str(err.value)


@pytest.mark.parametrize(("change", "field"), [
    ({"tp_sizes_enc": "1,3"}, "tp_sizes_enc"),
    ({"dp_types_enc": "1"}, "dp_types_enc"),
    ({"pp_division": "1,1"}, "pp_division"),
    ({"pp_deg": 3}, "pp_deg"),
    ({"pipeline_type": "zb"}, "pipeline_type"),
    ({"tp_consecutive_flags": "1,0"}, "tp_consecutive_flags"),
    ({"checkpoint": "x,1"}, "checkpoint"),
])
def test_bad_configs_name_the_field(change: dict[str, Any], field: str) -> None:
    cfg = {"pp_deg": 1, "tp_sizes_enc": "2,2", "dp_types_enc": "0,0", "pp_division": "2"}
    cfg.update(change)
    with pytest.raises(SpecError) as err:
        plan_from_galvatron_config(cfg, 8)
    assert ("strategy", field) in [p.loc for p in err.value.problems]


def test_gpu_count_is_required_and_files_must_exist() -> None:
    with pytest.raises(SpecError) as err:
        plan_from_galvatron_config({"pp_deg": 1, "tp_sizes_enc": "1", "dp_types_enc": "0"})
    assert err.value.problems[0].loc == ("strategy", "num_gpus")
    with pytest.raises(SpecError) as err:
        read_galvatron_config("no_such_config.json", [REFERENCE_PROFILES])
    assert err.value.problems[0].loc == ("strategy", "path")


@pytest.mark.parametrize("value", [[None, None], [[2], [2]], [{}, {}], [2.5, 2.5], [True, True], "٢,٢", "2_0,2",
                                   None, True, {}, [], ""])
def test_non_integer_entries_name_the_field(value: Any) -> None:
    """A list entry that was not a number (null, a list) crashed the reader with a TypeError; a fraction was
    truncated (2.5 read as 2), true read as 1, and Python-only digit forms ('٢', '2_0' as 20) were taken."""
    cfg = {"pp_deg": 1, "tp_sizes_enc": value, "dp_types_enc": "0,0", "pp_division": "2"}
    with pytest.raises(SpecError) as err:
        plan_from_galvatron_config(cfg, 8)
    assert [p.loc for p in err.value.problems] == [("strategy", "tp_sizes_enc")]
    assert plan_from_galvatron_config({**cfg, "tp_sizes_enc": [2.0, " 2"]}, 8).layers[1].tp == 2


@pytest.mark.parametrize(("change", "field"), [
    ({"use_sp": "2,0"}, "use_sp"), ({"checkpoint": "-1,0"}, "checkpoint"), ({"dp_types_enc": "0,7"}, "dp_types_enc"),
    ({"tp_consecutive_flags": "1,2"}, "tp_consecutive_flags"), ({"vsp": -1}, "vsp"), ({"embed_sdp": 7}, "embed_sdp"),
    ({"chunks": 0}, "chunks"), ({"chunks": -4}, "chunks"), ({"sequence_parallel": "false"}, "sequence_parallel"),
])
def test_switches_out_of_range_name_the_field(change: dict[str, Any], field: str) -> None:
    """Galvatron's 0/1 switches took any integer (use_sp 2 read as off, checkpoint -1 and embed_sdp 7 as on),
    chunks 0 or -4 became one micro-batch, and sequence_parallel "false" read as true."""
    cfg = {"pp_deg": 1, "tp_sizes_enc": "2,2", "dp_types_enc": "0,0", "pp_division": "2", **change}
    with pytest.raises(SpecError) as err:
        plan_from_galvatron_config(cfg, 8)
    assert [p.loc for p in err.value.problems] == [("strategy", field)]


def test_a_config_for_another_gpu_count_is_refused() -> None:
    """A file we wrote for 16 GPUs (its num_gpus says so) read on 8 silently halved every data-parallel degree,
    estimating another plan; and a file's num_gpus of 0 or -8 was taken as the GPU count."""
    plan = PlanStrategy(pp=2, micro_batches=4, layers=(LayerStrategy(tp=2, dp=4, sp="megatron"),) * 4,
                        stage_layers=(2, 2), embedding=EmbeddingStrategy(tp=2, dp=4))
    cfg = plan_to_galvatron_config(plan, num_gpus=16)
    assert plan_from_galvatron_config(cfg, 16) == plan_from_galvatron_config(cfg) == plan
    with pytest.raises(SpecError) as err:
        plan_from_galvatron_config(cfg, 8)
    assert err.value.problems[0].loc == ("strategy", "num_gpus") and "written for 16 GPUs" in str(err.value)
    for bad in (0, -8):
        with pytest.raises(SpecError) as err:
            plan_from_galvatron_config({**cfg, "num_gpus": bad})
        assert err.value.problems[0].loc == ("strategy", "num_gpus")


@pytest.mark.parametrize(("content", "why"), [
    (b"\xff\xfe{", "not UTF-8"), (b"[" * 100_000, "nested too deeply"), (b"[1, 2]", "holds an array"),
    (b"null", "holds null"), (None, "regular file")])
def test_an_unreadable_plan_file_names_the_path(tmp_path: Path, content: bytes | None, why: str) -> None:
    """A plan file that was not UTF-8 or nested too deeply crashed estimate (UnicodeDecodeError,
    RecursionError); a JSON list was blamed on ``strategy``, not its path; a device (/dev/zero) was read without
    end."""
    path = tmp_path / "galvatron_config.json"
    if content is None:
        path = Path("/dev/zero")
    else:
        path.write_bytes(content)
    req = {"model": {"preset": "llama2-7b", "num_layers": 2}, "cluster": {"gpu": "A100-80GB", "gpus_per_node": 8},
           "training": {"global_batch_size": 8, "seq_length": 2048},
           "strategy": {"format": "galvatron", "path": str(path)}}
    with pytest.raises(SpecError) as err:
        estimate(req)
    assert [p.loc for p in err.value.problems] == [("strategy", "path")] and why in str(err.value)


def test_zero1_of_an_unreplicated_embedding_is_written_as_no_zero() -> None:
    """A plan of single-replica layers and embedding under ZeRO-1 (what constraints.zero = 1 plans under Galvatron's
    model) was written with default_dp_type zero2, which read back as a ZeRO-2 embedding priced higher."""
    plan = PlanStrategy(pp=1, micro_batches=2, layers=(LayerStrategy(tp=8, dp=1, zero=1),) * 2, stage_layers=(2,),
                        embedding=EmbeddingStrategy(tp=8, dp=1, zero=1))
    out = plan_to_galvatron_config(plan, num_gpus=8)
    assert out["default_dp_type"] == "ddp"
    assert plan_from_galvatron_config(out).embedding.zero == 0
    replicated = replace(plan, embedding=EmbeddingStrategy(tp=4, dp=2, zero=1))
    assert plan_to_galvatron_config(replicated, num_gpus=8)["default_dp_type"] == "zero2"
