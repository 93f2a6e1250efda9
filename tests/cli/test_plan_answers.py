"""What ``paraplan plan`` says a newcomer first misread: a request's strategy (compared, never silently dropped),
a search that solved no configuration in full (the baseline is the plan), a memory limit above the GPU's, and
``paraplan presets``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from paraplan_cli.summary import render
from solvers.api import estimate, solve
from solvers.presets import GPU_PRESETS, MODEL_PRESETS
from solvers.specs import ModelSpec
from solvers.spindle.presets import WORKLOAD_PRESETS
from solvers.text import seconds
from tests.conftest import ROOT

TOUR: dict[str, Any] = {  # the README's tour request
    "kind": "hybrid", "model": {"preset": "llama2-7b"},
    "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
    "training": {"global_batch_size": 64, "seq_length": 2048},
    "strategy": {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "recompute": "none", "micro_batch_size": 2}}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "paraplan_cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_the_request_strategy_is_priced_against_the_plan(tmp_path: Path) -> None:
    f = tmp_path / "req.json"
    f.write_text(json.dumps(TOUR))
    out = _cli("plan", "-f", str(f))
    assert out.returncode == 0, out.stderr
    plan: Any = solve(TOUR)
    given: Any = estimate(TOUR)
    gain = 100 * (given.step_time_s / plan.estimate.step_time_s - 1)
    note = next(line for line in out.stdout.splitlines() if "the request's strategy" in line)
    assert note == (f"note: the request's strategy is not what planning starts from (it searches every strategy; "
                    f"`estimate` prices a given one): priced by the same cost model it takes a step of "
                    f"{seconds(given.step_time_s)} and {given.peak_memory_gib:.1f} GiB per GPU; this plan "
                    f"{gain:+.1f}%")
    assert gain > 0  # tp2 dp4 is not the best layout here
    # the search solved no configuration in full: the baseline is the plan, and the line says so
    assert plan.search.configs_solved == 0 and plan.search.plan_from == "baseline:megatron"
    search = next(line for line in out.stdout.splitlines() if line.startswith("search: "))
    assert search.endswith(f"; the megatron baseline is the plan: bounds showed that none of the "
                           f"{plan.search.configs_total} pipeline configurations could beat it, so none needed a "
                           "full search"), search
    # a strategy the model cannot take is named, the plan still made
    bad = {**TOUR, "strategy": {"tp": 3}}
    lines = render(bad, solve(bad)).splitlines()
    assert any(line.startswith("note: the request's strategy is not what planning starts from") and
               "it could not be priced: strategy.tp: num_attention_heads (32) is not divisible by tp (3)" in line
               for line in lines)


def test_a_search_that_solves_configurations_says_how_many_and_why_the_rest_were_not() -> None:
    req = {**TOUR, "constraints": {"memory_limit_gib": 20}, "training": {"global_batch_size": 16, "seq_length": 8192}}
    del req["strategy"]
    result: Any = solve(req)
    s = result.search
    assert s.configs_solved > 0 and not s.time_limited
    search = next(line for line in render(req, result).splitlines() if line.startswith("search: "))
    assert re.search(rf"; {s.configs_solved} of {s.configs_total} pipeline configurations searched in full"
                     rf"( \(.*\))?, {s.configs_total - s.configs_solved} ruled out by a bound \(none of them could "
                     r"beat the plan\)$", search), search


def test_a_memory_limit_above_the_gpus_is_named_where_the_limit_is_shown() -> None:
    req = {k: v for k, v in TOUR.items() if k != "strategy"} | {"constraints": {"memory_limit_gib": 100}}
    lines = render(req, solve(req)).splitlines()
    assert any(line.endswith("GiB per GPU (limit 79.1: the A100-80GB's memory, under the 100 asked)") for line in lines)
    assert ("note: constraints.memory_limit_gib = 100 GiB is more than the A100-80GB's 79.10 GiB of device memory: "
            "planned and estimated within 79.10 GiB") in lines


def test_presets_lists_every_preset_a_request_may_name() -> None:
    text = _cli("presets")
    assert text.returncode == 0, text.stderr
    names = {w for line in text.stdout.splitlines() for w in re.split(r"[\s,]+", line.strip())}
    assert set(MODEL_PRESETS) <= names and set(GPU_PRESETS) <= names and set(WORKLOAD_PRESETS) <= names
    found = json.loads(_cli("presets", "--json").stdout)
    listed = {m["preset"]: m for m in found["models"]}
    assert {n for m in found["models"] for n in (m["preset"], *m["aliases"])} == set(MODEL_PRESETS)
    for name, m in listed.items():  # each row is its preset: the counts are the spec's
        assert m["parameters"] == ModelSpec.model_validate({"preset": name}).total_params()
    assert listed["llama2-7b"]["aliases"] == ["llama-2-7b"] and listed["llama2-7b"]["num_layers"] == 32
    assert {g["preset"]: g["memory_gib"] for g in found["gpus"]}["a100-80gb"] == GPU_PRESETS["a100-80gb"]["memory_gib"]
    h100 = next(line.split() for line in text.stdout.splitlines() if line.split()[:1] == ["h100-sxm"])
    assert h100[2] == "80.3%"  # the measured matmul share of the bf16 peak beside the peak
    assert next(line.split() for line in text.stdout.splitlines() if line.split()[:1] == ["l4"])[2] == "-"
