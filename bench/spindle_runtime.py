"""Spindle's closed loop on this host: calibrate the Spindle cost model on 4 gloo ranks, plan with it, run the plans
with the worker's Spindle runtime, compare predicted and measured iteration times.

    .venv/bin/python bench/spindle_runtime.py                 # calibrate, then the three plans
    .venv/bin/python bench/spindle_runtime.py --steps 12 --json out.json

1. Calibration (one 4-rank torchrun launch, ``--calibrate-rank``; no plan runs in it):
   * per metaop, its module's layers as the runtime builds them (``worker.runtime.model.Block``, each its own
     weights), at the local batches its slices can get (ceil(batch / n), n = 1..4) and the sequence the runtime
     runs them at (a language model's predecessors' outputs prefix its text), every rank at once and each repeat
     as long as its slowest rank (``worker.profiler.layer_time``): a ``train`` metaop's forward + backward, a
     ``forward`` one's forward under ``no_grad``, a ``decode`` one's forwards on each growing prefix of its
     generation (the runtime has no KV cache), over the number of layers; least squares of ``intercept + slope *
     local batch`` per metaop: its ``time_ms_per_layer``, given in the request beside its module shape (the shape
     still sizes memory, hand-overs and gradient sync);
   * gloo all-reduces over groups of 2 and 4 ranks on the gradient buckets' sizes: least squares of the Spindle
     cost model's ``latency * (g + 1) + 2 (g - 1) / g * bytes / (0.7 * bandwidth)`` (bytes counted as the model
     counts them, bf16): ``options.link_latency_us`` and the cluster's ``intra_node_bandwidth_GBps``.
2. Plans (``PLANS``): the captioning workload of the runtime tests (a vision encoder feeding a decoder, and the
   decoder alone on text) at two batch mixes, and the RL workload (rollout, reward and reference scoring, policy
   update), each planned by the real planner with the calibrated request. The modules are widened (``widened``):
   with the tests' tiny ones, fixed costs the model does not price made most of an iteration (first run, below).
3. Each plan runs ``--steps`` iterations in its own 4-rank launch (``worker.launch.run_locally``); measured = the
   median iteration after ``--warmup``; predicted = the plan's ``estimate.iteration_time_s``. Nothing is fitted
   to the plans' times; but the calibration method (whole stacks, link sizes, no sync overlap, widened modules)
   was revised after runs of these same three plans, so they are not held out from the method.

What the cost model does not price (so the prediction leaves out): embeddings, heads and losses, the AdamW step,
the end-of-iteration loss all-reduce. The host is shared (2 cores, 4 ranks): the load average is printed with
the calibration and each run.

Goal (issue 32): MAPE <= 25 % over the Spindle plans, three runs quoted. Every plan is predicted fast. What the
cost model leaves out, found by timing the runtime's phases per rank: the AdamW step (no term; 10-35 ms, 5-7 %
of an iteration), embeddings, heads and losses. The RL plan is furthest off (about -30 %); its phases were not
timed again after the calibration's last revision.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solvers.api import solve  # noqa: E402
from solvers.run_spindle import MetaOpRun, load_program  # noqa: E402
from solvers.spindle.cost import ACHIEVED_LINK_SHARE  # noqa: E402
from tests.worker.spindle_plans import captioning_request, rl_request  # noqa: E402

RANKS = 4
# The runtime tests' modules (hidden 32-48, 8-16 tokens) run an iteration in ~50 ms on this host, most of it
# fixed costs (gloo messages at ~1-7 ms each, the AdamW step, the loss all-reduce); as a training step is dominated
# by its layers, the bench widens them (hidden 256, ffn 512, 8 heads, 4x the tokens): same graphs, same planner.
WIDTH, FFN, HEADS, SEQ_SCALE = 256, 512, 8, 4


def widened(request: dict[str, Any]) -> dict[str, Any]:
    ops = [{**op, "module": {**op["module"], "hidden_size": WIDTH, "ffn_hidden_size": FFN, "num_attention_heads": HEADS,
                             "seq_length": op["module"]["seq_length"] * SEQ_SCALE}}
           for op in request["workload"]["metaops"]]
    # the runtime runs data-parallel slices only: no tensor / context parallel layouts
    return {**request, "workload": {**request["workload"], "metaops": ops},
            "options": {**request["options"], "hybrid_layouts": False}}


PLANS: dict[str, Any] = {
    "captioning-30-6": lambda: widened(captioning_request(30, 6)),
    "captioning-16-16": lambda: widened(captioning_request(16, 16)),
    "rl-8": lambda: widened(rl_request(8)),
}
ALLREDUCE_FLOATS = (65_536, 1_048_576, 4_194_304)  # the widened modules' buckets: 1-6 M parameters


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f}"


# ------------------------------------------------------------------------------- fits (pure)

def fit_layer(points: list[tuple[int, float]]) -> dict[str, float]:
    """``(local batch, ms)`` -> ``{"slope_ms_per_sample", "intercept_ms"}``, non-negative least squares."""
    a = np.array([[float(b), 1.0] for b, _ in points])
    y = np.array([ms for _, ms in points])
    coef, _ = nnls(a, y)
    if coef.sum() < 1e-3:  # the request's floor: a layer of one sample takes at least a microsecond
        coef = np.array([0.0, max(1e-3, float(y.mean()))])
    return {"slope_ms_per_sample": float(coef[0]), "intercept_ms": float(coef[1])}


def fit_links(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """``(group size g, bytes as the model counts them, seconds)`` of all-reduces inside one node ->
    (latency s, bandwidth B/s) of ``latency * (g + 1) + 2 (g - 1) / g * bytes / (ACHIEVED_LINK_SHARE * bandwidth)``."""
    a = np.array([[g + 1.0, 2.0 * (g - 1) / g * nbytes / ACHIEVED_LINK_SHARE] for g, nbytes, _ in points])
    y = np.array([s for _, _, s in points])
    coef, _ = nnls(a, y)
    latency, per_byte = float(coef[0]), float(coef[1])
    return latency, (1.0 / per_byte if per_byte > 0 else 1e12)


# ------------------------------------------------------------------------------- what to calibrate

def metaop_cases(plan: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Per metaop of ``plan``: its module shape, mode, the sequences one layer runs at, and its local batches."""
    doc = {"kind": "spindle", "request": request, "result": solve(request).model_dump(mode="json")}
    program = load_program(doc)
    shapes = {m["name"]: m for m in request["workload"]["metaops"]}
    out = []
    for op in program.metaops.values():
        spec = shapes[op.name]
        out.append({"key": f"{plan}:{op.name}", "module": spec["module"], "mode": spec.get("mode", "train"),
                    "seqs": run_seqs(op), "batches": sorted({-(-op.batch // n) for n in range(1, RANKS + 1)})})
    return out


def run_seqs(op: MetaOpRun) -> list[int]:
    """The sequence lengths one layer of the metaop runs at per iteration (``worker.runtime.spindle``)."""
    if op.role == "lm":
        return [op.prefix_length + op.text_length]
    if op.role == "encoder":
        return [op.seq_length]
    if op.role == "rollout":  # the whole prefix again for every generated token
        return [op.prompt_length + t for t in range(op.decode_tokens)]
    return [op.prompt_length + op.decode_tokens - 1]  # score, update: the generated tokens but the last


# ------------------------------------------------------------------------------- the calibration launch

def calibrate_rank(cases_path: Path, out_path: Path, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    from solvers.spindle.workload import ModuleShape
    from worker.profiler import layer_time
    from worker.runtime.model import Block, ModelConfig
    from worker.runtime.spindle import VOCAB

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    cases = json.loads(cases_path.read_text())
    layers: dict[str, list[tuple[int, float]]] = {}
    for case in cases:
        shape = ModuleShape.model_validate(case["module"])
        cfg = dataclasses.replace(ModelConfig.from_spec(shape.model_spec()), vocab_size=VOCAB)
        # the module's whole stack, each layer its own weights as in the runtime (one block timed alone stays in
        # cache and measured forward-only layers ~1.8x fast), per layer = the stack's time / its layers
        stack = torch.nn.Sequential(*(Block(cfg, i) for i in range(cfg.num_layers)))
        pts = []
        for b in case["batches"]:
            if case["mode"] == "train":
                f, bw = layer_time(cfg, b, case["seqs"][0], cpu, repeats, block=stack)
                total = f + bw
            else:
                with torch.no_grad():
                    total = _forward_only(cfg, b, case["seqs"], repeats, stack)
            pts.append((b, 1e3 * total / cfg.num_layers))
        layers[case["key"]] = pts
    links = []
    for g in (2, RANKS):
        group = dist.new_group(list(range(g)))
        for n in ALLREDUCE_FLOATS:
            buf = torch.ones(n)
            rows = []
            for i in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                if dist.get_rank() < g:
                    dist.all_reduce(buf, group=group)
                if i:
                    rows.append(time.perf_counter() - t0)
            t = torch.tensor([statistics.median(rows)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # an all-reduce ends when its slowest member does
            links.append((g, 2.0 * n, float(t)))  # the model counts bf16 bytes (2 per parameter)
    if dist.get_rank() == 0:
        out_path.write_text(json.dumps({"layers": layers, "links": links}))
    dist.destroy_process_group()


def _forward_only(cfg: Any, batch: int, seqs: list[int], repeats: int, block: Any) -> float:
    """``layer_time``'s forward with every rank at once, without autograd (frozen scorers, generation): one
    forward per sequence length in ``seqs`` (a generation's growing prefix), timed together."""
    import torch
    import torch.distributed as dist

    from worker.profiler import _gathered, slowest_rank

    xs = [torch.randn(batch, seq, cfg.hidden_size) for seq in seqs]
    rows = []
    for i in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        for x in xs:
            block(x)
        if i:
            rows.append([time.perf_counter() - t0])
    return statistics.median(r[0] for r in slowest_rank(_gathered(rows)))


def calibrate(cases: list[dict[str, Any]], repeats: int, tmp: Path) -> dict[str, Any]:
    (tmp / "cases.json").write_text(json.dumps(cases))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
           str(Path(__file__).resolve()), "--calibrate-rank", str(tmp / "cases.json"), str(tmp / "cal.json"),
           "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"calibration failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads((tmp / "cal.json").read_text())
    return out


def calibrated(plan: str, request: dict[str, Any], cal: dict[str, Any]) -> dict[str, Any]:
    """The request with each metaop's measured layer time and the measured link latency and bandwidth."""
    latency_s, bandwidth = fit_links([tuple(x) for x in cal["links"]])
    ops = [{**op, "time_ms_per_layer": fit_layer([tuple(p) for p in cal["layers"][f"{plan}:{op['name']}"]])}
           for op in request["workload"]["metaops"]]
    return {**request, "workload": {**request["workload"], "metaops": ops},
            "cluster": {**request["cluster"], "intra_node_bandwidth_GBps": bandwidth / 1e9},
            # the runtime starts a module's gradient all-reduce once the module's backward is done, and gloo's
            # exchanges take the cores the backward runs on: nothing of the sync hides behind the last slice
            "options": {**request["options"], "link_latency_us": 1e6 * latency_s, "hybrid_layouts": False,
                        "grad_sync_overlap": 0.0}}


# ------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7, help="calibration repeats per point")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--calibrate-rank", nargs=2, type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.calibrate_rank:
        calibrate_rank(*a.calibrate_rank, a.repeats)
        return

    from worker.launch import run_locally

    print(f"start: {load()} on {os.cpu_count()} cores", flush=True)
    requests = {name: make() for name, make in PLANS.items()}
    cases = [c for name, r in requests.items() for c in metaop_cases(name, r)]
    with tempfile.TemporaryDirectory(prefix="spindle-loop-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        cal = calibrate(cases, a.repeats, tmp)
        latency_s, bandwidth = fit_links([tuple(x) for x in cal["links"]])
        print(f"calibration ({time.perf_counter() - t0:.0f} s, {load()}): link latency {1e6 * latency_s:.0f} us, "
              f"bandwidth {bandwidth / 1e9:.2f} GB/s (model bytes)", flush=True)
        for name, pts in cal["layers"].items():
            fit = fit_layer([tuple(p) for p in pts])
            print(f"  {name}: {fit['intercept_ms']:.3f} ms + {fit['slope_ms_per_sample']:.3f} ms/sample per layer "
                  f"(points {', '.join(f'{b}: {ms:.2f}' for b, ms in pts)})", flush=True)
        rows = []
        for name, request in requests.items():
            req = calibrated(name, request, cal)
            result = solve(req).model_dump(mode="json")
            doc = {"kind": "spindle", "request": req, "result": result}
            got = run_locally(doc, RANKS, a.steps, tmp / name, timeout_s=900)
            times = got["step_times_s"][a.warmup:]
            measured = statistics.median(times)
            predicted = result["estimate"]["iteration_time_s"]
            rows.append({"plan": name, "predicted_s": predicted, "measured_s": measured,
                         "error": predicted / measured - 1, "slices": len(result["slices"]),
                         "layout": got.get("layout"), "step_times_s": times})
            print(f"  {name}: predicted {predicted:.4f} s, measured {measured:.4f} s "
                  f"({predicted / measured - 1:+.1%}; {len(result['slices'])} slices; {load()})", flush=True)
    mape = statistics.fmean(abs(r["error"]) for r in rows)
    print("\n| plan | predicted s | measured s | error |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['plan']} | {r['predicted_s']:.4f} | {r['measured_s']:.4f} | {r['error']:+.1%} |")
    print(f"Spindle MAPE {mape:.1%} over {len(rows)} plans (goal <= 25 %; nothing fitted to their times); "
          f"end: {load()}")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "calibration": cal, "mape": mape}, indent=1))
    if not math.isfinite(mape):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
