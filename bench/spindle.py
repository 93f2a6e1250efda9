"""Spindle benchmark: every workload preset at 8-64 GPUs against the lower bound and the baselines.

    .venv/bin/python bench/spindle.py                 # full table (exact model on, <= 10 s per case)
    .venv/bin/python bench/spindle.py --no-exact      # wavefront planner only
    .venv/bin/python bench/spindle.py --presets clip-imagebind --gpus 16

Columns: lower bound max(work/N, critical path); the wavefront planner's iteration time and planning time;
the exact model's (CP-SAT, warm-started from the wavefront plan); the returned plan's ratio to the lower
bound; the best baseline (sequential on the full cluster, uniform or Optimus-style task partitions) and the
speed-up over sequential. Goals: ratio <= 1.10, never worse than the best baseline, wavefront <= 1 s,
exact <= 10 s and never worse than its warm start.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from solvers.spindle.api import solve
from solvers.spindle.presets import WORKLOAD_PRESETS


def request(preset: str, gpus: int, exact: bool, limit_s: float) -> dict[str, object]:
    per_node = min(8, gpus)
    return {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": gpus // per_node, "gpus_per_node": per_node},
            "workload": {"preset": preset},
            "options": {"exact": exact, "exact_time_limit_s": limit_s}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="*", default=sorted(WORKLOAD_PRESETS))
    ap.add_argument("--gpus", nargs="*", type=int, default=[8, 16, 32, 64])
    ap.add_argument("--no-exact", action="store_true")
    ap.add_argument("--limit", type=float, default=10.0, help="exact model wall-clock limit, s")
    args = ap.parse_args()
    head = (f"{'preset':15} {'GPUs':>4} {'LB s':>8} {'wave s':>8} {'plan s':>6} {'exact s':>8} {'cp s':>5} "
            f"{'final s':>8} {'/LB':>5} {'best base':>9} {'base':>10} {'vs seq':>6} {'solver':>18} ok")
    print(head)
    print("-" * len(head))
    fails = 0
    for preset in args.presets:
        for gpus in args.gpus:
            t0 = time.perf_counter()
            r = solve(request(preset, gpus, not args.no_exact, args.limit))
            wall = time.perf_counter() - t0
            s = r["search"]
            final = r["estimate"]["iteration_time_s"]
            base = {k: v for k, v in r["baselines"].items() if v is not None}
            best_name = min(base, key=lambda k: base[k]) if base else "-"
            best = base.get(best_name, float("inf"))
            ex = s.get("exact", {})
            ex_t = ex.get("iteration_time_s")
            ok = (r["ratio_to_lower_bound"] <= 1.10 and final <= best + 1e-12 and s["wavefront_s"] <= 1.0
                  and (ex_t is None or ex.get("wall_s", 0) <= 10.5))
            fails += not ok
            print(f"{preset:15} {gpus:4d} {r['lower_bound_s']:8.4f} {s['wavefront_iteration_time_s']:8.4f} "
                  f"{s['wavefront_s']:6.3f} {ex_t if ex_t is not None else float('nan'):8.4f} "
                  f"{ex.get('wall_s', 0.0):5.2f} {final:8.4f} {r['ratio_to_lower_bound']:5.3f} {best:9.4f} "
                  f"{best_name.replace('_s', ''):>10} {r['estimate'].get('speedup_vs_sequential', 0):6.3f} "
                  f"{s['solver']:>18} {'yes' if ok else 'NO'}  ({wall:.1f} s)")
    print(f"\n{fails} case(s) miss a goal")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
