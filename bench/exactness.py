"""The hybrid planner against exhaustive enumeration on random small cases, per pipeline formula.

    .venv/bin/python bench/exactness.py --formula galvatron                  # seeds 1000-3999 (~4 min)
    .venv/bin/python bench/exactness.py --formula galvatron --off swap_pairs # the same without a planner step
    .venv/bin/python bench/exactness.py --formula host --seeds 0 1500        # a contended host's formula
    .venv/bin/python bench/exactness.py --hetero --seeds 0 120               # two GPU types, analytic model (~2 min)

Cases are drawn like ``tests/hybrid/test_exactness.py::small_case`` (2-4 layers on 1-6 GPUs, identical or
mixed layers, ZeRO 0/3, recompute none/full, Megatron SP, CP up to 2, 1F1B / interleaved / GPipe) with the
synthetic cost model, from Python's ``random`` seeded per case, so a seed names a case. Per case: the
planner's step time against enumeration's, and the optimality certificate, which must never lie above the
optimum. Prints every inexact seed and one summary line.

``--hetero``: mixed clusters (``cluster.groups``: two of H100, A100 40/80 GB and L4, 1-2 nodes of 1-2 GPUs each,
2-4 llama2-7b layers, a memory limit or none, a slow, fast or default link between the groups) on the analytic
model priced stage by stage, against enumeration over every embedding too; also counts plans above the best
plan whose stages are on their (time, step time) hulls, which the planner guarantees.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solvers.cost_model.base import CostModel
from solvers.hybrid.certificate import certified_bound
from solvers.hybrid.planner import Planner
from solvers.hybrid.space import SearchSpace
from tests.hybrid.brute_force import best_step_time
from tests.hybrid.synthetic import MIB, SyntheticCostModel
from tests.hybrid.test_exactness import exact_without
from tests.hybrid.test_hetero import EXACT as HETERO_EXACT
from tests.hybrid.test_hetero import _model_and_space as hetero_model_and_space
from tests.hybrid.test_hetero import _request as hetero_request

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


def hetero_case(seed: int) -> tuple[CostModel, SearchSpace]:
    r = random.Random(seed)
    gpus, per_node = ["H100-SXM", "A100-40GB", "A100-80GB", "L4"], r.choice([1, 2])
    groups = [{"gpu": r.choice(gpus), "nodes": r.randint(1, 2), "gpus_per_node": per_node} for _ in range(2)]
    request = hetero_request(groups, r.randint(2, 4), r.choice([4, 8, 12]), r.choice([None, 12.0, 16.0, 24.0]),
                             r.choice([None, 25.0, 400.0]))
    return hetero_model_and_space(request)


def run_hetero(seeds: tuple[int, int]) -> None:
    cases = inexact = off_hull = 0
    worst = 0.0
    for seed in range(*seeds):
        cm, space = hetero_case(seed)
        truth = best_step_time(cm, space, embeddings=True)
        if not math.isfinite(truth):
            continue
        planner = Planner(cm, space, options=HETERO_EXACT)
        found = planner.search().step_time_s
        if certified_bound(planner, ceiling=found) > truth * (1 + 1e-9):
            sys.exit(f"seed {seed}: the certificate lies above the optimum {truth}")
        cases += 1
        off_hull += found > best_step_time(cm, space, hull_only=True, embeddings=True) * (1 + 1e-9)
        gap = found / truth - 1
        if gap > 1e-9:
            inexact += 1
            worst = max(worst, gap)
            print(f"seed {seed}: {gap:.3%} slower than enumeration", flush=True)
    print(f"mixed clusters, seeds {seeds[0]}-{seeds[1] - 1}: {cases} cases with a plan, {inexact} inexact, worst "
          f"{worst:.2%}, {off_hull} above the best hull plan; certificate never above the optimum")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formula", choices=FORMULAS, default="galvatron")
    ap.add_argument("--seeds", type=int, nargs=2, default=(1000, 4000), metavar=("FIRST", "END"))
    ap.add_argument("--off", nargs="*", default=[], help="planner options to turn off (e.g. swap_pairs)")
    ap.add_argument("--hetero", action="store_true", help="mixed clusters on the analytic model (see above)")
    a = ap.parse_args()
    if a.hetero:
        return run_hetero(a.seeds)
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
