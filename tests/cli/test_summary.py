"""The terminal summary of a plan result: every layer accounted for, numbers as the JSON says them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from paraplan_cli.summary import render, render_estimate
from service.demo import DEMO_REQUESTS
from solvers.documents import HybridEstimateResult, load_result
from solvers.documents.hybrid import LayerDoc
from solvers.hybrid.summary import layer_runs
from solvers.text import seconds
from tests.contract_json import estimate, solve
from tests.documents import hybrid_result

SMALL: dict[str, Any] = {
    "kind": "hybrid", "model": {"preset": "llama2-7b", "num_layers": 8},
    "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
    "training": {"global_batch_size": 32, "seq_length": 4096},
    "constraints": {"memory_limit_gib": 24},
}


def _span(line: str) -> range:
    m = re.match(r"\s+layers? (\d+)(?:-(\d+))?\s", line)
    assert m, line
    return range(int(m[1]), int(m[2] or m[1]) + 1)


def test_layer_runs_split_where_the_strategy_changes() -> None:
    a, b = LayerDoc(tp=2, dp=4, zero=1), LayerDoc(tp=2, dp=4, zero=1, recompute="full")
    lines = layer_runs([a, a, b, b, b, a])
    assert [list(_span(x)) for x in lines] == [[0, 1], [2, 3, 4], [5]]
    assert "recompute=full" in lines[1] and "recompute" not in lines[0]


def test_hybrid_summary_accounts_for_every_layer_and_quotes_the_result() -> None:
    result = solve(SMALL)
    text = render(SMALL, load_result("hybrid", result))
    runs = [x for x in text.splitlines() if re.match(r"\s+layers? \d", x)]
    covered = [i for x in runs for i in _span(x)]
    assert covered == list(range(8))
    est, search = result["estimate"], result["search"]
    assert f"MFU {100 * est['mfu']:.1f}%" in text and "(limit 24.0)" in text
    assert f"within {100 * search['optimality_gap']:.2f}%" in text
    for stage in range(result["strategy"]["pp"]):
        assert f"memory, stage {stage}:" in text
    megatron = result["baselines"]["megatron"]
    assert f"this plan {100 * megatron['gain']:+.1f}%" in text
    assert f"pp{megatron['strategy']['pp']}, {megatron['strategy']['micro_batches']} micro-batches" in text


def test_each_baseline_says_where_the_plan_gains_on_it() -> None:
    result = solve(SMALL)
    lines = render(SMALL, load_result("hybrid", result)).splitlines()
    plan = result["estimate"]["breakdown_s"]
    for name, entry in result["baselines"].items():
        if not entry.get("fits"):
            continue
        base = entry["estimate"]["breakdown_s"]
        diff = {k: base.get(k, 0.0) - plan.get(k, 0.0) for k in {*base, *plan}}
        key = max(diff, key=lambda k: abs(diff[k]))
        why = lines[next(i for i, x in enumerate(lines) if x.startswith(f"  {name} ")) + 1]
        if abs(diff[key]) < 0.005 * result["estimate"]["step_time_s"]:  # the plan is this baseline: nothing to say
            assert "against it" not in why, why
            continue
        part = f"{key} {seconds(diff[key])}" if diff[key] > 0 else f"{seconds(-diff[key])} more on {key}"
        assert why.strip().startswith("against it, this plan ") and part in why, (name, why, diff)


def test_one_micro_batch_is_said_in_the_singular() -> None:
    req = {**SMALL, "constraints": {"memory_limit_gib": 80, "micro_batches": 1}}
    text = render(req, load_result("hybrid", solve(req)))
    assert "1 micro-batch (" in text and "1 micro-batches" not in text, text


def test_other_kinds_print_their_step_bound_and_baselines() -> None:
    for kind in ("flexsp", "spindle"):
        req = DEMO_REQUESTS[kind]
        result = solve(req)
        text = render(req, load_result(kind, result))
        assert text.startswith(f"{kind}: step") and "lower bound" in text and "baselines" in text


def test_cli_prints_the_summary_without_json(tmp_path: Path) -> None:
    f = tmp_path / "req.json"
    f.write_text(json.dumps(SMALL))
    out = subprocess.run([sys.executable, "-m", "paraplan_cli.main", "plan", "-f", str(f)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.lstrip().startswith("plan: pp=") and "certificate:" in out.stdout


def test_a_sparse_or_older_result_still_prints() -> None:
    """Stored results from before the certificate, or with fields missing, print what they have."""
    older = hybrid_result({"pp": 1, "micro_batches": 1, "layers": [{"tp": 1}], "stage_layers": [1]},
                          {"step_time_s": 2.0})
    text = render({"kind": "hybrid"}, older)
    assert "step 2 s" in text and "certificate" not in text and "layer 0" in text


def test_a_deep_pipeline_shows_its_fullest_stage_and_the_others_range() -> None:
    stages = [{"parameters": 1.0, "activations": float(a)} for a in (5, 9, 7, 3, 2, 1)]
    deep = hybrid_result({"pp": 6, "micro_batches": 1, "layers": [{}] * 6, "stage_layers": [1] * 6},
                         {"step_time_s": 1.0, "memory_breakdown_gib_per_stage": stages})
    text = render({"kind": "hybrid"}, deep)
    assert "memory, stage 1: 10.0 GiB = parameters 1.0, activations 9.0 (the fullest stage)" in text
    assert "the other 5 stages: 2.0-8.0 GiB" in text


def test_estimate_summary_says_when_a_strategy_does_not_fit() -> None:
    req = {**SMALL, "strategy": {"tp": 1, "pp": 1, "dp": 8, "zero": 0, "recompute": "none", "micro_batch_size": 4}}
    est = estimate(req)
    text = render_estimate(req, HybridEstimateResult.model_validate(est))
    assert est["fits"] is False and text.startswith("DOES NOT FIT") and "over the 24.00 GiB limit" in text
    assert f"peak {est['peak_memory_gib']:.1f} GiB per GPU (limit 24.0)" in text
    roomy = {**req, "constraints": {"memory_limit_gib": 80},
             "strategy": {"tp": 1, "pp": 1, "dp": 8, "zero": 1, "recompute": "full", "micro_batch_size": 1}}
    assert not render_estimate(roomy, HybridEstimateResult.model_validate(estimate(roomy))).startswith("DOES NOT FIT")


def test_a_baseline_outside_the_constraints_says_so_under_its_line() -> None:
    req = {**SMALL, "constraints": {**SMALL.get("constraints", {}), "zero": 0}}
    result = solve(req)
    lines = render(req, load_result("hybrid", result)).splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("  zero3_dp "))
    assert lines[at + 1].strip() == "outside this request's constraints: constraints.zero = 0: it uses ZeRO 3"
