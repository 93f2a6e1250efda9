"""The assignment MILP of one micro-batch, solved with OR-Tools CP-SAT or PuLP (HiGHS / CBC).

Variables: ``y[p]`` — virtual group slot p (of size d_p) is used; ``x[k, p]`` — how many sequences of
bucket k go to slot p; ``M`` — the slowest group's load. Constraints: every bucket is fully placed, only
in slots it fits; a slot holds at most d_p · capacity tokens; every slot's load is ≤ M; the used slots
take at most N GPUs (the rest become idle SP-1 groups). Slots of one size are interchangeable, so they
are ordered (used first, then by load) to cut symmetry. Minimise M.

Determinism: CP-SAT runs one worker with a fixed seed and a *deterministic* time limit; the PuLP
backends run one thread with a node limit. Either way the same input gives the same plan on a loaded
machine. The greedy packing seeds both: as a solution hint (CP-SAT) or initial values (CBC), and as an
upper bound on M (all backends), so the MILP only ever returns something at least as good.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from solvers.flexsp.bucketing import Bucket, bucket_sequences
from solvers.flexsp.packing import Packing, PackingContext, finish
from solvers.flexsp.plan import MicroBatch

Backend = Literal["cpsat", "highs", "cbc"]
SCALE = 1000.0  # CP-SAT needs integers: loads in microseconds


@dataclass(frozen=True)
class MilpSettings:
    backend: Backend = "cpsat"
    max_deterministic_time_s: float = 0.05  # CP-SAT's deterministic time per micro-batch
    max_nodes: int = 2000  # PuLP backends: branch-and-bound nodes per micro-batch
    seed: int = 0
    exact_up_to: int = 24  # sequences; larger micro-batches are bucketed
    max_buckets: int = 16
    max_sequences: int = 24  # larger micro-batches keep the greedy packing (the planner's choice)
    max_runs: int = 2  # micro-batches per step that get the MILP, furthest above their bound first


@dataclass(frozen=True)
class MilpOutcome:
    """What one MILP run gave: a whole packing, or a failure in the backend's own words.

    ``plan`` is None exactly when the run failed (``failure`` then says how); a plan no better than the warm
    start is not a failure. ``status`` is the backend's status word, as it reported it."""

    status: str
    plan: MicroBatch | None = None
    failure: str | None = None


@dataclass
class _Model:
    buckets: list[Bucket]
    slot_size_index: list[int]  # per slot: index into ctx.sizes
    counts: list[int]
    lengths: list[int]
    time_ms: list[list[float]]  # [bucket][size index], at the bucket's boundary length
    fits: list[list[bool]]


def _build(ctx: PackingContext, rows: list[int], s: MilpSettings) -> _Model:
    if len(rows) > s.exact_up_to:
        buckets = bucket_sequences(rows, ctx.table.lengths, s.max_buckets)
    else:
        buckets = [Bucket(ctx.lengths[r], (r,)) for r in sorted(rows, key=lambda r: (-ctx.lengths[r], r))]
    lengths = [b.boundary for b in buckets]
    counts = [len(b.members) for b in buckets]
    rep = [b.members[0] for b in buckets]  # the longest member has the boundary length
    time = [ctx.time[r] for r in rep]
    fits = [[bool(f) for f in ctx.fits[r]] for r in rep]
    slots: list[int] = []
    for j, d in enumerate(ctx.sizes):
        fitting = sum(c for c, f in zip(counts, fits, strict=True) if f[j])
        slots += [j] * min(ctx.num_gpus // d, fitting)
    return _Model(buckets, slots, counts, lengths, time, fits)


def _model_load(m: _Model, p_members: dict[int, int], j: int) -> float:
    return sum(m.time_ms[k][j] * n for k, n in p_members.items())


def _hint(m: _Model, ctx: PackingContext, warm: MicroBatch | None) -> dict[int, dict[int, int]]:
    """Map the warm packing onto slots: per size, busiest group first (matches the symmetry order)."""
    if warm is None:
        return {}
    bucket_of = {r: k for k, b in enumerate(m.buckets) for r in b.members}
    by_size: dict[int, list[dict[int, int]]] = {}
    for g in warm.groups:
        if not g.sequences:
            continue
        cnt: dict[int, int] = {}
        for r in g.sequences:
            cnt[bucket_of[r]] = cnt.get(bucket_of[r], 0) + 1
        by_size.setdefault(ctx.index[g.size], []).append(cnt)
    out: dict[int, dict[int, int]] = {}
    for j, groups in by_size.items():
        groups.sort(key=lambda c: -_model_load(m, c, j))
        slots = [p for p, sj in enumerate(m.slot_size_index) if sj == j]
        if len(groups) > len(slots):
            return {}
        for p, c in zip(slots, groups, strict=False):
            out[p] = c
    return out


def _decode(m: _Model, ctx: PackingContext, x: dict[tuple[int, int], int]) -> MicroBatch:
    """Hand each bucket's real sequences (longest first) to the slots the MILP gave it counts in."""
    queues = [list(b.members) for b in m.buckets]
    sizes, members = [], []
    for p, j in enumerate(m.slot_size_index):
        mem: list[int] = []
        for k in range(len(m.buckets)):
            n = x.get((k, p), 0)
            mem += queues[k][:n]
            del queues[k][:n]
        if mem:
            sizes.append(ctx.sizes[j])
            members.append(mem)
    assert not any(queues), "MILP left sequences unplaced"
    loads = [sum(ctx.time[r][ctx.index[d]] for r in mem) for d, mem in zip(sizes, members, strict=True)]
    tokens = [sum(ctx.lengths[r] for r in mem) for mem in members]
    return finish(ctx, Packing(sizes, members, loads, tokens, [r for mem in members for r in mem]))


def _solve_cpsat(m: _Model, ctx: PackingContext, s: MilpSettings, hint: dict[int, dict[int, int]],
                 upper_ms: float) -> tuple[str, dict[tuple[int, int], int] | None, str | None]:
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    K, P = len(m.buckets), len(m.slot_size_index)
    t_int = [[math.ceil(t * SCALE) if math.isfinite(t) else 0 for t in row] for row in m.time_ms]
    M = model.new_int_var(0, math.ceil(upper_ms * SCALE) + K, "M")
    y = [model.new_bool_var(f"y{p}") for p in range(P)]
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    for k in range(K):
        for p, j in enumerate(m.slot_size_index):
            if m.fits[k][j]:
                x[k, p] = model.new_int_var(0, m.counts[k], f"x{k}_{p}")
                model.add(x[k, p] <= m.counts[k] * y[p])
        model.add(sum(x[k, p] for p in range(P) if (k, p) in x) == m.counts[k])
    loads = []
    for p, j in enumerate(m.slot_size_index):
        terms = [(k, x[k, p]) for k in range(K) if (k, p) in x]
        model.add(sum(m.lengths[k] * v for k, v in terms) <= ctx.capacity[j] * y[p])
        load = sum(t_int[k][j] * v for k, v in terms)
        model.add(load <= M)
        loads.append(load)
    model.add(sum(ctx.sizes[j] * y[p] for p, j in enumerate(m.slot_size_index)) <= ctx.num_gpus)
    for p in range(P - 1):
        if m.slot_size_index[p] == m.slot_size_index[p + 1]:
            model.add(y[p] >= y[p + 1])
            model.add(loads[p] >= loads[p + 1])
    model.minimize(M)
    for p in range(P):
        model.add_hint(y[p], p in hint)
        for k in range(K):
            if (k, p) in x:
                model.add_hint(x[k, p], hint.get(p, {}).get(k, 0))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = s.seed
    solver.parameters.max_deterministic_time = s.max_deterministic_time_s
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        why = (f"no solution within its deterministic time limit ({s.max_deterministic_time_s:g} s)"
               if status == cp_model.UNKNOWN else "no solution at or below the warm start's load")
        return name, None, f"CP-SAT {name}: {why}"
    return name, {key: int(solver.value(v)) for key, v in x.items() if solver.value(v)}, None


def _solve_pulp(m: _Model, ctx: PackingContext, s: MilpSettings, hint: dict[int, dict[int, int]],
                upper_ms: float) -> tuple[str, dict[tuple[int, int], int] | None, str | None]:
    import pulp

    K, P = len(m.buckets), len(m.slot_size_index)
    prob = pulp.LpProblem("flexsp_micro_batch", pulp.LpMinimize)
    M = pulp.LpVariable("M", lowBound=0, upBound=upper_ms * (1 + 1e-9) + 1e-6)
    y = [pulp.LpVariable(f"y{p}", cat="Binary") for p in range(P)]
    x: dict[tuple[int, int], pulp.LpVariable] = {}
    for k in range(K):
        for p, j in enumerate(m.slot_size_index):
            if m.fits[k][j]:
                x[k, p] = pulp.LpVariable(f"x{k}_{p}", lowBound=0, upBound=m.counts[k], cat="Integer")
                prob += x[k, p] <= m.counts[k] * y[p]
        prob += pulp.lpSum(x[k, p] for p in range(P) if (k, p) in x) == m.counts[k]
    loads = []
    for p, j in enumerate(m.slot_size_index):
        terms = [(k, x[k, p]) for k in range(K) if (k, p) in x]
        prob += pulp.lpSum(m.lengths[k] * v for k, v in terms) <= ctx.capacity[j] * y[p]
        load = pulp.lpSum(m.time_ms[k][j] * v for k, v in terms)
        prob += load <= M
        loads.append(load)
    prob += pulp.lpSum(ctx.sizes[j] * y[p] for p, j in enumerate(m.slot_size_index)) <= ctx.num_gpus
    for p in range(P - 1):
        if m.slot_size_index[p] == m.slot_size_index[p + 1]:
            prob += y[p] >= y[p + 1]
            prob += loads[p] >= loads[p + 1]
    prob += M
    for p in range(P):
        y[p].setInitialValue(1 if p in hint else 0)
        for k in range(K):
            if (k, p) in x:
                x[k, p].setInitialValue(hint.get(p, {}).get(k, 0))
    if s.backend == "highs":
        solver = pulp.HiGHS(msg=False, threads=1, mip_max_nodes=s.max_nodes, random_seed=s.seed)
    else:
        solver = pulp.PULP_CBC_CMD(msg=False, threads=1, maxNodes=s.max_nodes, warmStart=bool(hint),
                                   options=[f"randomSeed {s.seed + 1}", f"randomCbcSeed {s.seed + 1}"])
    backend = "HiGHS" if s.backend == "highs" else "CBC"
    try:
        prob.solve(solver)
    except KeyError:  # PuLP's HiGHS wrapper knows no status for HiGHS' node/solution limits (kSolutionLimit)
        return "stopped", None, (f"{backend} stopped at a limit ({s.max_nodes} nodes) with a status PuLP cannot "
                                 "name; no solution read back")
    name = pulp.LpStatus[prob.status]
    if name not in ("Optimal", "Not Solved") or M.varValue is None:
        why = ("no solution at or below the warm start's load (bucket lengths round sequences up)"
               if name == "Infeasible" else "no solution read back")
        return name, None, f"{backend} {name}: {why}"
    out = {}
    for key, v in x.items():
        val = round(v.varValue or 0)
        if val:
            out[key] = val
    # "Not Solved" (CBC stopped at its node limit) may hold a partial assignment: only a whole one is a plan
    placed = [0] * K
    for (k, _), val in out.items():
        placed[k] += val
    if placed != list(m.counts):
        return name, None, (f"{backend} {name}: stopped at its node limit ({s.max_nodes}) with a partial "
                            f"assignment ({sum(placed)} of {sum(m.counts)} sequences placed)")
    return name, out, None


def solve_micro_batch(ctx: PackingContext, rows: list[int], settings: MilpSettings,
                      warm: MicroBatch | None = None) -> MilpOutcome:
    """The MILP's packing of ``rows`` (never worse than ``warm`` when given), or its failure."""
    m = _build(ctx, rows, settings)
    hint = _hint(m, ctx, warm)
    upper = max((_model_load(m, c, m.slot_size_index[p]) for p, c in hint.items()), default=math.inf)
    if not math.isfinite(upper):
        upper = sum(max((t for t, f in zip(row, fr, strict=True) if f), default=0.0) * n
                    for row, fr, n in zip(m.time_ms, m.fits, m.counts, strict=True))
    solve = _solve_cpsat if settings.backend == "cpsat" else _solve_pulp
    status, x, failure = solve(m, ctx, settings, hint, upper)
    if x is None:
        return MilpOutcome(status, failure=failure)
    return MilpOutcome(status, plan=_decode(m, ctx, x))


def model_size(ctx: PackingContext, rows: list[int], settings: MilpSettings) -> tuple[int, int]:
    """(buckets, slots) of the model ``solve_micro_batch`` would build — for reporting."""
    m = _build(ctx, rows, settings)
    return len(m.buckets), len(m.slot_size_index)

