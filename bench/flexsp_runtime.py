"""FlexSP on the worker runtime, measured on this host: FlexSP's per-step groupings against every feasible static
SP degree on the same length stream, and the FlexSP cost model's predicted step times against measured ones.

    .venv/bin/python bench/flexsp_runtime.py                 # 2 rounds (C: FlexSP, static SP; then A, B: FlexSP)
    .venv/bin/python bench/flexsp_runtime.py --rounds 2 --steps 8 --json out.json
    .venv/bin/python bench/flexsp_runtime.py --stepwise 3 --steps 8   # same-load comparison, steps interleaved

1. Calibration passes (each its own 4-rank torchrun launch, ``--calibrate-rank``; no evaluated plan is in them):
   * compute: forward + backward of the model on one packed sequence per rank, every rank at once (all ranks busy,
     as in a step), over a grid of single sequences and of packed pieces; per point the slowest rank (the cost
     form's rule: a micro-batch takes its slowest group) and the median over repeats; non-negative least squares of
     ``beta + alpha2 * tokens + alpha1 * sum(piece**2)`` (``fit_compute``);
   * all-to-all, in the step: one sequence of 256-1536 tokens per group of 2 (of 4) ranks, all groups at once,
     trained as the runtime trains it (each rank its 1/sp slice, Ulysses over the group: ``worker.runtime.ulysses``,
     q, k, v sequence -> heads and the attention output back, forward and backward, once per layer); what its time
     exceeds the SP1 fit's ``beta + (alpha2 s + alpha1 s**2) / sp`` by is the group's communication
     (``fit_in_step_bandwidth``). The bandwidth per group size is in the cost form's units: the megabytes
     ``solvers.flexsp.constants.comm_mb_per_token`` counts (16 * layers * hidden bytes per token, i.e. bf16) over
     those milliseconds, a line through the origin (``fit_bandwidth``); the runtime sends fp32, so these "GB/s"
     are half the bytes moved per second. These are the plans' constants. The exchanges alone (the same calls on
     random slices of 128-768 tokens per rank, nothing between them) are printed beside them, for comparison;
   * activations: the bytes autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``, parameters
     excluded) on one rank for a grid of lengths; MB per token is the slope of a least-squares line
     (``fit_activation``). Measured, not the model's formula (CPU peak RSS says nothing about activations);
   * unmodelled per-step time: the gradient all-reduce and the AdamW step (the FlexSP cost form has no per-step
     term); printed, not added to any prediction.
2. Plans (``PLANS``, fixed before any run was looked at): the explicit cost form (``cost_model.kind = "flexsp"``)
   with the first pass's constants; ``zero = 0`` (the runtime replicates parameters and AdamW states: 16 bytes per
   parameter); a memory limit chosen from the measured activation size so that each rank holds ``capacity``
   tokens, fewer than the stream's longest sequences: static SP1 is infeasible on every plan's stream (the bench
   checks each degree on every batch of the run with ``estimate(strategy = {"sp": D})`` and prints why not).
3. Comparison (``--compare``, plan C): FlexSP (planner thread on rank 0, ``worker.runtime.flexsp_train``) and every
   static SP degree feasible on the stream (``--static-sp D``), same stream and steps, launched interleaved
   F S F S ... (one round each, ``--rounds``); per run the measured median step time after warm-up, and per
   round FlexSP's measured median over the best static run's.
4. Closed loop: every FlexSP run (plan C each round, plus A and B in turn) predicted vs measured: the mean over
   the timed steps of the cost model's estimate for the grouping each step ran (``solvers.flexsp.api.estimate``)
   against the mean measured step time of those steps, and the MAPE. The predictions use the constants fitted to
   the calibration passes before and after the run's round (means of their points: the host is shared and its load
   drifts);
   nothing is fitted to a run's times, so every run is held out.

5. ``--stepwise REPEATS`` (instead of 3 and 4): one calibration pass, then FlexSP's groupings of ``--compare``'s
   stream and each feasible static degree's, run with the runtime's step (``worker.runtime.flexsp.step_gradients``
   and AdamW) interleaved step by step in one launch, REPEATS times each: separate launches meet different
   background load, steps interleaved meet the same. ``flexsp+planner`` runs a FlexSP solve of the next batch in a
   thread of rank 0 meanwhile, as ``flexsp_train`` does. Per grouping the mean over steps of the median measured
   time and the mean predicted time.

Measured step time = ``flexsp_train``'s per-step wall time (the step's micro-batches, the gradient all-reduce and
the optimizer step; a step's wait for a late plan is reported as ``plan_wait_s`` beside it). The host is shared
(2 cores, 4 ranks, other jobs): the load average is printed with every calibration pass and run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solvers.errors import SpecError  # noqa: E402
from solvers.flexsp.api import estimate, solve  # noqa: E402
from solvers.flexsp.constants import comm_mb_per_token  # noqa: E402
from solvers.specs import ModelSpec  # noqa: E402

WIKIPEDIA = ROOT.parent / "shared" / "reference" / "flexsp" / "wikipedia_lengths.txt"
RANKS = 4
MODEL: dict[str, Any] = {"name": "flexsp-cpu", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                         "num_kv_heads": 4, "ffn_hidden_size": 344, "vocab_size": 256, "mlp": "swiglu"}
SPEC = ModelSpec.model_validate(MODEL)
# name -> (max length of the stream, sequences per step, tokens per GPU the memory limit leaves, offset in stream)
PLANS: dict[str, tuple[int, int, int, int]] = {
    "A": (1024, 8, 640, 0),
    "B": (2048, 8, 1100, 20_000),
    "C": (1024, 16, 400, 40_000),
}
COMPUTE_SINGLE = (32, 128, 256, 512, 768)
COMPUTE_PACKED = ((256, 128, 64, 32, 16), (300, 300), (100,) * 6, (500, 150, 60))
ALLTOALL_TOKENS = (128, 256, 512, 768)  # per rank: a group's packed tokens / sp, as the runtime sends them
ACTIVATION_LENGTHS = (128, 256, 512, 1024)
SP_LENGTHS = (256, 512, 1024, 1536)  # one sequence per SP group


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores"


# ---------------------------------------------------------------- fits (pure; tests/bench/test_flexsp_runtime_fit.py)

def fit_compute(points: Sequence[tuple[Sequence[int], float]]) -> dict[str, float]:
    """``(pieces, ms)`` per measurement (the lengths of one packed sequence, its micro-batch time) -> the cost
    form's non-negative ``beta_ms``, ``alpha2_ms_per_token``, ``alpha1_ms_per_token2`` (least squares) and the
    fit's relative RMS error."""
    a = np.array([[1.0, float(sum(p)), float(sum(s * s for s in p))] for p, _ in points])
    y = np.array([ms for _, ms in points])
    # scaled columns: tokens² is ~1e6 times tokens, which nnls' tolerance would otherwise treat as zero
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, y)
    coef = coef / scale
    resid = a @ coef - y
    return {"beta_ms": float(coef[0]), "alpha2_ms_per_token": float(coef[1]),
            "alpha1_ms_per_token2": float(coef[2]),
            "rel_rms": float(np.sqrt(np.mean((resid / y) ** 2)))}


def fit_bandwidth(points: Sequence[tuple[float, float]]) -> float:
    """``(counted MB, ms)`` per measurement -> GB/s (= MB/ms) of the least-squares line through the origin (the
    cost form has no latency term: the calls' latency is spread over the bytes of the sizes measured)."""
    mb = np.array([p[0] for p in points])
    ms = np.array([p[1] for p in points])
    return float(np.sum(mb * mb) / np.sum(mb * ms))


def fit_in_step_bandwidth(points: Sequence[tuple[int, float]], d: int, compute: dict[str, float],
                          mb_per_token: float) -> float:
    """``(tokens, ms)`` of one sequence trained by a group of ``d`` ranks -> the cost form's GB/s for ``d``: what
    the time exceeds the compute fit's ``beta + (alpha2 s + alpha1 s**2) / d`` by is the group's communication of
    ``mb_per_token * s / d`` MB (each at least 1 % of its time: the bandwidth stays finite)."""
    comm = [(mb_per_token * s / d,
             max(ms - compute["beta_ms"] - (compute["alpha2_ms_per_token"] * s
                                            + compute["alpha1_ms_per_token2"] * s * s) / d, 0.01 * ms))
            for s, ms in points]
    return fit_bandwidth(comm)


def fit_activation(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(tokens, saved bytes)`` -> (MB per token, MB at zero tokens) of the least-squares line."""
    x = np.array([float(p[0]) for p in points])
    y = np.array([p[1] / 2**20 for p in points])
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


# ---------------------------------------------------------------- calibration launch (every rank)

def calibrate_rank(out: Path, repeats: int) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from worker.runtime.flexsp import IGNORE, all_reduce_gradients, pack, sequence_tokens
    from worker.runtime.model import ModelConfig, build_model
    from worker.runtime.ulysses import apply_ulysses, gather_heads_scatter_sequence, gather_sequence_scatter_heads

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = ModelSpec.model_validate(MODEL)
    cfg = ModelConfig.from_spec(spec)
    model = build_model(cfg, 0, "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    loads = [load()]

    def slowest(ms: float) -> float:
        every: list[Any] = [None] * world
        dist.all_gather_object(every, ms)
        return float(max(every))


    def fwd_bwd(pieces: Sequence[int]) -> float:
        packed = pack([sequence_tokens(cfg.vocab_size, n, 0, 0, i) for i, n in enumerate(pieces)], 1, 0)
        dist.barrier()
        start = time.perf_counter()
        logits = model(packed.inputs, segments=packed.segments)
        ce = F.cross_entropy(logits.float().flatten(0, 1), packed.labels.flatten(), ignore_index=IGNORE,
                             reduction="sum")
        (ce / sum(pieces)).backward()
        ms = 1e3 * (time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        return slowest(ms)  # the cost form's rule: a micro-batch takes its slowest group

    grid = [(n,) for n in COMPUTE_SINGLE] + [tuple(p) for p in COMPUTE_PACKED]
    fwd_bwd((64,))  # warm-up
    compute: dict[tuple[int, ...], list[float]] = {p: [] for p in grid}
    for _ in range(repeats):
        for p in grid:
            compute[p].append(fwd_bwd(p))

    # the per-step part the cost form does not have: gradient all-reduce and AdamW step
    step_ms = []
    for _ in range(repeats):
        fwd_bwd((32,))
        for prm in model.parameters():
            prm.grad = torch.zeros_like(prm)
        dist.barrier()
        start = time.perf_counter()
        all_reduce_gradients(model)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_ms.append(slowest(1e3 * (time.perf_counter() - start)))

    mb_per_token = comm_mb_per_token(spec)
    alltoall: dict[int, list[tuple[float, float]]] = {}
    sp_steps: dict[int, list[tuple[int, float]]] = {}
    for d in (2, 4):
        groups = [dist.new_group(list(range(first, first + d))) for first in range(0, world, d)]
        group = groups[rank // d]
        points = []
        for n in ALLTOALL_TOKENS:
            times = []
            for _ in range(repeats):
                xs = [torch.randn(1, n, cfg.num_heads, cfg.head_dim, requires_grad=True) for _ in range(3)]
                dist.barrier()
                start = time.perf_counter()
                total = torch.zeros(())
                for _layer in range(cfg.num_layers):  # q, k, v in; the attention output back
                    q, k, v = (gather_sequence_scatter_heads(x, group) for x in xs)
                    total = total + gather_heads_scatter_sequence(q, group).sum() + k.sum() + v.sum()
                total.backward()
                times.append(slowest(1e3 * (time.perf_counter() - start)))
            points.append((mb_per_token * n, statistics.median(times)))  # n = s / d tokens: the form's s / d
        alltoall[d] = points
        # the same exchanges inside the step: one sequence per group trained as the runtime trains it (its 1/d
        # slice per rank, Ulysses over the group); what exceeds the SP1 fit's compute / d is the group's
        # communication (fit_calibration), waits for the group's other ranks on a contended host included
        in_step = []
        for n in SP_LENGTHS:
            times = []
            for _ in range(repeats):
                packed = pack([sequence_tokens(cfg.vocab_size, n, 0, 0, 0)], d, rank % d)
                apply_ulysses(model, group)
                dist.barrier()
                start = time.perf_counter()
                logits = model(packed.inputs, segments=packed.segments)
                ce = F.cross_entropy(logits.float().flatten(0, 1), packed.labels.flatten(), ignore_index=IGNORE,
                                     reduction="sum")
                (ce / n).backward()
                times.append(slowest(1e3 * (time.perf_counter() - start)))
                apply_ulysses(model, None)
                model.zero_grad(set_to_none=True)
            in_step.append((n, statistics.median(times)))
        sp_steps[d] = in_step

    activation = []
    for n in ACTIVATION_LENGTHS:
        params = {p.data_ptr() for p in model.parameters()}
        seen: dict[int, int] = {}

        def keep(t: torch.Tensor, seen: dict[int, int] = seen, params: set[int] = params) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
            return t

        packed = pack([sequence_tokens(cfg.vocab_size, n, 0, 0, 0)], 1, 0)
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            logits = model(packed.inputs, segments=packed.segments)
            ce = F.cross_entropy(logits.float().flatten(0, 1), packed.labels.flatten(), ignore_index=IGNORE)
        ce.backward()
        model.zero_grad(set_to_none=True)
        activation.append((n, float(sum(seen.values()))))

    loads.append(load())
    if rank == 0:
        out.write_text(json.dumps({
            "compute": [[list(p), statistics.median(ts)] for p, ts in compute.items()],
            "step_overhead_ms": statistics.median(step_ms),
            "alltoall": {str(d): pts for d, pts in alltoall.items()},
            "sp_steps": {str(d): pts for d, pts in sp_steps.items()},
            "activation": activation,
            "params": sum(p.numel() for p in model.parameters()),
            "loads": loads,
        }))
    dist.barrier()
    return 0


def calibrate(workdir: Path, repeats: int, tag: int) -> dict[str, Any]:
    """One calibration pass (its own launch): the raw measurements."""
    out = workdir / f"calibration-{tag}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
           str(Path(__file__).resolve()), "--calibrate-rank", str(out), str(repeats)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    raw: dict[str, Any] = json.loads(out.read_text())
    return raw


def fit_calibration(passes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The cost form's constants from calibration passes, each point the mean over the passes."""
    compute: dict[tuple[int, ...], list[float]] = {}
    for raw in passes:
        for p, ms in raw["compute"]:
            compute.setdefault(tuple(p), []).append(ms)
    fitted = fit_compute([(p, statistics.fmean(ms)) for p, ms in compute.items()])
    isolated, bandwidth = {}, {}
    for d in passes[0]["alltoall"]:
        points = [(mb, statistics.fmean(raw["alltoall"][d][k][1] for raw in passes))
                  for k, (mb, _) in enumerate(passes[0]["alltoall"][d])]
        isolated[int(d)] = fit_bandwidth(points)
        in_step = [(n, statistics.fmean(raw["sp_steps"][d][k][1] for raw in passes))
                   for k, (n, _) in enumerate(passes[0]["sp_steps"][d])]
        bandwidth[int(d)] = fit_in_step_bandwidth(in_step, int(d), fitted, comm_mb_per_token(SPEC))
    act_mb, act_zero = fit_activation([tuple(x) for x in passes[0]["activation"]])  # (deterministic)
    return {"compute": fitted, "alltoall_GBps_by_group_size": bandwidth, "isolated_alltoall_GBps": isolated,
            "activation_mb_per_token": act_mb,
            "activation_mb_at_zero": act_zero, "params_billion": passes[0]["params"] / 1e9,
            "step_overhead_ms": statistics.fmean(raw["step_overhead_ms"] for raw in passes),
            "loads": [x for raw in passes for x in raw["loads"]]}


def describe(cal: dict[str, Any]) -> str:
    c = cal["compute"]
    return (f"  compute  beta {c['beta_ms']:.2f} ms, alpha2 {c['alpha2_ms_per_token']:.4g} ms/token, alpha1 "
            f"{c['alpha1_ms_per_token2']:.4g} ms/token^2 (fit rel. RMS {c['rel_rms']:.1%})\n"
            "  all-to-all in the step " + ", ".join(f"SP{d}: {v:.4f}" for d, v in
                                                    cal["alltoall_GBps_by_group_size"].items())
            + " GB/s (cost-form MB / ms; the plans' constants); exchanges alone " + ", ".join(
                f"SP{d}: {v:.4f}" for d, v in cal["isolated_alltoall_GBps"].items()) + "\n"
            f"  activations {cal['activation_mb_per_token'] * 1024:.2f} KiB/token saved for backward (measured, "
            f"{cal['activation_mb_at_zero']:+.2f} MB at 0 tokens)\n"
            f"  unmodelled per-step all-reduce + AdamW {cal['step_overhead_ms']:.1f} ms; "
            f"{cal['params_billion'] * 1e9:,.0f} params; {' / '.join(cal['loads'])}")


# ---------------------------------------------------------------- plans and runs

def stream(max_length: int, offset: int) -> list[int]:
    """The Wikipedia lengths of at most ``max_length`` tokens, from ``offset`` on (the runtime's length stream reads
    the same file with the same cap; the bench hands it the tail starting at ``offset``)."""
    lengths = [n for n in map(int, WIKIPEDIA.read_text().split()) if 0 < n <= max_length]
    return lengths[offset:]


def memory_limit_gib(cal: dict[str, Any], capacity: int) -> float:
    """The limit at which a GPU holds ``capacity`` tokens of activations after its model states (ZeRO-0: 16 bytes
    per parameter, the cost form's params_billion * 16 GiB), half a token's worth of margin."""
    states_mb = cal["params_billion"] * 16 * 1024
    return (states_mb + (capacity + 0.5) * cal["activation_mb_per_token"]) / 1024


def request(cal: dict[str, Any], name: str, lengths: list[int]) -> dict[str, Any]:
    _, _, capacity, _ = PLANS[name]
    c = cal["compute"]
    cost = {"kind": "flexsp", "alpha1_ms_per_token2": c["alpha1_ms_per_token2"],
            "alpha2_ms_per_token": c["alpha2_ms_per_token"], "beta_ms": c["beta_ms"],
            "activation_mb_per_token": cal["activation_mb_per_token"], "params_billion": cal["params_billion"],
            "alltoall_GBps_by_group_size": {str(d): v for d, v in cal["alltoall_GBps_by_group_size"].items()}}
    return {"kind": "flexsp", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": RANKS}, "precision": "fp32",
            "model": MODEL, "cost_model": cost, "batch": {"sequence_lengths": lengths},
            "constraints": {"memory_limit_gib": memory_limit_gib(cal, capacity), "zero": 0},
            "solver": {"max_sp": RANKS}}


def capacity_per_gpu(req: dict[str, Any]) -> int:
    from solvers.flexsp.request import parse_request

    return parse_request(req)[1].token_capacity_per_gpu


def feasible_degrees(req: dict[str, Any], batches: list[list[int]]) -> dict[int, str | None]:
    """Per static degree, None if it holds every batch of the run, else why not."""
    out: dict[int, str | None] = {}
    for d in (1, 2, 4):
        why = None
        for k, lengths in enumerate(batches):
            try:
                estimate({**req, "batch": {"sequence_lengths": lengths}, "strategy": {"sp": d}})
            except SpecError:
                why = (f"step {k}'s longest sequence, {max(lengths)} tokens, is more than SP{d} holds: "
                       f"{d} x {capacity_per_gpu(req)} tokens")
                break
        out[d] = why
    return out


def run(doc: dict[str, Any], lengths_file: Path, max_length: int, steps: int, workdir: Path,
        static_sp: int | None, budget_s: float) -> dict[str, Any]:
    from worker.launch import Launch, run_locally

    before = load()
    metrics = run_locally(doc, Launch(RANKS, lengths=lengths_file, max_length=max_length, plan_budget_s=budget_s,
                                      static_sp=static_sp), steps, workdir, timeout_s=600, max_launches=1)
    metrics["loads"] = [before, load()]
    return metrics


def timed(metrics: dict[str, Any], warmup: int) -> list[dict[str, Any]]:
    return list(metrics["flexsp_steps"][warmup:])


def summary(metrics: dict[str, Any], warmup: int) -> dict[str, Any]:
    steps = timed(metrics, warmup)
    meas = [r["step_time_s"] for r in steps]
    pred = [r["predicted_step_time_s"] for r in steps]
    return {"measured_median_s": statistics.median(meas), "predicted_median_s": statistics.median(pred),
            "measured_mean_s": statistics.fmean(meas), "predicted_mean_s": statistics.fmean(pred),
            "plan_wait_s": sum(r["plan_wait_s"] for r in steps),
            "fallbacks": sum(r["grouping"] == "fallback" for r in steps),
            "steps": [{"measured_s": r["step_time_s"], "predicted_s": r["predicted_step_time_s"],
                       "grouping": r["grouping"], "plan_wait_s": r["plan_wait_s"], "lengths": r["lengths"],
                       "micro_batches": r["micro_batches"]} for r in metrics["flexsp_steps"]]}


def repredict(row: dict[str, Any], cal: dict[str, Any], warmup: int) -> float:
    """The mean predicted step time over a run's timed steps under the constants ``cal`` (the groupings it ran)."""
    return statistics.fmean(
        estimate({**request(cal, row["plan"], step["lengths"]), "micro_batches": step["micro_batches"]}).step_time_s
        for step in row["steps"][warmup:])


# ---------------------------------------------------------------- per-step interleaving (one launch)

def stepwise_rank(spec_path: Path, out: Path) -> int:
    """Every rank: the runtime's step (``worker.runtime.flexsp.step_gradients`` and the AdamW step) for each step of
    a stream under each grouping of ``spec`` in turn, step by step, so that every grouping of a step meets the
    same background load; ``flexsp+planner`` also runs a FlexSP solve of the next batch in a thread of rank 0
    while it trains, as ``flexsp_train`` does."""
    import threading

    import torch
    import torch.distributed as dist

    from solvers.specs import ModelSpec
    from worker.runtime.flexsp import GroupCache, grouping_of, sequence_tokens, step_gradients
    from worker.runtime.model import ModelConfig, build_model

    spec = json.loads(spec_path.read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = ModelConfig.from_spec(ModelSpec.model_validate(MODEL))
    model = build_model(cfg, 0, "cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    groups = GroupCache()
    groups.ensure_aligned(world, [1, 2, 4])
    batches, kinds, requests = spec["batches"], spec["kinds"], spec["requests"]
    times: dict[str, list[list[float]]] = {name: [[] for _ in batches] for name in kinds}
    names = list(kinds)
    for rep in range(spec["repeats"] + 1):  # the first pass warms up
        for k, batch in enumerate(batches):
            for name in names[k % len(names):] + names[:k % len(names)]:  # rotated: no grouping always first
                grouping = grouping_of(kinds[name][k])
                thread = None
                if name == "flexsp+planner" and rank == 0:
                    thread = threading.Thread(target=solve, args=(requests[(k + 1) % len(batches)],))
                dist.barrier()
                if thread is not None:
                    thread.start()

                def tokens_of(i: int, b: list[int] = batch, k: int = k) -> torch.Tensor:
                    return sequence_tokens(cfg.vocab_size, b[i], 0, k, i)

                start = time.perf_counter()
                step_gradients(model, grouping, tokens_of, batch, groups)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                elapsed = time.perf_counter() - start
                if thread is not None:
                    thread.join()
                if rep > 0:
                    times[name][k].append(elapsed)
    if rank == 0:
        out.write_text(json.dumps(times))
    dist.barrier()
    return 0


def stepwise(work: Path, cal: dict[str, Any], name: str, steps: int, repeats: int) -> None:
    """FlexSP's groupings of plan ``name``'s stream against each feasible static degree's, interleaved step by step
    in one launch (``stepwise_rank``); prints the mean measured and predicted step time per grouping."""
    max_length, size, _, offset = PLANS[name]
    lengths = stream(max_length, offset)
    batches = [lengths[k * size:(k + 1) * size] for k in range(steps)]
    requests = [request(cal, name, b) for b in batches]
    flex = [solve(r).model_dump(mode="json")["micro_batches"] for r in requests]
    kinds: dict[str, list[Any]] = {"flexsp": flex, "flexsp+planner": flex}
    for d, why in feasible_degrees(requests[0], batches).items():
        if why is None:
            kinds[f"static-sp{d}"] = [estimate({**r, "strategy": {"sp": d}}).model_dump(mode="json")["micro_batches"]
                                      for r in requests]
    spec, out = work / f"stepwise-{name}.json", work / f"stepwise-{name}-out.json"
    spec.write_text(json.dumps({"batches": batches, "kinds": kinds, "requests": requests, "repeats": repeats}))
    before = load()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
           str(Path(__file__).resolve()), "--stepwise-rank", str(spec), str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    times = json.loads(out.read_text())
    print(f"per-step interleaving, plan {name}, {steps} steps x {repeats} ({before}; after: {load()}):")
    best = None
    for kind, per_step in times.items():
        measured = statistics.fmean(statistics.median(t) for t in per_step)
        predicted = statistics.fmean(estimate({**r, "micro_batches": mbs}).step_time_s
                                     for r, mbs in zip(requests, kinds[kind], strict=True))
        print(f"  {kind:>15}: measured mean step {measured:.3f} s, predicted {predicted:.3f} s")
        if kind.startswith("static") and (best is None or measured < best[1]):
            best = (kind, measured)
    if best is not None:
        flex_measured = statistics.fmean(statistics.median(t) for t in times["flexsp+planner"])
        print(f"  FlexSP (with its planner) / best static ({best[0]}): {flex_measured / best[1]:.3f}")


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--calibrate-rank":
        code = calibrate_rank(Path(sys.argv[2]), int(sys.argv[3]))
        os._exit(code)  # skip gloo teardown (see worker/runtime/train.py)
    if len(sys.argv) == 4 and sys.argv[1] == "--stepwise-rank":
        os._exit(stepwise_rank(Path(sys.argv[2]), Path(sys.argv[3])))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calibration-repeats", type=int, default=2)
    ap.add_argument("--calibrate-once", action="store_true",
                    help="calibration passes before the first round and after the last only (default: after every "
                         "round too)")
    ap.add_argument("--budget-s", type=float, default=10.0, help="FlexSP planner budget per step")
    ap.add_argument("--compare", default="C", help="the plan FlexSP is compared with static SP on")
    ap.add_argument("--loop", default="A,B", help="further FlexSP plans of the closed loop, one per round, cycled")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--stepwise", type=int, default=0, metavar="REPEATS",
                    help="only calibrate, then FlexSP's and the static degrees' groupings of --compare's stream "
                         "interleaved step by step in one launch, REPEATS times each")
    ap.add_argument("--calibration", type=Path, help="with --stepwise: the calibration passes of an earlier "
                                                     "--json instead of a new pass (all of them, merged)")
    args = ap.parse_args()
    print(f"start: {load()}", flush=True)
    if args.stepwise:
        with tempfile.TemporaryDirectory(prefix="flexsp-runtime-") as tmp:
            passes = (json.loads(args.calibration.read_text())["passes"] if args.calibration else
                      [calibrate(Path(tmp), args.calibration_repeats, 0)])
            cal = fit_calibration(passes)
            print("calibration:\n" + describe(cal), flush=True)
            stepwise(Path(tmp), cal, args.compare, args.steps, args.stepwise)
        return 0
    names = [args.compare, *args.loop.split(",")]
    with tempfile.TemporaryDirectory(prefix="flexsp-runtime-") as tmp:
        work = Path(tmp)
        passes = [calibrate(work, args.calibration_repeats, 0)]
        cal = fit_calibration(passes)
        print("calibration 0 (the plans' constants):\n" + describe(cal), flush=True)
        docs, files, feasible = {}, {}, {}
        for name in names:
            max_length, size, capacity, offset = PLANS[name]
            lengths = stream(max_length, offset)
            files[name] = work / f"stream-{name}.txt"
            # the plan's own batch is the block before the stream the runtime reads (step 0), as in the tests
            first, rest = lengths[:size], lengths[size:]
            files[name].write_text("\n".join(map(str, rest)))
            req = request(cal, name, first)
            docs[name] = {"kind": "flexsp", "request": req, "result": solve(req).model_dump(mode="json")}
            batches = [first] + [rest[k * size:(k + 1) * size] for k in range(args.steps - 1)]
            why = feasible_degrees(req, batches)
            feasible[name] = [d for d, w in why.items() if w is None]
            print(f"plan {name}: Wikipedia lengths <= {max_length} from #{offset}, {size} per step; memory limit "
                  f"{req['constraints']['memory_limit_gib'] * 1024:.2f} MiB per rank = {capacity} tokens of "
                  f"activations after the model states; longest sequence of the run {max(max(b) for b in batches)}; "
                  "static " + "; ".join(f"SP{d} {'feasible' if w is None else 'infeasible (' + w + ')'}"
                                        for d, w in why.items()), flush=True)
        rows: list[dict[str, Any]] = []
        loop = args.loop.split(",") if args.loop else []
        for r in range(args.rounds):
            todo = [(args.compare, sp) for sp in (None, *feasible[args.compare])]
            if loop:
                todo.append((loop[r % len(loop)], None))
            for name, sp in todo:
                m = run(docs[name], files[name], PLANS[name][0], args.steps, work / f"{name}-{r}-{sp}", sp,
                        args.budget_s)
                s = summary(m, args.warmup)
                rows.append({"plan": name, "round": r, "static_sp": sp, "calibration": len(passes) - 1, **s,
                             "loads": m["loads"], "groupings": m["groupings"]})
                print(f"  round {r} plan {name} {'FlexSP' if sp is None else 'static SP' + str(sp)}: measured "
                      f"median {s['measured_median_s']:.3f} s (mean {s['measured_mean_s']:.3f}); plan wait "
                      f"{s['plan_wait_s']:.2f} s, fallbacks {s['fallbacks']}; {m['loads'][1]}", flush=True)
            if r < args.rounds - 1 and args.calibrate_once:
                continue
            passes.append(calibrate(work, args.calibration_repeats, len(passes)))
            print(f"calibration {len(passes) - 1}:\n" + describe(fit_calibration(passes[-1:])), flush=True)
        print("FlexSP vs static SP (plan " + args.compare + "; measured median step time after warm-up, and the "
              "mean predicted by the calibrations before and after the run):")
        for row in rows:
            row["predicted_mean_s"] = repredict(row, fit_calibration(passes[row["calibration"]:row["calibration"] + 2]),
                                                args.warmup)
        for r in range(args.rounds):
            mine = [x for x in rows if x["round"] == r and x["plan"] == args.compare]
            flex = next(x for x in mine if x["static_sp"] is None)
            statics = [x for x in mine if x["static_sp"] is not None]
            for x in mine:
                print(f"  round {r} {'FlexSP' if x['static_sp'] is None else 'static SP' + str(x['static_sp']):>10}: "
                      f"measured {x['measured_median_s']:.3f} s (mean {x['measured_mean_s']:.3f}), predicted mean "
                      f"{x['predicted_mean_s']:.3f} s")
            if statics:
                best = min(statics, key=lambda x: x["measured_median_s"])
                print(f"  round {r}: FlexSP / best static (SP{best['static_sp']}) measured median "
                      f"{flex['measured_median_s'] / best['measured_median_s']:.3f}")
        print("closed loop (FlexSP runs; predicted vs measured mean step time over the timed steps; held out: "
              "the constants come from the calibration passes only):")
        errors = []
        for x in rows:
            if x["static_sp"] is not None:
                continue
            err = abs(x["predicted_mean_s"] - x["measured_mean_s"]) / x["measured_mean_s"]
            errors.append(err)
            print(f"  plan {x['plan']} round {x['round']}: predicted {x['predicted_mean_s']:.3f} s, measured "
                  f"{x['measured_mean_s']:.3f} s, error {err:.1%}")
        print(f"MAPE over {len(errors)} FlexSP runs ({len({x['plan'] for x in rows})} plans): "
              f"{statistics.fmean(errors):.1%}; end: {load()}")
    if args.json:
        args.json.write_text(json.dumps({"passes": passes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
