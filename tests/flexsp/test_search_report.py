"""What ``search`` says about how a FlexSP plan was made (issue 34): ``solver`` names only what produced the
plan, and a MILP run that returned no packing is a failure in the result, never read as "no improvement"."""

from __future__ import annotations

from typing import Any

from solvers.flexsp.milp import MilpSettings, solve_micro_batch
from solvers.flexsp.packing import best_greedy, max_load_ms
from tests.contract_json import solve
from tests.flexsp.test_milp_exact import _case
from tests.flexsp.test_plans import EXPLICIT


def _placed(out: dict[str, Any]) -> list[int]:
    return sorted(i for mb in out["micro_batches"] for g in mb["groups"] for i in g["sequences"])


def _search(milp: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    out = solve({**EXPLICIT, "solver": milp})
    return out, out["search"]


def test_a_milp_that_improved_a_micro_batch_is_named_in_the_solver() -> None:
    out, search = _search({"milp": "cpsat"})
    milp = search["milp"]
    assert milp["outcome"] == "improved" and milp["improved"] >= 1 and milp["gain_s"] > 0
    assert search["solver"].endswith("+cpsat") and search["solver"].split("+")[0] in search["chosen"]
    # the MILP's gain is real: the plan without it is slower by that much
    off, off_search = _search({"milp": "none"})
    assert off_search["milp"]["outcome"] == "off" and off_search["solver"] == off_search["solver"].split("+")[0]
    assert off["estimate"]["step_time_s"] - out["estimate"]["step_time_s"] > 0


def test_cpsat_unknown_is_a_failure_and_the_greedy_plan_stands() -> None:
    out, search = _search({"milp": "cpsat", "max_deterministic_time_s": 1e-9})
    milp = search["milp"]
    assert milp["outcome"] == "failed" and milp["failed"] == milp["runs"] >= 1 and milp["improved"] == 0
    assert [f["status"] for f in milp["failures"]] == ["UNKNOWN"] * milp["runs"]
    assert "deterministic time limit" in milp["failures"][0]["detail"]
    assert "+" not in search["solver"]  # the MILP produced nothing of the plan
    assert any("MILP (cpsat) failed" in n for n in out["notes"])
    assert _placed(out) == list(range(len(EXPLICIT["batch"]["sequence_lengths"])))
    assert out["estimate"]["step_time_s"] == solve({**EXPLICIT, "solver": {"milp": "none"}})["estimate"]["step_time_s"]


def test_highs_stopped_is_a_failure_not_no_improvement() -> None:
    out, search = _search({"milp": "highs", "max_nodes": 10, "max_deterministic_time_s": 1e-6})
    milp = search["milp"]
    assert milp["outcome"] == "failed" and milp["failures"][0]["status"] == "stopped"
    assert "HiGHS stopped" in milp["failures"][0]["detail"] and search["solver"] == "blaster"
    assert any("MILP (highs) failed" in n for n in out["notes"])


def test_a_milp_that_never_ran_says_why() -> None:
    _, search = _search({"milp": "cpsat", "max_sequences": 1})
    milp = search["milp"]
    assert milp["outcome"] == "not_run" and milp["runs"] == 0
    assert "solver.max_sequences" in milp["not_run_reason"] and "+" not in search["solver"]


def test_cbc_without_a_solution_is_a_failure() -> None:
    """The bucketed model rounds lengths up to its buckets' boundaries, so the warm start's load can be out of its
    reach: CBC answers Infeasible, and that is a failure with its reason, not "no improvement". (CBC stopped at its
    node limit with a partial assignment is the other PuLP failure; its cases take seconds of CBC, so no test.)"""
    table, ctx = _case(1, 24, 2, 8)
    rows = list(range(24))
    warm = best_greedy(ctx, rows)
    outcome = solve_micro_batch(ctx, rows, MilpSettings(backend="cbc", max_nodes=1, exact_up_to=8, max_buckets=4,
                                                        max_sequences=640), warm=warm)
    assert outcome.plan is None and outcome.status == "Infeasible"
    assert outcome.failure is not None and "bucket lengths round sequences up" in outcome.failure
    # exact (unbucketed), the same micro-batch solves: the failure is the bucketing's, and is said to be
    exact = solve_micro_batch(ctx, rows, MilpSettings(backend="cpsat", exact_up_to=64, max_sequences=640), warm=warm)
    assert exact.plan is not None and warm is not None
    assert max_load_ms(table, exact.plan) <= max_load_ms(table, warm) + 1e-6
