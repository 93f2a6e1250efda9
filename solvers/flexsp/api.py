"""``solve`` and ``estimate`` for ``kind = "flexsp"`` (see ../shared/contract/plan-api.md)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from solvers.documents.flexsp import FlexSPEstimateResult, FlexSPResult
from solvers.errors import FieldProblem, SpecError
from solvers.flexsp.baselines import lower_bound_ms, static_sp_plan
from solvers.flexsp.constants import FlexSPConstants
from solvers.flexsp.cost import CostTable, allowed_group_sizes, cost_table
from solvers.flexsp.milp import MilpSettings
from solvers.flexsp.packing import PackingContext
from solvers.flexsp.plan import Group, MicroBatch, breakdown_ms, check_plan, plan_to_dict, step_time_ms
from solvers.flexsp.planner import plan_batch
from solvers.flexsp.request import FlexSPRequest, parse_request
from solvers.flexsp.summary import summarise as summarise  # (SolverKind.summarise)
from solvers.specs import memory_limit_note

MAX_NAMED = 20


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _table(req: FlexSPRequest, consts: FlexSPConstants) -> CostTable:
    sizes = [d for d in allowed_group_sizes(consts) if req.solver.max_sp is None or d <= req.solver.max_sp]
    if not sizes:
        raise SpecError.at(("solver", "max_sp"), f"no allowed SP degree is ≤ {req.solver.max_sp}")
    table = cost_table(consts, req.batch.sequence_lengths, sizes)
    too_long = np.flatnonzero(~table.fits.any(axis=1))
    if too_long.size:
        cap = int(table.capacity[-1])
        raise SpecError([
            FieldProblem(("batch", "sequence_lengths", int(i)),
                         f"sequence of {int(table.lengths[i])} tokens exceeds what the cluster can hold: "
                         f"{cap} tokens (SP{int(table.sizes[-1])} × {consts.token_capacity_per_gpu} tokens per GPU "
                         f"at {consts.memory_limit_mb / 1024:g} GiB)")
            for i in too_long[:MAX_NAMED]
        ])
    return table


def _estimate(table: CostTable, plan: list[MicroBatch]) -> dict[str, Any]:
    parts = [breakdown_ms(table, mb) for mb in plan]
    step = step_time_ms(table, plan) / 1e3
    tokens = int(table.lengths.sum())
    return {
        "step_time_s": step,
        "breakdown_s": {k: sum(p[k] for p in parts) / 1e3 for k in ("compute", "alltoall", "fixed")},
        "micro_batch_count": len(plan),
        "tokens": tokens,
        "tokens_per_s": tokens / step if step > 0 else 0.0,
    }


def _with_memory(micro_batches: list[dict[str, Any]], consts: FlexSPConstants) -> float:
    """Add each group's per-GPU memory (model states + its tokens' activations over its GPUs); the peak."""
    peak = 0.0
    for mb in micro_batches:
        for g in mb["groups"]:
            mb_per_gpu = consts.model_states_mb_per_gpu + consts.activation_mb_per_token * g["tokens"] / g["sp"]
            g["memory_gib"] = mb_per_gpu / 1024
            peak = max(peak, g["memory_gib"])
    return peak


def _static_plans(table: CostTable, n: int) -> dict[int, list[MicroBatch]]:
    plans = {int(d): static_sp_plan(table, int(d), n) for d in table.sizes}
    return {d: p for d, p in plans.items() if p is not None}


def _baselines(table: CostTable, static_plans: dict[int, list[MicroBatch]]) -> dict[str, Any]:
    static = {str(d): step_time_ms(table, p) / 1e3 for d, p in static_plans.items()}
    best = min(static, key=lambda k: (static[k], int(k))) if static else None
    return {"static_sp": static, "best_static_sp": int(best) if best else None,
            "static_sp_rule": "best-fit-decreasing on tokens at 90% of group memory (the reference's)"}


def _notes(req: FlexSPRequest, plan: list[MicroBatch]) -> list[str]:
    """What a reader of the plan should know that the numbers do not say."""
    heads = req.model.num_attention_heads
    widest = max(g.size for mb in plan for g in mb.groups if g.sequences)
    notes = [note for note in (memory_limit_note(req.cluster, req.constraints),) if note]
    if widest > heads:
        notes.append(f"SP{widest} exceeds the model's {heads} attention heads: Ulysses splits heads, so a run "
                     f"needs head replication (the reference's cost model, used here, ignores this); "
                     f"solver.max_sp = {heads} keeps every group within the head count")
    return notes


def validate(request: dict[str, Any]) -> None:
    parse_request(request)


def solve(request: dict[str, Any], progress: Callable[[float, str], None] | None = None) -> FlexSPResult:
    start, start_cpu = time.perf_counter(), _cpu_s()
    req, consts = parse_request(request)
    table = _table(req, consts)
    n = consts.num_gpus
    opts = req.solver
    settings = None if opts.milp == "none" else MilpSettings(
        backend=opts.milp, max_deterministic_time_s=opts.max_deterministic_time_s, max_nodes=opts.max_nodes,
        seed=req.constraints.seed, exact_up_to=opts.exact_up_to, max_buckets=opts.max_buckets,
        max_sequences=opts.max_sequences, max_runs=opts.max_runs)
    static_plans = _static_plans(table, n)
    extra = {f"static-sp{d}": p for d, p in static_plans.items()}
    plan, report = plan_batch(PackingContext(table, n), settings, progress, extra)
    milp_note = report.failure_note()
    problems = check_plan(table, plan, n)
    assert not problems, problems  # the planner's own invariants; a failure here is a bug, not bad input
    baselines = _baselines(table, static_plans)
    elapsed = time.perf_counter() - start
    if progress:
        progress(1.0, "done")
    micro_batches = plan_to_dict(table, plan, np.arange(len(table.lengths)))
    est = _estimate(table, plan)
    est["peak_memory_gib"] = _with_memory(micro_batches, consts)
    est["memory_limit_gib"] = consts.memory_limit_mb / 1024
    return FlexSPResult.model_validate({
        "estimate": est,
        "notes": _notes(req, plan) + ([milp_note] if milp_note else []),
        "micro_batches": micro_batches,
        "baselines": baselines,
        "lower_bound_s": lower_bound_ms(table, n) / 1e3,
        # cpu_s is the CPU time of this process and its solver subprocesses (CBC): on a machine shared
        # with other jobs it is what the solve itself costs, while time_s (wall) also counts waiting.
        "search": {"time_s": elapsed, "cpu_s": _cpu_s() - start_cpu,
                   **report.to_dict()},
        "cost_model": consts.to_dict(),
    })


def _given_plan(request: dict[str, Any], table: CostTable, n: int) -> list[MicroBatch]:
    """The plan to estimate: ``micro_batches`` as a plan returns them, or ``strategy: {"sp": d}`` (static)."""
    if "micro_batches" in request:
        mbs = request["micro_batches"]
        if not isinstance(mbs, list) or not mbs:
            raise SpecError.at(("micro_batches",), "must be a non-empty list of micro-batches")
        plan = []
        for m, mb in enumerate(mbs):
            groups = mb.get("groups") if isinstance(mb, dict) else None
            if not isinstance(groups, list):
                raise SpecError.at(("micro_batches", m, "groups"), "must be a list of groups")
            out = []
            for q, g in enumerate(groups):
                ok = isinstance(g, dict) and isinstance(g.get("sp"), int) and isinstance(g.get("sequences"), list)
                if not ok or not all(isinstance(i, int) and 0 <= i < len(table.lengths) for i in g["sequences"]):
                    raise SpecError.at(("micro_batches", m, "groups", q),
                                       "needs an integer 'sp' and 'sequences' indexing batch.sequence_lengths")
                out.append(Group(g["sp"], list(g["sequences"])))
            plan.append(MicroBatch(out))
        problems = check_plan(table, plan, n)
        if problems:
            raise SpecError.at(("micro_batches",), "; ".join(problems[:MAX_NAMED]))
        return plan
    strategy = request.get("strategy")
    if isinstance(strategy, dict) and isinstance(strategy.get("sp"), int):
        static = static_sp_plan(table, strategy["sp"], n)
        if static is None:
            raise SpecError.at(("strategy", "sp"), f"static SP{strategy['sp']} cannot hold this batch "
                                                   f"(allowed degrees: {[int(d) for d in table.sizes]})")
        return static
    raise SpecError.at(("micro_batches",), 'give the plan to estimate: "micro_batches" (as a FlexSP plan returns '
                                           'them) or "strategy": {"sp": D} for static sequence parallelism of degree D')


def estimate(request: dict[str, Any]) -> FlexSPEstimateResult:
    """Estimate a given plan: the ``estimate`` object, with each micro-batch's time and breakdown."""
    known = {k: v for k, v in request.items() if k not in ("micro_batches", "strategy")}
    req, consts = parse_request(known)
    table = _table(req, consts)
    plan = _given_plan(request, table, consts.num_gpus)
    out = _estimate(table, plan)
    out["micro_batches"] = plan_to_dict(table, plan, np.arange(len(table.lengths)))
    out["peak_memory_gib"] = _with_memory(out["micro_batches"], consts)
    out["memory_limit_gib"] = consts.memory_limit_mb / 1024
    return FlexSPEstimateResult.model_validate(out)
