"""Spindle benchmark: every workload preset at 8-64 GPUs against the lower bound and the baselines.

    .venv/bin/python bench/spindle.py                 # full table (exact model on, <= 10 s per case)
    .venv/bin/python bench/spindle.py --no-exact      # wavefront planner only
    .venv/bin/python bench/spindle.py --presets clip-imagebind --gpus 16
    .venv/bin/python bench/spindle.py --explicit      # time model only: compares 1:1 with the reference planner

Columns: lower bound max(work/N, critical path); the wavefront planner's iteration time and planning time;
the exact model's (CP-SAT, warm-started from the wavefront plan, one worker: what stopped it and its gap to
its own bound; a deterministic budget stop is reproducible); the returned plan's ratio to the lower
bound; the best baseline (sequential on the full cluster, uniform or Optimus-style task partitions) and the
speed-up over sequential. Goals: ratio <= 1.10, never worse than the best baseline, wavefront <= 1 s,
exact <= 10 s and never worse than its warm start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solvers.errors import InfeasibleError
from solvers.spindle.api import build_problem, parse_request, solve
from solvers.spindle.gantt import gantt_svg
from solvers.spindle.presets import WORKLOAD_PRESETS


def request(preset: str, gpus: int, exact: bool, limit_s: float, explicit: bool = False) -> dict[str, Any]:
    per_node = min(8, gpus)
    req: dict[str, Any] = {
        "kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": gpus // per_node, "gpus_per_node": per_node},
        "workload": {"preset": preset}, "options": {"exact": exact, "exact_time_limit_s": limit_s}}
    if explicit:
        # the preset's per-layer times as explicit slope/intercept: the time model is then the whole cost
        # (no memory, transfers or gradient sync), the reference planner's setting, comparable 1:1
        problem = build_problem(parse_request(req))
        wl = problem.workload
        req["workload"] = {
            "metaops": [{"name": op.name, "task": op.task, "batch_size": op.batch, "num_layers": op.layers,
                         "time_ms_per_layer": {"slope_ms_per_sample": op.slope_ms, "intercept_ms": op.intercept_ms}}
                        for op in wl.ops],
            "edges": [[wl.ops[u].name, wl.ops[v].name] for v, ps in enumerate(wl.preds) for u in ps]}
    return req


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="*", default=sorted(WORKLOAD_PRESETS))
    ap.add_argument("--gpus", nargs="*", type=int, default=[8, 16, 32, 64])
    ap.add_argument("--no-exact", action="store_true")
    ap.add_argument("--limit", type=float, default=10.0,
                    help="exact_time_limit_s: the wall-clock safety net and, through it, the deterministic budget")
    ap.add_argument("--gantt", type=Path, help="write the Gantt SVG of every case into this folder")
    ap.add_argument("--explicit", action="store_true",
                    help="presets as explicit per-layer times only (no memory / communication terms)")
    args = ap.parse_args()
    head = (f"{'preset':18} {'GPUs':>4} {'LB s':>8} {'ref/LB':>6} {'heur s':>8} {'/LB':>5} {'plan s':>6} "
            f"{'exact s':>8} {'cp s':>5} {'stop':>5} {'gap':>6} {'final s':>8} {'/LB':>5} {'best base s':>11} "
            f"{'vs base':>7} {'vs seq':>6}  solver")
    print(head)
    print("-" * (len(head) + 24))
    misses = []
    ratios: list[float] = []
    ref_ratios: list[float] = []
    for preset in args.presets:
        for gpus in args.gpus:
            try:
                r = solve(request(preset, gpus, not args.no_exact, args.limit, args.explicit)).to_json()
            except InfeasibleError as err:  # (the 70B preset on 8-16 A100s: its states alone do not fit)
                print(f"{preset:18} {gpus:4d}  no plan fits: {err.problems[0].msg}")
                continue
            ratios.append(r["ratio_to_lower_bound"])
            if s_ref := r["search"].get("reference_iteration_time_s"):
                ref_ratios.append(s_ref / r["lower_bound_s"])
            s = r["search"]
            lb = r["lower_bound_s"]
            final = r["estimate"]["iteration_time_s"]
            base = {k: v for k, v in r["baselines"].items() if v is not None}
            best = min(base.values()) if base else float("inf")
            ex = s.get("exact", {})
            ex_t = ex.get("iteration_time_s", float("nan"))
            ref = s.get("reference_iteration_time_s")  # None: the reference's plan is over memory
            goals = {"ratio <= 1.10": r["ratio_to_lower_bound"] <= 1.10,
                     "<= best baseline": final <= best + 1e-12,
                     "heuristic <= 1 s": s["wavefront_s"] <= 1.0,
                     "exact <= 10 s": ex.get("wall_s", 0.0) <= 10.0,
                     "exact >= its warm start": ex_t <= ex.get("warm_start_iteration_time_s", ex_t) + 1e-12
                     if ex else True}
            missed = [g for g, ok in goals.items() if not ok]
            if missed:
                misses.append(f"{preset} @ {gpus}: {', '.join(missed)}")
            ref_txt = f"{ref / lb:6.3f}" if ref is not None else " nofit"
            stop = {"solved": "opt", "deterministic_limit": "det", "wall_clock": "WALL"}.get(ex.get("stopped_by"), "-")
            gap = f"{100 * ex['model_gap']:5.2f}%" if ex.get("model_gap") is not None else "     -"
            print(f"{preset:18} {gpus:4d} {lb:8.4f} {ref_txt} {s['wavefront_iteration_time_s']:8.4f} "
                  f"{s['wavefront_iteration_time_s'] / lb:5.3f} {s['wavefront_s']:6.3f} {ex_t:8.4f} "
                  f"{ex.get('wall_s', 0.0):5.2f} {stop:>5} {gap} {final:8.4f} {r['ratio_to_lower_bound']:5.3f} "
                  f"{best:11.4f} "
                  f"{best / final:7.3f} {r['estimate'].get('speedup_vs_sequential', 0):6.3f}  {s['solver']}"
                  f"{'' if not missed else '  MISS'}")
            if args.gantt:
                args.gantt.mkdir(parents=True, exist_ok=True)
                (args.gantt / f"{preset}-{gpus}.svg").write_text(gantt_svg(r))
    print("\nstop: what ended CP-SAT (opt: proved optimal, det: its deterministic budget, reproducible; WALL: the "
          "wall-clock safety net, not reproducible); gap: (model makespan - CP-SAT bound) / model makespan")
    print("ref/LB: the reference algorithm alone (fluid wavefront, locality line-up; nofit: over memory); heur: the "
          "planner portfolio + polish; exact: CP-SAT warm-started, never worse than its warm start; final: returned "
          "plan; vs base: best baseline / final")
    if ratios:
        print(f"plan / lower bound over {len(ratios)} cases: mean {sum(ratios) / len(ratios):.3f}, worst "
              f"{max(ratios):.3f}; reference / lower bound over the {len(ref_ratios)} whose reference plan fits: mean "
              f"{sum(ref_ratios) / max(1, len(ref_ratios)):.3f}, worst {max(ref_ratios, default=float('nan')):.3f}")
    print(f"{len(misses)} case(s) miss a goal" + "".join(f"\n  {m}" for m in misses))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
