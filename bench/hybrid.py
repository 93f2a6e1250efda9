"""Hybrid planner benchmark: side by side with Galvatron 2.4.0, and against uniform baselines (analytic model).

    .venv/bin/python bench/hybrid.py                 # both tables (Galvatron outputs from bench/data/)
    .venv/bin/python bench/hybrid.py --galvatron     # only the Galvatron table
    .venv/bin/python bench/hybrid.py --galvatron-scale   # the same on 4x8 and 8x8 GPUs (extrapolated bandwidths)
    .venv/bin/python bench/hybrid.py --analytic      # only the analytic-model table
    .venv/bin/python bench/hybrid.py --analytic --flash   # the same with fused (flash) attention
    .venv/bin/python bench/hybrid.py --analytic --a100 A100-40GB   # the A100 cases on 40 GB GPUs
    .venv/bin/python bench/hybrid.py --deep          # only search time against depth (128-layer regression)
    .venv/bin/python bench/hybrid.py --plain         # the analytic cases against a plainer Megatron grid
    .venv/bin/python bench/hybrid.py --layer-dp      # the layer DP on memory bins vs on exact Pareto fronts
    .venv/bin/python bench/hybrid.py --sweep         # 196 requests over the presets: certified gaps, search time
    .venv/bin/python bench/hybrid.py --exact         # plans against the exact layer DP (every stage, ~2 min)
    .venv/bin/python bench/hybrid.py --host          # profiles of hosts whose ranks share cores (CPU workers)
    .venv/bin/python bench/hybrid.py --rerun-galvatron   # re-run Galvatron (needs .venv-galvatron) and re-cache
    .venv/bin/python bench/hybrid.py --hetero        # mixed fleets (cluster.groups) against their two baselines
    .venv/bin/python bench/hybrid.py --scale         # 16K-100K H100s: 405B-class dense and large MoE plans
    .venv/bin/python bench/hybrid.py --sizing        # two sizing fronts (the first: 18 points) and their time

Galvatron side: ``../shared/peers/galvatron_pypi/run_galvatron_pypi.py`` runs hetu-galvatron 2.4.0's search
engine; its converted profiles, the hardware files and its result are cached in ``bench/data/galvatron/<case>/``
so this table also runs without the Galvatron venv. paraplan reads the same files with
``cost_model.kind = "galvatron"``; both plans are evaluated by that one model. "search" is the CPU time of
paraplan's search (process time, robust to a loaded machine) and Galvatron's own reported search wall time.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solvers.api import estimate  # noqa: E402
from solvers.cost_model.factory import make_cost_model  # noqa: E402
from solvers.documents.hybrid import HeteroDoc  # noqa: E402
from solvers.errors import InfeasibleError  # noqa: E402
from solvers.exports import EXPORTERS  # noqa: E402
from solvers.hybrid import baselines, stage_table  # noqa: E402
from solvers.hybrid import space as space_module  # noqa: E402
from solvers.hybrid.api import DEFAULT_TIME_LIMIT_S, layer_kinds, solve  # noqa: E402
from solvers.hybrid.cached import CachedStages  # noqa: E402
from solvers.hybrid.planner import PlannerOptions  # noqa: E402
from solvers.hybrid.space import build_space  # noqa: E402
from solvers.request import HybridRequest, parse  # noqa: E402
from solvers.strategy import PlanStrategy  # noqa: E402

DATA = ROOT / "bench" / "data" / "hybrid_galvatron"
RUNNER = ROOT.parent / "shared" / "peers" / "galvatron_pypi" / "run_galvatron_pypi.py"
GALV_PY = ROOT / ".venv-galvatron" / "bin" / "python"

LAUNCHER = ROOT / "bench" / "galvatron_extrapolated.py"  # the runner on the shared 4x8 / 8x8 hardware files


@dataclass(frozen=True)
class GalvatronCase:
    nodes: int
    mem: int  # GB budget per GPU
    chunks: int  # micro-batches; 0 = Galvatron's sweep over every count
    batch: int = 64

    @property
    def name(self) -> str:
        batch = "" if self.batch == 64 else f"_b{self.batch}"
        return f"{self.nodes}x8_{self.mem}GB_{'m' + str(self.chunks) if self.chunks else 'sweep'}{batch}"

    @property
    def shape(self) -> str:
        return f"{self.nodes}nodes_8gpus_per_node"


# the cases, then the same on 32 and 64 GPUs (the shared extrapolated bandwidths), batch 4 per GPU as on 2x8
GALVATRON_CASES = [GalvatronCase(nodes, mem, chunks) for nodes in (1, 2) for mem in (36, 16) for chunks in (8, 0)]
GALVATRON_SCALE_CASES = [GalvatronCase(nodes, mem, chunks, 32 * nodes)
                         for nodes in (4, 8) for mem in (36, 16) for chunks in (8, 0)]


def run_galvatron(case: GalvatronCase) -> Path:
    """Run Galvatron's search for one case and cache what paraplan needs next to its result."""
    work = ROOT / "bench" / "out" / "galvatron" / case.name
    work.mkdir(parents=True, exist_ok=True)
    entry = RUNNER if case.nodes <= 2 else LAUNCHER  # the package ships bandwidths up to 2x8 only
    cmd = [str(GALV_PY), str(entry), "--nodes", str(case.nodes), "--gpus-per-node", "8", "--memory-gb", str(case.mem),
           "--global-batch", str(case.batch), "--chunks", str(case.chunks), "--workdir", str(work),
           "--out", str(work / "result.json")]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    return cache_galvatron(case, work)


def cache_galvatron(case: GalvatronCase, work: Path) -> Path:
    """Keep what paraplan needs of one Galvatron run (its workdir ``work``) in ``bench/data``."""
    out = DATA / case.name
    result = json.loads((work / "result.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "profiles").mkdir(exist_ok=True)
    (out / "hardware").mkdir(exist_ok=True)
    for f in glob.glob(str(Path(result["profiles_dir"]) / "*.json")):
        shutil.copy(f, out / "profiles")
    for f in glob.glob(str(Path(result["hardware_dir"]) / "*.json")):
        if case.shape in f or "overlap" in f:
            shutil.copy(f, out / "hardware")
    for f in glob.glob(str(work / "out_configs" / "*.json")):
        shutil.copy(f, out / "galvatron_config.json")
    keep = {k: result[k] for k in ("engine", "inputs", "notes", "search_s", "timings", "est_iter_s", "throughput",
                                   "feasible", "plan") if k in result}
    (out / "result.json").write_text(json.dumps(keep, indent=1))
    return out


def galvatron_request(case_dir: Path, case: GalvatronCase) -> dict[str, Any]:
    constraints: dict[str, Any] = {"memory_limit_gib": case.mem, "max_tp": 8}
    if case.chunks:
        constraints["micro_batches"] = case.chunks
    return {"kind": "hybrid", "model": {"preset": "llama2-7b"},
            "cluster": {"gpu": "A100-80GB", "nodes": case.nodes, "gpus_per_node": 8},
            "training": {"global_batch_size": case.batch, "seq_length": 2048}, "constraints": constraints,
            "cost_model": {"kind": "galvatron", "profiles_dir": str(case_dir / "profiles"),
                           "hardware_dir": str(case_dir / "hardware")}}


def summarize(strategy: dict[str, Any]) -> str:
    runs: list[list[Any]] = []
    for layer in strategy["layers"]:
        cp = f" cp{layer['cp']}" if layer.get("cp", 1) > 1 else ""
        key = f"tp{layer['tp']}{'sp' if layer['sp'] else ''}{cp} dp{layer['dp']} z{layer['zero']}" + (
            f" rc-{layer['recompute']}" if layer["recompute"] != "none" else "")
        if runs and runs[-1][1] == key:
            runs[-1][0] += 1
        else:
            runs.append([1, key])
    body = ", ".join(f"{n}x[{k}]" for n, k in runs)
    return f"pp{strategy['pp']} m{strategy['micro_batches']} {strategy['stage_layers']} {body}"


def gap_text(out: dict[str, Any]) -> str:
    """The search's certified optimality gap: how far the plan may be from the best plan of the space."""
    gap = out["search"].get("optimality_gap")
    return "-" if gap is None else f"≤ {gap:.2%}"


def galvatron_table(cases: list[GalvatronCase], rerun: bool, time_target_s: float | None = 1.0) -> bool:
    """One row per case: both plans in one Galvatron-compatible model. True when paraplan's plan is at least
    Galvatron's on every case (and, with a time target, found within it)."""
    batches = sorted({c.batch for c in cases})
    print(f"## paraplan vs Galvatron 2.4.0 (llama2-7b, seq 2048, batch {' / '.join(map(str, batches))}, "
          "fine-grained; one Galvatron-compatible model)\n")
    print("| case | Galvatron samples/s | paraplan samples/s | gain | paraplan MFU (A100 peak) | Galvatron plan in our "
          "model | Galvatron search s (wall) | paraplan search s (CPU, incl. baselines) | certified gap | "
          "paraplan plan |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for case in cases:
        case_dir = DATA / case.name
        if rerun or not (case_dir / "result.json").exists():
            if not GALV_PY.exists():
                print(f"| {case.name} | (no cached output and no .venv-galvatron) | | | | | | |")
                continue
            run_galvatron(case)
        galv = json.loads((case_dir / "result.json").read_text())
        req = galvatron_request(case_dir, case)
        out, cpu = timed_solve(req)
        ours = out["estimate"]["throughput_samples_per_s"]
        theirs = galv.get("throughput") or 0.0
        check = ""
        if (case_dir / "galvatron_config.json").exists():
            galvatron_plan = {"format": "galvatron", "path": str(case_dir / "galvatron_config.json")}
            e = estimate({**req, "strategy": galvatron_plan}).to_json()
            check = f"{e['throughput_samples_per_s']:.3f}"
        gain = ours / theirs - 1 if theirs else float("nan")
        ok &= ours >= theirs * (1 - 1e-9) and (time_target_s is None or cpu <= time_target_s)
        mfu = out["estimate"]["mfu"]
        flag = " (implausible: the model's pipeline formula)" if mfu > 1 else ""
        assert out["search"]["planner_step_time_s"] == out["estimate"]["step_time_s"] or abs(
            out["search"]["planner_step_time_s"] / out["estimate"]["step_time_s"] - 1) < 1e-9  # one number
        print(f"| {case.name} | {theirs:.3f} | {ours:.3f} | {gain:+.1%} | {mfu:.0%}{flag} | {check} | "
              f"{galv.get('search_s', 0):.1f} | {cpu:.2f} | {gap_text(out)} | {summarize(out['strategy'])} |")
    return ok


ANALYTIC_CASES: list[tuple[str, str, int, int, int]] = [
    *[("llama3-8b", "H100-SXM", n, 256, 8192) for n in (8, 16, 32, 64)],
    *[("llama2-70b", "A100-80GB", n, 1024, 4096) for n in (64, 128, 256, 512)],
    *[("gpt3-175b", "A100-80GB", n, 1536, 2048) for n in (64, 128, 256, 512)],
]


def _analytic_request(model: str, gpu: str, n: int, batch: int, seq: int) -> dict[str, Any]:
    return {"kind": "hybrid", "model": {"preset": model}, "cluster": {"gpu": gpu, "nodes": n // 8, "gpus_per_node": 8},
            "training": {"global_batch_size": batch, "seq_length": seq}}


def timed_solve(req: dict[str, Any], repeats: int = 3,
                options: PlannerOptions | None = None) -> tuple[dict[str, Any], float]:
    """The result and the least CPU time of ``repeats`` cold searches (the shared VM's timing noise is up
    to 2x between processes; the least is the search's own cost, as timeit reports)."""
    best: dict[str, Any] = {}
    for _ in range(repeats):
        space_module._CANDIDATES.clear()  # cold: nothing from the previous repeat
        out = solve(req, options=options).to_json()
        if not best or out["search"]["cpu_s"] < best["search"]["cpu_s"]:
            best = out
    return best, best["search"]["cpu_s"]


def uniform_summary(strategy: dict[str, Any] | None) -> str:
    """A uniform plan in Megatron-LM's terms: degrees, micro-batches, schedule, ZeRO, recompute."""
    if not strategy:
        return "-"
    x = strategy["layers"][0]
    sched = strategy["schedule"] + (f" v{strategy['virtual_stages']}" if strategy.get("virtual_stages", 1) > 1 else "")
    return (f"tp{x['tp']} pp{strategy['pp']} dp{x['dp']} m{strategy['micro_batches']} {sched} "
            f"z{x['zero']} rc-{x['recompute']}")


def as_run(req: dict[str, Any], out: dict[str, Any], framework: str) -> str:
    """The plan's gain over the Megatron-style best when ``framework`` runs its export (Megatron-LM: dominant
    layout, one recomputation granularity, a split Megatron accepts; torchtitan: dominant layout, FSDP, one
    activation-checkpoint setting; ``solvers.exports``): what a user of that framework gets."""
    run_plan = EXPORTERS[framework].run_plan(PlanStrategy.from_dict(out["strategy"]), None, req)
    if run_plan is None:
        return "-"
    run = estimate({**req, "strategy": run_plan.to_dict()}).to_json()
    base = out["baselines"]["megatron"].get("estimate", {}).get("step_time_s")
    if not base:
        return "-"
    return f"{base / run['step_time_s'] - 1:+.1%}" + ("" if run["fits"] else " (does not fit)")


def analytic_table(flash: bool = False, a100: str = "A100-80GB") -> bool:
    """The issue's cases on a stack with unfused attention (as the calibration data were measured),
    or with ``flash``: fused attention keeps no s² tensors, so memory binds less and uniform plans come closer.
    ``a100``: the GPU of the A100 cases (the issue says "A100s"; on 40 GB memory binds harder)."""
    attention = "fused (flash) attention" if flash else "unfused attention"
    print(f"\n## Analytic model, full space, {attention}, {a100} (paraplan vs best uniform Megatron-style plan "
          "vs ZeRO-3 DP)\n")
    print("| case | paraplan samples/s | Megatron-style best | gain | most any plan can gain | plan's certified gap "
          "| ZeRO-3 DP | search s (CPU, incl. baselines; least of 3) | of which DP search | wall s (shared) | "
          "gain as Megatron-LM runs the export | as torchtitan runs it | paraplan plan | Megatron-style plan |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    wins = losses = reachable = 0
    slow = []
    for model, gpu, n, batch, seq in ANALYTIC_CASES:
        gpu = a100 if gpu.startswith("A100") else gpu
        req = _analytic_request(model, gpu, n, batch, seq)
        req["training"]["stack"] = {"attention": "fused" if flash else "unfused"}
        try:
            out, cpu = timed_solve(req)
        except InfeasibleError as err:  # the planner's answer: the least memory any plan needs
            need = err.min_memory_gib  # type: ignore[attr-defined]
            print(f"| {model} {n}x{gpu} seq{seq} gbs{batch} | infeasible: any plan needs ≥ {need:.1f} GiB per GPU "
                  "| - | - | - | - | - | - | - | - | - | - | - | - |")
            continue
        ours = out["estimate"]["throughput_samples_per_s"]
        meg = out["baselines"]["megatron"].get("throughput_samples_per_s")
        z3 = out["baselines"]["zero3_dp"].get("throughput_samples_per_s")
        gain = ours / meg - 1 if meg else float("inf")
        bound = out["baselines"]["megatron"].get("gain_bound")
        wins += gain >= 0.05
        reachable += bound is None or bound >= 0.05
        losses += gain < -1e-9
        if cpu > (1.0 if n <= 64 else 5.0):
            slow.append(f"{model}@{n}")
        print(f"| {model} {n}x{gpu} seq{seq} gbs{batch} | {ours:.2f} | {meg or 0:.2f} | {gain:+.1%} | "
              f"{'-' if bound is None else f'{bound:+.1%}'} | {gap_text(out)} | {z3 or 0:.2f} | {cpu:.2f} | "
              f"{out['search']['planner_cpu_s']:.2f} | {out['search']['time_s']:.2f} | "
              f"{as_run(req, out, 'megatron')} | {as_run(req, out, 'torchtitan')} | "
              f"{summarize(out['strategy'])} | {uniform_summary(out['baselines']['megatron'].get('strategy'))} |")
    print(f"\n≥5% over Megatron-style on {wins}/{len(ANALYTIC_CASES)} cases; losses: {losses}; "
          f"over the time target: {', '.join(slow) or 'none'}")
    print(f"≥5% reachable at all (certified: no plan of the space gains more than 'most any plan can gain'): "
          f"{reachable}/{len(ANALYTIC_CASES)} cases")
    return wins * 2 >= len(ANALYTIC_CASES) and losses == 0 and not slow


DEEP = {"kind": "hybrid", "model": {"preset": "llama2-70b"},  # bench/screenshots.py's big request, any depth
        "cluster": {"gpu": "H100-SXM", "nodes": 8, "gpus_per_node": 8},
        "training": {"global_batch_size": 256, "seq_length": 4096}}
MIXED = {"preset": "mixtral-8x7b", "moe": {"num_experts": 8, "top_k": 2, "moe_layer_frequency": 2}}


def deep_table() -> None:
    """Search time against depth: dense layers, an infeasible budget (the minimum-memory message), and
    MoE every other layer (two layer kinds: one DP table per stage and phase)."""
    print("\n## Search time against depth (8x8 H100; CPU s of this process, incl. baselines)\n")
    print("| request | layers | search s (CPU) | wall s | configs solved / total | DP runs | time-limited | outcome |")
    print("|---|---|---|---|---|---|---|---|")
    rows: list[tuple[str, dict[str, Any], int]] = []
    for n in (32, 64, 128, 256):
        rows.append(("llama2-70b shape, seq 4096, gbs 256",
                     {**DEEP, "model": {"preset": "llama2-70b", "num_layers": n}}, n))
    tight = {**DEEP, "model": {"preset": "llama2-70b", "num_layers": 128},
             "training": {"global_batch_size": 256, "seq_length": 8192}, "constraints": {"memory_limit_gib": 24}}
    rows.append(("same at seq 8192, 24 GiB (infeasible)", tight, 128))
    for n in (16, 32, 64, 128):
        rows.append(("mixtral-8x7b shape, MoE every 2nd layer, gbs 64", {**DEEP, "model": {**MIXED, "num_layers": n},
                     "training": {"global_batch_size": 64, "seq_length": 4096}}, n))
    galv = GalvatronCase(8, 36, 0, 256)  # the swaps' and hull search's cost grows with depth: Galvatron's formula
    if (DATA / galv.name / "result.json").exists():
        for n in (32, 128):
            req = galvatron_request(DATA / galv.name, galv)
            rows.append((f"Galvatron model ({galv.name}), llama2-7b shape",
                         {**req, "model": {"preset": "llama2-7b", "num_layers": n}}, n))
    for name, req, n in rows:
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            out = solve(req).to_json()
            s = out["search"]
            outcome = f"{out['estimate']['throughput_samples_per_s']:.2f} samples/s, {s['plan_from']}"
            stats = f"{s['configs_solved']} / {s['configs_total']} | {s['dp_runs']} | {s['time_limited']}"
        except InfeasibleError as err:
            need = err.min_memory_gib  # type: ignore[attr-defined]
            outcome, stats = f"infeasible: needs ≥ {need:.1f} GiB", "- | - | -"
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(f"| {name} | {n} | {cpu:.2f} | {wall:.2f} | {stats} | {outcome} |", flush=True)


def host_table() -> None:
    """Profiles taken on hosts whose ranks share cores (``host.slowdown`` > 1: the workers' CPU clusters): the
    step is min(L, max(L / slowdown, W)), not the linear formula, and the planner lifts its linear bounds
    through it. Search time and the certified gap per request."""
    print("\n## Contended hosts (profile `host`, analytic layer times; CPU s of this process, least of 3)\n")
    print("| request | slowdown | samples/s | plan | certified gap | configs solved by the certificate | search s |")
    print("|---|---|---|---|---|---|---|")
    for model, nodes in (("llama2-7b", 1), ("llama2-7b", 2), ("llama2-13b", 2), ("llama2-70b", 4)):
        for slowdown in (1.5, 2.0, 4.0):
            req = {**_analytic_request(model, "A100-80GB", 8 * nodes, 64, 2048),
                   "cost_model": {"kind": "profile",
                                  "profile": {"host": {"busy_ranks": 8, "slowdown": slowdown}}}}
            out, cpu = timed_solve(req)
            s, st = out["search"], out["strategy"]
            print(f"| {model} {nodes}x8 A100-80GB gbs64 | {slowdown} | "
                  f"{out['estimate']['throughput_samples_per_s']:.2f} | pp{st['pp']} m{st['micro_batches']} "
                  f"{st['stage_layers']} | {gap_text(out)} | {s['configs_solved_by_certificate']} | {cpu:.2f} |",
                  flush=True)


def layer_dp_table() -> None:
    """The issue's choice, measured: the layer DP vectorised over memory bins (numpy) or as Pareto fronts over
    (time, memory) on exact memory. Same search otherwise; "stage tables" is the CPU time spent building the
    per-stage tables (where the two differ), "search" the whole solve; least of 2 cold runs."""
    print("\n## Layer DP: numpy over memory bins vs Pareto fronts on exact memory (CPU s, least of 2)\n")
    print("| case | binned: search s | of which stage tables | Pareto: search s | of which stage tables | "
          "step s binned | step s Pareto | Pareto plan faster by | tables that ran a layer DP | largest front |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows: list[tuple[str, dict[str, Any]]] = []
    for case in GALVATRON_CASES:
        case_dir = DATA / case.name
        if (case_dir / "profiles").exists():
            rows.append((f"galvatron {case.name}", galvatron_request(case_dir, case)))
    rows += [(f"{m} {n}x{g}", _analytic_request(m, g, n, b, s)) for m, g, n, b, s in ANALYTIC_CASES]
    rows += [(f"llama2-70b shape, {n} layers, 8x8 H100", {**DEEP, "model": {"preset": "llama2-70b", "num_layers": n}})
             for n in (64, 128)]
    rows += [(f"MoE every 2nd layer, {n} layers, 8x8 H100", {**DEEP, "model": {**MIXED, "num_layers": n},
              "training": {"global_batch_size": 64, "seq_length": 4096}}) for n in (32, 64)]
    real_solve = stage_table.solve
    spent = [0.0]
    fronts = [0]
    with_dp = [0, 0]  # stage tables that ran the layer DP, all stage tables (identical layers: the two-type table)

    def timed_table(*args: Any, **kwargs: Any) -> stage_table.StageTable:
        c = time.process_time()
        tab = real_solve(*args, **kwargs)
        spent[0] += time.process_time() - c
        with_dp[0] += bool(tab.runs)
        with_dp[1] += 1
        for run in tab.runs:
            fronts[0] = max(fronts[0], max(getattr(run.table, "front_sizes", [0]) or [0]))
        return tab

    stage_table.solve = timed_table
    totals = {"binned": 0.0, "pareto": 0.0}
    try:
        for name, req in rows:
            got: dict[str, tuple[float, float, float]] = {}
            dp_share = ""
            for method in ("binned", "pareto"):
                best: tuple[float, float, float] | None = None
                fronts[0] = 0
                for _ in range(2):
                    with_dp[:] = [0, 0]
                    spent[0] = 0.0
                    out, cpu = timed_solve(req, 1, PlannerOptions(time_limit_s=DEFAULT_TIME_LIMIT_S, layer_dp=method))
                    if best is None or cpu < best[0]:
                        best = (cpu, spent[0], out["estimate"]["step_time_s"])
                assert best is not None
                got[method] = best
                dp_share = dp_share or f"{with_dp[0]} / {with_dp[1]}"
                totals[method] += best[0]
            (cb, tb, sb), (cp, tp, sp) = got["binned"], got["pareto"]
            print(f"| {name} | {cb:.2f} | {tb:.2f} | {cp:.2f} | {tp:.2f} | {sb:.4g} | {sp:.4g} | {sb / sp - 1:+.2%} | "
                  f"{dp_share} | {fronts[0]} |", flush=True)
    finally:
        stage_table.solve = real_solve
    print(f"\ntotal search CPU s: binned {totals['binned']:.2f}, Pareto {totals['pareto']:.2f}")


SWEEP_MODELS = ["gpt3-1.3b", "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b",
                "llama3-405b", "mixtral-8x7b", "qwen2-7b", "qwen2-72b", "vit-huge", "bert-large", "t5-11b"]
SWEEP_CLUSTERS = [("H100-SXM", 1, 8), ("A100-40GB", 2, 8), ("H100-SXM", 16, 8), ("A100-80GB", 64, 8), ("L4", 3, 4),
                  ("B200", 128, 8), ("H100-SXM", 5, 8)]


def sweep_table() -> None:
    """Every model preset on 1 to 1,024 GPUs of five kinds (odd counts included: 12 L4, 40 H100), seq 2048 and
    8192, a global batch drawn per request (fixed seed): how close each plan is certified to the best plan of
    its space, and how long the search takes. Infeasible requests count apart (the minimum memory is named)."""
    import random

    rng = random.Random(0)
    rows = []
    infeasible = 0
    for model in SWEEP_MODELS:
        for gpu, nodes, per_node in SWEEP_CLUSTERS:
            for seq in (2048, 8192):
                gbs = rng.choice([nodes * per_node, 2 * nodes * per_node, 512, 1000])
                req = {"kind": "hybrid", "model": {"preset": model},
                       "cluster": {"gpu": gpu, "nodes": nodes, "gpus_per_node": per_node},
                       "training": {"global_batch_size": gbs, "seq_length": seq}}
                try:
                    out = solve(req).to_json()
                except InfeasibleError:
                    infeasible += 1
                    continue
                s = out["search"]
                name = f"{model} {nodes * per_node}x{gpu} seq{seq} gbs{gbs}"
                rows.append((s["optimality_gap"] or 0.0, s["cpu_s"], name))
    gaps = sorted(rows, reverse=True)
    cpu = sorted(c for _, c, _ in rows)
    print(f"\n## Sweep: {len(rows) + infeasible} requests, {len(rows)} planned, {infeasible} infeasible "
          "(minimum memory named)\n")
    print(f"certified gap: mean {sum(g for g, _, _ in rows) / len(rows):.2%}, worst {gaps[0][0]:.2%}, over 1 % on "
          f"{sum(g > 0.01 for g, _, _ in rows)}; search CPU s: median {cpu[len(cpu) // 2]:.2f}, most {cpu[-1]:.2f}\n")
    print("| request | certified gap | search s (CPU) |\n|---|---|---|")
    for g, c, name in gaps[:6]:
        print(f"| {name} | {g:.2%} | {c:.2f} |")


# (model, GPU, nodes of 8, global batch, seq, memory limit GiB or None): drawn at random over presets and
# scales (8 to 16,384 GPUs, some memory-capped), kept where the exact layer DP answers within ~20 s
EXACT_CASES: list[tuple[str, str, int, int, int, int | None]] = [
    ("t5-11b", "H100-SXM", 2048, 8192, 4096, None), ("gpt3-13b", "L4", 8, 128, 4096, 16),
    ("gpt3-13b", "A100-80GB", 2, 32, 4096, 16), ("gpt3-175b", "L4", 64, 512, 4096, 16),
    ("llama3-70b", "L4", 16, 256, 4096, 24), ("t5-11b", "A100-40GB", 64, 256, 4096, 32),
    ("llama2-7b", "B200", 8, 128, 8192, 24), ("gpt3-175b", "A100-40GB", 16, 256, 8192, None),
    ("gpt3-13b", "B200", 2, 8, 8192, None), ("llama3-70b", "H100-SXM", 16, 512, 2048, None),
]


def exact_table() -> None:
    """How much the planner's fast stage tables leave: each request planned as usual, and again with every
    stage's layers on the exact layer DP (Pareto fronts on exact memory, every mix of strategies, run however
    large; ``PlannerOptions(layer_dp="pareto", dp_work_limit=inf)``), both through the same search and
    certificate. Stages of identical layers normally take the two-strategy table (plus one layer of a third)."""
    print("\n## Plans against the exact layer DP (same search; CPU s)\n")
    print("| request | step s | exact layer DP: step s | plan slower by | certified gap | search s | exact s |")
    print("|---|---|---|---|---|---|---|")
    equal, worst = 0, 0.0
    for model, gpu, nodes, batch, seq, mem in EXACT_CASES:
        req: dict[str, Any] = {"kind": "hybrid", "model": {"preset": model},
                               "cluster": {"gpu": gpu, "nodes": nodes, "gpus_per_node": 8},
                               "training": {"global_batch_size": batch, "seq_length": seq}}
        if mem:
            req["constraints"] = {"memory_limit_gib": mem}
        out = solve(req)
        c0 = time.process_time()
        exact = solve(req, options=PlannerOptions(time_limit_s=600, layer_dp="pareto", dp_work_limit=float("inf")))
        cpu = time.process_time() - c0
        ours, best = out["estimate"]["step_time_s"], exact["estimate"]["step_time_s"]
        slower = ours / best - 1
        equal += slower <= 1e-9
        worst = max(worst, slower)
        name = f"{model} {nodes * 8}x{gpu} seq{seq} gbs{batch}" + (f" {mem} GiB" if mem else "")
        print(f"| {name} | {ours:.5g} | {best:.5g} | {slower:+.3%} | {out['search']['optimality_gap']:.2%} | "
              f"{out['search']['cpu_s']:.2f} | {cpu:.1f} |", flush=True)
    print(f"\nplan as fast as the exact layer DP's on {equal}/{len(EXACT_CASES)}; slower by at most {worst:.3%}")


def plain_megatron_step_s(req: dict[str, Any]) -> float | None:
    """The best uniform plan of a plainer Megatron-LM grid than the baseline's: 1F1B only, the distributed
    optimizer (ZeRO-1) wherever dp > 1, no or full recomputation (no selective, no interleaving)."""
    parsed = parse(HybridRequest, req)
    cm = CachedStages(make_cost_model(parsed))
    sp = build_space(parsed, "full")
    configs, strategies = baselines.megatron_grid(sp)
    configs = [c for c in configs if c.schedule == "1f1b"]
    strategies = [x for x in strategies if x.recompute != "selective" and x.zero == (1 if x.dp > 1 else 0)]
    b = baselines.best_uniform(cm, sp, layer_kinds(parsed.model), configs, strategies, "plain")
    return b.step_time_s if b else None


def plain_table() -> None:
    """Is the baseline too strong for the ≥ 5 % goal? The same cases against the plainer grid."""
    print("\n## Gain over a plainer Megatron-style grid (1F1B, ZeRO-1, no or full recompute)\n")
    print("| case | gain over the baseline | gain over the plainer grid |")
    print("|---|---|---|")
    wins = 0
    for model, gpu, n, batch, seq in ANALYTIC_CASES:
        req = _analytic_request(model, gpu, n, batch, seq)
        out = solve(req)
        step, plain = out["estimate"]["step_time_s"], plain_megatron_step_s(req)
        gain = plain / step - 1 if plain else float("inf")
        wins += gain >= 0.05
        print(f"| {model} {n}x{gpu} | {out['baselines']['megatron']['gain']:+.1%} | {gain:+.1%} |")
    print(f"\n≥5% over the plainer grid on {wins}/{len(ANALYTIC_CASES)} cases")


# (model, [(GPU, nodes)], global batch, sequence length): mixed fleets of 8-GPU nodes, 400 Gb/s between the groups
HETERO_CASES: list[tuple[str, list[tuple[str, int]], int, int]] = [
    ("llama2-13b", [("H100-SXM", 1), ("A100-40GB", 2)], 96, 4096),
    ("llama3-70b", [("H100-SXM", 4), ("A100-80GB", 8)], 384, 4096),
    ("llama2-7b", [("H100-SXM", 1), ("L4", 2)], 64, 2048),
    ("gpt3-13b", [("A100-80GB", 2), ("A100-40GB", 2)], 128, 2048),
    ("llama3-8b", [("H200", 2), ("H100-SXM", 2)], 128, 8192),
    ("qwen2-72b", [("B200", 4), ("H100-SXM", 4)], 256, 4096),
    ("mixtral-8x7b", [("H100-SXM", 2), ("A100-80GB", 2)], 128, 4096),
]


def hetero_table() -> None:
    """Each mixed fleet's plan against the best plan on its fastest group alone and the best uniform plan chosen
    blind to the GPU types (planned for the groups' least-memory GPU, stages even), run on the real cluster. All
    figures are estimates of the analytic cost model; "search" is this process' CPU time for the whole solve,
    both baselines included."""
    print("| model | fleet | plan step s | stages (layers on each GPU type) | vs fastest group alone | "
          "vs type-blind uniform | gap | search CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    for model, groups, batch, seq in HETERO_CASES:
        request = {"kind": "hybrid", "model": {"preset": model},
                   "cluster": {"groups": [{"gpu": g, "nodes": n} for g, n in groups],
                               "inter_group_bandwidth_Gbps": 400},
                   "training": {"global_batch_size": batch, "seq_length": seq}}
        c0 = time.process_time()
        out = solve(request)
        cpu = time.process_time() - c0
        hetero = out.hetero
        assert hetero is not None
        stages = " ".join(f"{p.layers}@{'+'.join(p.gpus)}" for p in hetero.placement)

        def gain(name: str, hetero: HeteroDoc = hetero) -> str:
            b = hetero.baselines.get(name)
            if b is None or b.gain is None:
                return f"({b.note if b is not None else 'none'})"
            return f"{b.gain:+.1%}" + ("" if b.fits else " (it does not fit)")

        fleet = " + ".join(f"{n}x8 {g}" for g, n in groups)
        gap = out.search.optimality_gap
        print(f"| {model} | {fleet} | {out.estimate.step_time_s:.3f} | {stages} | {gain('fastest_group')} | "
              f"{gain('type_oblivious')} | {gap:.2%} | {cpu:.1f} |" if gap is not None else "", flush=True)


# (model, nodes of 8 H100, global batch, sequence length)
SCALE_CASES: list[tuple[str, int, int, int]] = [
    ("llama3-405b", 2048, 16384, 8192),
    ("llama3-405b", 4096, 16384, 8192),
    ("llama3-405b", 8192, 32768, 8192),
    ("llama3-405b", 12800, 51200, 8192),
    ("llama3-405b", 12500, 50000, 8192),
    ("mixtral-8x22b", 2048, 16384, 4096),
    ("mixtral-8x22b", 8192, 65536, 4096),
    ("mixtral-8x22b", 12800, 102400, 4096),
]


def scale_table() -> None:
    """The planner on 16K-102K H100s (default stack): its plan, estimated step and MFU, the certified gap and the
    solve's CPU and wall time in this process (baselines and certificate included). Estimates, not measurements."""
    print("| model | GPUs | batch | plan (first layer) | step s | MFU | gap | CPU s | wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model, nodes, batch, seq in SCALE_CASES:
        request = {"kind": "hybrid", "model": {"preset": model}, "cluster": {"gpu": "H100-SXM", "nodes": nodes},
                   "training": {"global_batch_size": batch, "seq_length": seq}}
        c0, t0 = time.process_time(), time.perf_counter()
        out = solve(request)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        x, st = out.strategy.layers[0], out.strategy
        layout = f"pp{st.pp} tp{x.tp} cp{x.cp} dp{x.dp}" + (f" ep{x.ep}" if x.ep > 1 else "") + \
            (f" v{st.virtual_stages}" if st.virtual_stages > 1 else "")
        gap = out.search.optimality_gap
        print(f"| {model} | {nodes * 8:,} | {batch:,} | {layout} | {out.estimate.step_time_s:.2f} | "
              f"{out.estimate.mfu:.1%} | {'-' if gap is None else f'{gap:.2%}'} | {cpu:.1f} | {wall:.1f} |", flush=True)


# Two sizing requests for llama3-70b (1T tokens, 60-day deadline, global batch 1536 x 4096): a grid of 28 node counts
# (16-12,288 GPUs: 2^k and 3 x 2^k nodes, and 9 x 2^k) with H100 at 2.50 and H200 at 3.20 per GPU-hour, whose front
# has 18 points (20 before the GPUs' GEMMs were priced at their measured matmul shares), then the default grid (two
# node counts per doubling to 256 nodes) with H100 at 2.50 and A100-80GB at 1.20. The 18-point front runs first, in
# a process that has priced nothing yet (a process keeps cost-model answers across requests of one GPU type: the
# second request starts with some of its H100 answers known).
SIZING_CASES: list[tuple[str, dict[str, Any]]] = [
    ("28 node counts, H100 + H200", {"nodes": [2, 3, 4, 6, 8, 9, 12, 16, 18, 24, 32, 36, 48, 64, 72, 96, 128, 144,
                                               192, 256, 288, 384, 512, 576, 768, 1024, 1152, 1536],
                                     "price_per_gpu_hour": {"H100-SXM": 2.5, "H200": 3.2}}),
    ("default grid, H100 + A100", {"max_nodes": 256, "price_per_gpu_hour": {"H100-SXM": 2.5, "A100-80GB": 1.2}}),
]


def sizing_request(sizing: dict[str, Any]) -> dict[str, Any]:
    """The request of a ``SIZING_CASES`` entry (its plan's own cluster: 8 nodes of H100)."""
    return {"kind": "hybrid", "model": {"preset": "llama3-70b"}, "cluster": {"gpu": "H100-SXM", "nodes": 8},
            "training": {"global_batch_size": 1536, "seq_length": 4096},
            "sizing": {"tokens": 1e12, "deadline_days": 60, **sizing}}


def host_factor() -> float:
    """How many times slower than the reference VM this host runs ``tests/cpu_budget.py``'s reference workload (the
    VM where the planner's time goals were first met; CPU time, best of five)."""
    spec = importlib.util.spec_from_file_location("cpu_budget", ROOT / "tests" / "cpu_budget.py")
    assert spec is not None and spec.loader is not None
    budget = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(budget)
    return float(budget.machine_factor())


def sizing_table() -> None:
    """Each sizing request of ``SIZING_CASES``: the front and the time the whole request took (its plan for the
    request's own cluster, then a plan per size). Days and costs are estimates; the times are measurements."""
    print(f"host: {host_factor():.2f}x the reference VM's time on the reference workload; {os.cpu_count()} CPUs")
    for name, sizing in SIZING_CASES:
        request = sizing_request(sizing)
        c0, t0 = cpu_with_children(), time.perf_counter()
        out = solve(request)
        cpu, wall = cpu_with_children() - c0, time.perf_counter() - t0
        assert out.front is not None and out.sizing is not None
        print(f"\n{name}\n")
        print("| GPUs | GPU | days | cost | MFU | meets 60 days |")
        print("|---|---|---|---|---|---|")
        for p in out.front:
            print(f"| {p.gpus} | {p.cluster['gpu']} | {p.days:.1f} | {p.cost:,.0f} | {p.mfu:.1%} | "
                  f"{p.meets_deadline} |")
        sz = out.sizing
        print(f"{len(out.front)}-point front of {sz.clusters_tried} clusters tried ({sz.clusters_pruned} pruned by "
              f"their floor, {sz.clusters_beaten_in_search} beaten in their search, {len(sz.clusters_without_plan)} "
              f"without a plan; {sz.workers} processes); sizing {sz.cpu_s:.1f} s CPU, {sz.time_s:.1f} s wall; the "
              f"whole request {cpu:.1f} s CPU, {wall:.1f} s wall; load average {os.getloadavg()[0]:.1f}", flush=True)


def cpu_with_children() -> float:
    """This process' CPU time and that of its waited-for children (the sizing's planning processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--galvatron", action="store_true")
    ap.add_argument("--analytic", action="store_true")
    ap.add_argument("--flash", action="store_true", help="the analytic table with fused (flash) attention")
    ap.add_argument("--a100", default="A100-80GB", help="GPU preset of the A100 cases (A100-80GB or A100-40GB)")
    ap.add_argument("--deep", action="store_true", help="only the search-time-against-depth table")
    ap.add_argument("--plain", action="store_true", help="the analytic cases against a plainer Megatron grid")
    ap.add_argument("--galvatron-scale", action="store_true",
                    help="the Galvatron table on 4x8 and 8x8 GPUs (the shared extrapolated bandwidths)")
    ap.add_argument("--rerun-galvatron", action="store_true")
    ap.add_argument("--layer-dp", action="store_true", help="the layer DP on memory bins vs exact Pareto fronts")
    ap.add_argument("--sweep", action="store_true", help="196 requests over the presets: gaps and search time")
    ap.add_argument("--exact", action="store_true", help="plans against the exact layer DP on every stage")
    ap.add_argument("--host", action="store_true", help="profiles of hosts whose ranks share cores")
    ap.add_argument("--hetero", action="store_true", help="mixed fleets against their two baselines")
    ap.add_argument("--scale", action="store_true", help="16K-100K GPUs")
    ap.add_argument("--sizing", action="store_true", help="a sizing front and its time")
    a = ap.parse_args()
    if a.sizing:
        sizing_table()
        return
    if a.scale:
        scale_table()
        return
    if a.hetero:
        hetero_table()
        return
    if a.host:
        host_table()
        return
    if a.exact:
        exact_table()
        return
    if a.plain:
        plain_table()
        return
    if a.layer_dp:
        layer_dp_table()
        return
    if a.sweep:
        sweep_table()
        return
    both = not (a.galvatron or a.galvatron_scale or a.analytic or a.deep)
    if a.galvatron or both or a.rerun_galvatron:
        galvatron_table(GALVATRON_CASES, a.rerun_galvatron)
    if a.galvatron_scale:
        galvatron_table(GALVATRON_SCALE_CASES, a.rerun_galvatron, time_target_s=None)
    if a.analytic or both:
        analytic_table(a.flash, a.a100)
    if a.deep or both:
        deep_table()


if __name__ == "__main__":
    main()
