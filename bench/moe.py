"""MoE planning benchmark: mixtral-8x7b on 64 H100s (8 nodes x 8), the hybrid plan against hand-written
expert-parallel baselines, all evaluated by the same analytic cost model.

    .venv/bin/python bench/moe.py [--batch 256] [--seq 4096] [--restricted]

Rows:
- ``plan``: the hybrid planner (per-layer attention TP/SP/CP/DP, ZeRO, recompute, pipeline; MoE layers also
  choose EP, expert TP and, only with ``allow_approximate``, LSH-MoE compression);
- ``plan+lsh``: the same with ``constraints.allow_approximate`` (LSH only where the all-to-all crosses nodes);
- ``EP=8/TP=1`` and ``EP=1/TP=8``: uniform hand-written strategies (pp=1), each given the best ZeRO stage,
  recompute mode and micro-batch size of a small grid (the grid is part of the baseline, so it is not a straw
  man), evaluated by ``solvers.api.estimate``.
The planner searches its full space (every schedule, pp, micro-batch count); ``--restricted`` limits it to
1F1B and pp <= 4 (the usual MoE practice: a deep pipeline buys little once EP shards the experts).
"time" is the wall time to produce the row (plan and predicted step time) and "cpu" the process CPU time
(the fair figure on a shared machine).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solvers.api import estimate, solve  # noqa: E402
from solvers.errors import SpecError  # noqa: E402

GOAL_S = 2.0


def request(batch: int, seq: int) -> dict[str, Any]:
    return {"kind": "hybrid", "model": {"preset": "mixtral-8x7b"},
            "cluster": {"gpu": "H100", "nodes": 8, "gpus_per_node": 8},
            "training": {"global_batch_size": batch, "seq_length": seq}}


def timed(fn: Any, *args: Any) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - w, time.process_time() - c


def best_uniform(base: dict[str, Any], fixed: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The fastest fitting estimate of ``fixed`` over ZeRO x recompute x micro-batch size (pp=1)."""
    best: tuple[dict[str, Any] | None, dict[str, Any]] = (None, {})
    for zero, rc, mbs in itertools.product((0, 1, 2, 3), ("none", "selective", "full"), (1, 2, 4)):
        strat = {"pp": 1, **fixed, "zero": zero, "recompute": rc, "micro_batch_size": mbs}
        try:
            est = estimate({**base, "strategy": strat}).to_json()
        except SpecError:
            continue
        if est["fits"] and (best[0] is None or est["step_time_s"] < best[0]["step_time_s"]):
            best = (est, strat)
    return best


def layout(strategy: dict[str, Any]) -> str:
    """The most common layer strategy, then how many layers differ and in what."""
    layers = strategy["layers"]
    counts: dict[tuple[tuple[str, Any], ...], int] = {}
    for x in layers:
        key = tuple(sorted(x.items()))
        counts[key] = counts.get(key, 0) + 1
    main, *others = sorted(counts, key=lambda k: -counts[k])
    x = dict(main)
    desc = (f"pp{strategy['pp']} m{strategy['micro_batches']} tp{x['tp']} cp{x['cp']} dp{x['dp']} "
            f"ep{x.get('ep', 1)} etp{x.get('etp', x['tp'] if x.get('sp') != 'ulysses' else 1)} "
            f"sp={x['sp']} z{x['zero']} rc={x['recompute']}{' lsh' if x.get('lsh') else ''}")
    for k in others:
        diff = ", ".join(f"{f}={v}" for f, v in k if x.get(f) != v)
        desc += f"; {counts[k]} layers {diff}"
    return desc


def row(name: str, est: dict[str, Any], desc: str, wall: float, cpu: float) -> str:
    b = est["breakdown_s"]
    return (f"{name:<11} {est['step_time_s']:>7.3f} {est['mfu']:>5.3f} {est['peak_memory_gib']:>6.1f} "
            f"{b.get('ep_comm', 0.0):>7.3f} {b.get('tp_comm', 0.0):>7.3f} {b.get('compute', 0.0):>7.3f} "
            f"{wall:>6.2f} {cpu:>5.2f}  {desc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--restricted", action="store_true")
    args = ap.parse_args()
    base = request(args.batch, args.seq)
    constraints: dict[str, Any] = {"schedule": "1f1b", "max_pp": 4} if args.restricted else {}
    import solvers.hybrid.api  # noqa: F401  (import outside the timed region, as a running service has it)

    print(f"mixtral-8x7b, 64 x H100 (8 nodes x 8), global batch {args.batch} x {args.seq} tokens, analytic model; "
          f"planner space: {'1f1b, pp <= 4' if args.restricted else 'full'}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'row':<11} {'step s':>7} {'mfu':>5} {'GiB':>6} {'ep_comm':>7} {'tp_comm':>7} {'compute':>7} "
          f"{'time s':>6} {'cpu s':>5}  strategy")
    results: dict[str, dict[str, Any]] = {}
    for name, approx in (("plan", False), ("plan+lsh", True)):
        req = {**base, "constraints": {**constraints, "allow_approximate": approx}}
        res, wall, cpu = timed(solve, req)
        results[name] = res["estimate"]
        print(row(name, res["estimate"], layout(res["strategy"]), wall, cpu))
        for note in res["estimate"].get("notes", []):
            print(f"{'':<11} note: {note}")
    for name, fixed in (("EP=8/TP=1", {"tp": 1, "ep": 8}), ("EP=1/TP=8", {"tp": 8, "ep": 1, "sp": "megatron"})):
        (est, strat), wall, cpu = timed(best_uniform, base, fixed)
        if est is None:
            print(f"{name:<11} no setting of the grid fits in memory")
            continue
        results[name] = est
        desc = " ".join(f"{k}={v}" for k, v in strat.items())
        print(row(name, est, desc, wall, cpu) + f"  (best of a {4 * 3 * 3}-setting grid)")
    if "plan" in results:
        p = results["plan"]["step_time_s"]
        for name in ("EP=8/TP=1", "EP=1/TP=8", "plan+lsh"):
            if name in results:
                print(f"plan vs {name}: {results[name]['step_time_s'] / p:.2f}x step time of the plan")


if __name__ == "__main__":
    main()
