"""Plans for the framework you run (``constraints.target``), per target against the best uniform plan that target
runs and against paraplan's unrestricted plan (analytic cost model).

    .venv/bin/python bench/targets.py

For each request of ``CASES`` (plans of ``tests/frameworks/plans.py``'s corpus) and each framework target:
the target plan's throughput; that of the fastest fitting plan of the target's uniform grid (every tp/cp/dp/sp/
ZeRO/recompute/micro-batch/schedule/virtual-stage combination the framework expresses, split and embedded as it
does: the target plan is at least as fast, equal unless the framework's own choices in its export, a pipeline
split or a recomputation setting, beat the grid's); the unrestricted plan's (target ``paraplan``), which may lay
out layers differently, and the target plan's share of it; the search's CPU time (process time).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solvers.errors import InfeasibleError  # noqa: E402
from solvers.hybrid.api import solve  # noqa: E402
from solvers.hybrid.targets import TARGETS  # noqa: E402
from tests.frameworks.plans import CORPUS  # noqa: E402

CASES = ("gpt3-1.3b-1x4", "llama2-7b-2x8-a100", "llama2-7b-1x8-interleaved", "gpt3-13b-2x8-tight",
         "llama3-8b-1x8-h100", "mixtral-8x7b-2x8", "llama3-70b-4x8-h100", "gpt3-2.7b-3x4")


def _run(request: dict[str, Any], target: str) -> tuple[dict[str, Any] | None, float]:
    c0 = time.process_time()
    try:
        res = solve({**request, "constraints": {**request.get("constraints", {}), "target": target}})
    except InfeasibleError as err:
        return {"error": err.problems[0].msg}, time.process_time() - c0
    return res.model_dump(), time.process_time() - c0


def main() -> None:
    print("| request | target | plan (samples/s) | best uniform of the target (samples/s) | plan / best uniform "
          "| unrestricted paraplan (samples/s) | plan / unrestricted | plan | search CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for name in CASES:
        req = CORPUS[name].request()
        batch = req["training"]["global_batch_size"]
        free, free_cpu = _run(req, "paraplan")
        free_thr = free["estimate"]["throughput_samples_per_s"] if free and "estimate" in free else None
        print(f"| {name} | paraplan | {free_thr:.3f} | | | {free_thr:.3f} | 1.000 | "
              f"{_describe(free)} | {free_cpu:.2f} |" if free_thr else f"| {name} | paraplan | — |")
        for target in TARGETS[1:]:
            res, cpu = _run(req, target)
            if res is None or "estimate" not in res:
                why = (res or {}).get("error", "")
                print(f"| {name} | {target} | — | — | | {free_thr:.3f} | | none: {why} | {cpu:.2f} |")
                continue
            thr = res["estimate"]["throughput_samples_per_s"]
            grid = batch / res["search"]["target_grid_best_step_time_s"]
            print(f"| {name} | {target} | {thr:.3f} | {grid:.3f} | {thr / grid:.4f} | {free_thr:.3f} | "
                  f"{thr / free_thr:.3f} | {_describe(res)} | {cpu:.2f} |")


def _describe(res: dict[str, Any] | None) -> str:
    if not res or "strategy" not in res:
        return ""
    s = res["strategy"]
    layers = s["layers"]
    x = layers[0]
    kinds = {(y["tp"], y.get("cp", 1), y["dp"], y.get("sp"), y["zero"], y["recompute"]) for y in layers}
    lay = (f"tp{x['tp']} cp{x.get('cp', 1)} dp{x['dp']} sp={x.get('sp') or '-'} z{x['zero']} rc={x['recompute']}"
           if len(kinds) == 1 else f"{len(kinds)} layer layouts")
    ep = max(y.get("ep", 1) for y in layers)
    return (f"{lay}{f' ep{ep}' if ep > 1 else ''} pp{s['pp']} m{s['micro_batches']} {s['schedule']}"
            f"{'x' + str(s['virtual_stages']) if s['schedule'] == 'interleaved' else ''}")


if __name__ == "__main__":
    main()
