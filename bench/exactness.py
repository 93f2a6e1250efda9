"""The hybrid planner against exhaustive enumeration on random small cases, per pipeline formula.

    .venv/bin/python bench/exactness.py --formula galvatron                  # seeds 1000-3999 (~4 min)
    .venv/bin/python bench/exactness.py --formula galvatron --off swap_pairs # the same without a planner step
    .venv/bin/python bench/exactness.py --formula host --seeds 0 1500        # a contended host's formula

Cases are drawn like ``tests/hybrid/test_exactness.py::small_case`` (2-4 layers on 1-6 GPUs, identical or
mixed layers, ZeRO 0/3, recompute none/full, Megatron SP, CP up to 2, 1F1B / interleaved / GPipe) with the
synthetic cost model, from Python's ``random`` seeded per case, so a seed names a case. Per case: the
planner's step time against enumeration's, and the optimality certificate, which must never lie above the
optimum. Prints every inexact seed and one summary line.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solvers.hybrid.certificate import certified_bound
from solvers.hybrid.planner import Planner
from solvers.hybrid.space import SearchSpace
from tests.hybrid.brute_force import best_step_time
from tests.hybrid.synthetic import MIB, SyntheticCostModel
from tests.hybrid.test_exactness import exact_without

FORMULAS = ("linear", "galvatron", "generic", "host")


def case(seed: int, formula: str) -> tuple[SyntheticCostModel, SearchSpace]:
    r = random.Random(seed)
    gpus = r.choice([1, 2, 3, 4, 6])
    layers = r.randint(2, 4 if gpus <= 4 else 3)
    batch = r.choice([4, 6, 8, 12])
    scale = [] if r.random() < 0.5 else [r.choice([0.5, 1.0, 1.5, 2.0]) for _ in range(layers)]
    limit = r.randint(60, 1500)
    schedules = r.choice([("1f1b",), ("1f1b", "interleaved"), ("gpipe",)])
    cm = SyntheticCostModel(
        num_layers=layers, num_gpus=gpus, memory_limit_bytes=limit * MIB, global_batch=batch, layer_scale=scale,
        gpus_per_node=r.choice([2, 4, 8]), dp_sync_s=r.choice([0.02, 0.2]),
        act_mib_per_sample=r.choice([4.0, 16.0, 64.0]), param_mib=r.choice([5.0, 20.0, 60.0]),
        linear_pipeline=formula == "linear", galvatron_formula=formula == "galvatron",
        host_slowdown=r.choice([1.5, 2.0, 4.0]) if formula == "host" else 1.0)
    space = SearchSpace(
        num_gpus=gpus, gpus_per_node=cm.gpus_per_node, num_layers=layers, global_batch_size=batch, seq_length=1024,
        heads=12, kv_heads=12, max_tp=4, max_pp=4, max_cp=r.choice([1, 2]), sp_kinds=(None, "megatron"),
        zero_levels=(0, 3), recomputes=("none", "full"), schedules=schedules)
    return cm, space


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formula", choices=FORMULAS, default="galvatron")
    ap.add_argument("--seeds", type=int, nargs=2, default=(1000, 4000), metavar=("FIRST", "END"))
    ap.add_argument("--off", nargs="*", default=[], help="planner options to turn off (e.g. swap_pairs)")
    a = ap.parse_args()
    options = exact_without(*a.off)
    cases = inexact = 0
    worst = 0.0
    for seed in range(*a.seeds):
        cm, space = case(seed, a.formula)
        truth = best_step_time(cm, space)
        if not math.isfinite(truth):
            continue
        planner = Planner(cm, space, kinds=None if cm.layer_scale else [0] * cm.num_layers, options=options)
        found = planner.search().step_time_s
        bound = certified_bound(planner, ceiling=found)
        if bound > truth * (1 + 1e-12):
            sys.exit(f"seed {seed}: the certificate {bound} lies above the optimum {truth}")
        cases += 1
        gap = found / truth - 1
        if gap > 1e-9:
            inexact += 1
            worst = max(worst, gap)
            print(f"seed {seed}: {gap:.3%} slower than enumeration", flush=True)
    off = f", without {' '.join(a.off)}" if a.off else ""
    print(f"{a.formula} formula{off}, seeds {a.seeds[0]}-{a.seeds[1] - 1}: {cases} cases with a plan, "
          f"{inexact} inexact, worst {worst:.2%}; certificate never above the optimum")


if __name__ == "__main__":
    main()
