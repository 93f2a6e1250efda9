"""Parity of paraplan's Galvatron-compatible cost model with Galvatron 2.4.0 itself.

    .venv/bin/python bench/galvatron_parity.py            # compare against the cached Galvatron outputs
    .venv/bin/python bench/galvatron_parity.py --refresh  # re-run Galvatron first (needs .venv-galvatron)

``--refresh`` runs the peer runner (``../shared/peers/galvatron_pypi/run_galvatron_pypi.py``) for 1x8 and
2x8 GPUs at 36 and 16 GB (8 micro-batches, the micro-batch sweep, coarse), keeps the profiles and hardware
files it converted, and asks Galvatron's own cost-model classes for the time and memory of every uniform
strategy of its search space ("probe"); all of it goes to ``bench/data/galvatron/`` (small JSON) so that
tests and this script run without Galvatron.

Tables printed: (1) each plan Galvatron returned, evaluated by paraplan from its galvatron_config file,
against the seconds per iteration and the per-stage memory Galvatron reported; (2) the uniform-strategy
probe: worst relative time difference and memory mismatches; (3) the shipped
``galvatron_config_llama2-7b_1nodes_8gpus_per_node_36GB_bf16.json`` evaluated on the reference files.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "data", "galvatron")
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
RUNNER = os.path.join(SHARED, "peers", "galvatron_pypi", "run_galvatron_pypi.py")
GALV_PY = os.path.join(ROOT, ".venv-galvatron", "bin", "python")
REFERENCE = os.path.join(SHARED, "reference", "galvatron")
SHIPPED = "galvatron_config_llama2-7b_1nodes_8gpus_per_node_36GB_bf16.json"

GLOBAL_BATCH = 64
CASES: dict[str, list[str]] = {
    "1x8_36GB_mb8": ["--nodes", "1", "--memory-gb", "36", "--chunks", "8"],
    "1x8_16GB_mb8": ["--nodes", "1", "--memory-gb", "16", "--chunks", "8"],
    "2x8_36GB_mb8": ["--nodes", "2", "--memory-gb", "36", "--chunks", "8"],
    "2x8_16GB_mb8": ["--nodes", "2", "--memory-gb", "16", "--chunks", "8"],
    "1x8_36GB_sweep": ["--nodes", "1", "--memory-gb", "36", "--chunks", "0"],
    "1x8_16GB_sweep": ["--nodes", "1", "--memory-gb", "16", "--chunks", "0"],
    "2x8_36GB_sweep": ["--nodes", "2", "--memory-gb", "36", "--chunks", "0"],
    "2x8_16GB_sweep": ["--nodes", "2", "--memory-gb", "16", "--chunks", "0"],
    "1x8_36GB_coarse": ["--nodes", "1", "--memory-gb", "36", "--chunks", "8", "--coarse"],
    "2x8_36GB_coarse": ["--nodes", "2", "--memory-gb", "36", "--chunks", "8", "--coarse"],
    # other formula branches: batch-fitted layer times, Ulysses (all-to-all) + sequence-split vocabulary,
    # no Megatron SP, GPipe memory, plain DDP
    "1x8_36GB_batch": ["--nodes", "1", "--memory-gb", "36", "--chunks", "8", "--time-mode", "batch"],
    "1x8_36GB_ulysses": ["--nodes", "1", "--memory-gb", "36", "--chunks", "8", "--sp-space", "tp+sp"],
    "1x8_36GB_nosp": ["--nodes", "1", "--memory-gb", "36", "--chunks", "8", "--no-sp"],
    "2x8_36GB_gpipe": ["--nodes", "2", "--memory-gb", "36", "--chunks", "8", "--pipeline-type", "gpipe"],
    "2x8_36GB_ddp": ["--nodes", "2", "--memory-gb", "36", "--chunks", "8", "--default-dp-type", "ddp"],
}
SP_SPACES = ("tp", "tp+sp")


# ------------------------------------------------------------------------------------------ refresh
def _copy_json_files(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith(".json"):
            shutil.copyfile(os.path.join(src, f), os.path.join(dst, f))


def _run_case(name: str, flags: list[str], work: str, reuse: bool) -> dict[str, Any]:
    out = os.path.join(work, name + ".json")
    if not (reuse and os.path.exists(out)):
        cmd = [GALV_PY, RUNNER, "--gpus-per-node", "8", "--global-batch", str(GLOBAL_BATCH), *flags,
               "--workdir", os.path.join(work, name), "--out", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    with open(out) as f:
        r = json.load(f)
    with open(r["engine_log"]) as f:
        log = f.read()
    window = re.findall(r"Min_tp=(\d+) Max_tp=(\d+)", log)
    keep = {k: r[k] for k in ("engine", "inputs", "notes", "feasible", "est_iter_s", "throughput", "search_s",
                              "mem_cost_mb_per_stage", "mem_budget_mb") if k in r}
    keep["min_tp"], keep["max_tp"] = (int(window[-1][0]), int(window[-1][1])) if window else (None, None)
    inp = r["inputs"]
    # how paraplan's model must be configured to see what Galvatron saw
    profiles = "profiles" if inp["time_mode"] == "static" else f"profiles-{inp['time_mode']}"
    keep["paraplan_cost_model"] = {"profiles": profiles, "time_profile_mode": inp["time_mode"],
                                   "sp_space": inp["sp_space"], "sequence_parallel": inp["sequence_parallel"]}
    if r.get("plan"):
        plan = r["plan"]
        keep["plan"] = {k: plan[k] for k in ("pp_deg", "summary", "chunks", "global_bsz", "vocab_tp",
                                             "embed_sdp", "galvatron_config")}
    _copy_json_files(r["profiles_dir"], os.path.join(DATA, profiles))
    _copy_json_files(r["hardware_dir"], os.path.join(DATA, "hardware"))
    return keep


def refresh(work: str, reuse: bool) -> None:
    if not os.path.exists(GALV_PY):
        sys.exit(f"{GALV_PY} missing: bash {SHARED}/peers/galvatron_pypi/setup.sh .venv-galvatron")
    os.makedirs(os.path.join(DATA, "cases"), exist_ok=True)
    for name, flags in CASES.items():
        t0 = time.time()
        keep = _run_case(name, flags, work, reuse)
        with open(os.path.join(DATA, "cases", name + ".json"), "w") as f:
            json.dump(keep, f, indent=1)
        print(f"ran {name}: {keep.get('est_iter_s')} s/iter ({time.time() - t0:.0f} s)", flush=True)
    # other budgets change only Galvatron's cache reserve, which the cases pin
    for nodes, sp_space in ((1, "tp"), (2, "tp"), (1, "tp+sp")):
        out = os.path.join(DATA, "probe", probe_name(nodes, sp_space))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.run([GALV_PY, os.path.abspath(__file__), "--probe", str(nodes), "36", sp_space, out], check=True,
                       timeout=1800)
        print(f"probed {nodes}x8 36 GB, sp_space {sp_space}", flush=True)


def probe_name(nodes: int, sp_space: str) -> str:
    return f"{nodes}x8_36GB_{sp_space.replace('+', '_')}.json"


# ------------------------------------------------------------------------------------------ probe (Galvatron's venv)
def probe(nodes: int, memory_gb: int, sp_space: str, out: str) -> None:
    """Galvatron's own time and memory of every uniform strategy of its space (runs in .venv-galvatron)."""
    import contextlib
    import io
    import math
    import types

    import galvatron

    core = types.ModuleType("galvatron.core")
    core.__path__ = [os.path.join(os.path.dirname(galvatron.__file__), "core")]
    sys.modules["galvatron.core"] = core
    from galvatron.core.search_engine.arguments import galvatron_search_args
    from galvatron.core.search_engine.cost_model import (
        MemoryCostModel,
        OtherTimeCostModel,
        TimeCostModel,
        pipeline_costmodel,
    )
    from galvatron.core.search_engine.search_engine import (
        GalvatronSearchEngine,
        pp_division_even,
    )

    hw = os.path.join(DATA, "hardware")
    prof = os.path.join(DATA, "profiles")
    n = nodes * 8
    argv = ["--num_nodes", str(nodes), "--num_gpus_per_node", "8", "--memory_constraint", str(memory_gb),
            "--settle_bsz", str(GLOBAL_BATCH), "--sp_space", sp_space, "--mixed_precision", "bf16",
            "--pipeline_type", "pipedream_flush", "--default_dp_type", "zero2", "--disable_tp_consec", "1",
            "--memory_profiling_path", prof, "--time_profiling_path", prof, "--allreduce_bandwidth_config_path", hw,
            "--p2p_bandwidth_config_path", hw, "--overlap_coe_path", hw, "--sp_time_path", hw,
            "--sequence_parallel"]
    args = galvatron_search_args(argparse.ArgumentParser()).parse_args(argv)
    args.hidden_size, args.num_hidden_layers, args.seq_length = 4096, 32, 2048
    with contextlib.redirect_stdout(io.StringIO()):
        eng = GalvatronSearchEngine(args)
        eng.set_search_engine_info(prof, [{"hidden_size": 4096, "seq_len": 2048, "layer_num": 32}],
                                   "hidden4096_head32_seqlen2048")
        eng.initialize_search_engine()
    ma, ta, pa, pma, pha = (eng.model_args_list, eng.train_args_list, eng.parallel_args_list,
                            eng.profile_model_args_list, eng.profile_hardware_args_list)
    budget = memory_gb * 1024
    cache = int(budget * 0.2) if budget // 1024 > 20 else 0
    rows = []
    for chunk in (1, 2, 4, 8):
        for s in eng.strategies:
            pp, tp, dp, info = s
            for min_tp in (1, 2, 4, 8):  # Galvatron's strict micro-batch rule picks the window
                groups = n // pp // min_tp if pp * min_tp <= n else 0
                if groups and GLOBAL_BATCH % groups == 0 and chunk <= GLOBAL_BATCH // groups and tp >= min_tp:
                    mbsz = (GLOBAL_BATCH // groups + chunk - 1) // chunk
                    if chunk == (GLOBAL_BATCH // groups + mbsz - 1) // mbsz:
                        break
            else:
                continue
            max_tp = 8
            for vtp in sorted({min_tp, max_tp}):
                if vtp * pp > n:
                    continue
                for embed_sdp, vsp in ((0, 0), (1, 0), (0, 1), (1, 1)):
                    division = pp_division_even([32], pp)
                    other_t = OtherTimeCostModel(mbsz, pp, n, vsp, embed_sdp, min_tp, max_tp, [2048], model_args=ma[0],
                                                 train_args=ta[0], parallel_args=pa[0], profile_model_args=pma[0],
                                                 profile_hardware_args=pha[0]).gen_result()[1][vtp]
                    chunks = [pa[0].optimal_chunk_func(GLOBAL_BATCH * min_tp // (n // pp), [pp, min_tp, n // pp], mbsz,
                                                       min_tp)]
                    t = pipeline_costmodel(TimeCostModel, [32], ma, ta, pa, pma, pha, [s] * 32, division, chunks,
                                           GLOBAL_BATCH, min_tp, other_t)
                    first = [pp, min_tp, n // pp // min_tp, {"fsdp": 0} if n // pp // min_tp > 1 else {}]
                    other_m = MemoryCostModel(first, GLOBAL_BATCH, mbsz=mbsz, min_tp=min_tp, max_tp=max_tp, stage_idx=0,
                                              vsp=vsp, embed_sdp=embed_sdp, model_args=ma[0], train_args=ta[0],
                                              parallel_args=pa[0], profile_model_args=pma[0]).get_memory_cost()
                    if vtp not in other_m["other"]:
                        continue
                    # with a sequence-split vocabulary and no Megatron-TP layer, Galvatron's "SP only" search
                    # (sp_search 2) finds the plan first, and it reserves no Megatron-SP buffer
                    ulysses = int(info.get("sp", 0))
                    sp_only = vsp and (tp == 1 or ulysses)
                    buffer = 0 if sp_only else int(mbsz / min_tp * max_tp * 4096 * 2048 * 4 / 1024 / 1024 / 2)
                    mem = []
                    for stage in range(pp):
                        enc = MemoryCostModel(s, GLOBAL_BATCH, mbsz=mbsz, min_tp=min_tp, max_tp=max_tp,
                                              stage_idx=stage, vsp=vsp, embed_sdp=embed_sdp, model_args=ma[0],
                                              train_args=ta[0], parallel_args=pa[0],
                                              profile_model_args=pma[0]).get_memory_cost()["enc_total"]
                        mem.append(int(division[stage] * math.ceil(enc) + math.ceil(other_m["other"][vtp][stage])
                                       + buffer + cache))
                    rows.append({"pp": int(pp), "tp": int(tp), "dp": int(dp), "fsdp": int(info.get("fsdp", 0)),
                                 "ckpt": int(info.get("cpt", 0)), "chunks": chunk, "vtp": vtp,
                                 "embed_sdp": embed_sdp, "vsp": vsp, "ulysses": ulysses, "min_tp": min_tp,
                                 "max_tp": max_tp,
                                 "time_s": float(t), "mem_mb_per_stage": mem})
    columns = list(rows[0])
    with open(out, "w") as f:
        json.dump({"nodes": nodes, "gpus_per_node": 8, "memory_gb": memory_gb, "global_batch": GLOBAL_BATCH,
                   "sp_space": sp_space,
                   "columns": columns, "rows": [[r[c] for c in columns] for r in rows]}, f, separators=(",", ":"))


# ------------------------------------------------------------------------------------------ compare
def _model(nodes: int, memory_gb: float, profiles: str, hardware: str, batch: int = GLOBAL_BATCH,
           **options: Any) -> Any:
    from solvers.cost_model.galvatron import GalvatronCostModel
    from solvers.request import HybridRequest, parse

    req = parse(HybridRequest, {
        "kind": "hybrid", "model": {"preset": "llama2-7b"},
        "cluster": {"gpu": "A100-80GB", "nodes": nodes, "gpus_per_node": 8},
        "training": {"global_batch_size": batch, "seq_length": 2048},
        "constraints": {"memory_limit_gib": memory_gb},
        "cost_model": {"kind": "galvatron", "profiles_dir": profiles, "hardware_dir": hardware, **options}})
    return GalvatronCostModel.from_request(req)


def compare_cases() -> float:
    from solvers.formats.galvatron import plan_from_galvatron_config

    worst = 0.0
    print("Galvatron's returned plans, evaluated by paraplan (cost_model.kind = galvatron)")
    head = f"{'case':17} {'plan':44} {'galv s/it':>9} {'ours s/it':>9} {'rel diff':>9} {'galv smp/s':>10} " \
           f"{'ours smp/s':>10} {'galv MB/stage':>14} {'ours MB/stage':>14} fits"
    print(head)
    print("-" * len(head))
    for name in CASES:
        path = os.path.join(DATA, "cases", name + ".json")
        if not os.path.exists(path):
            print(f"{name:17} (not cached; run with --refresh)")
            continue
        with open(path) as f:
            case = json.load(f)
        inp = case["inputs"]
        opts = dict(case["paraplan_cost_model"])
        profiles = os.path.join(DATA, opts.pop("profiles"))
        model = _model(inp["nodes"], inp["memory_gb"], profiles, os.path.join(DATA, "hardware"), **opts)
        cfg = case["plan"]["galvatron_config"]
        plan = plan_from_galvatron_config(cfg, inp["gpus"], sequence_parallel=inp["sequence_parallel"])
        est = model.evaluate(plan)
        rel = est.step_time_s / case["est_iter_s"] - 1
        worst = max(worst, abs(rel))
        ours_mb = [round(g * 1024) for g in est.memory_gib_per_stage]
        galv_mb = [round(m) for m in case["mem_cost_mb_per_stage"]]
        print(f"{name:17} {case['plan']['summary'][:44]:44} {case['est_iter_s']:9.4f} {est.step_time_s:9.4f} "
              f"{rel:9.1e} {case['throughput']:10.3f} {est.throughput_samples_per_s:10.3f} "
              f"{','.join(map(str, galv_mb)):>14} {','.join(map(str, ours_mb)):>14} {est.fits}")
    return worst


def probe_rows(probe_data: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(probe_data["columns"], row, strict=True)) for row in probe_data["rows"]]


def compare_probe() -> None:
    from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, SpKind

    print("\nUniform strategies of Galvatron's space: Galvatron's own classes vs paraplan")
    print(f"{'cluster':22} {'plans':>6} {'max |rel time diff|':>20} {'memory MB mismatches':>21} "
          f"{'fit verdict mismatches':>23}")
    for fname in sorted(os.listdir(os.path.join(DATA, "probe"))) if os.path.isdir(os.path.join(DATA, "probe")) else []:
        with open(os.path.join(DATA, "probe", fname)) as f:
            probe_data = json.load(f)
        n = probe_data["nodes"] * 8
        budget = probe_data["memory_gb"] * 1024
        base = _model(probe_data["nodes"], probe_data["memory_gb"], os.path.join(DATA, "profiles"),
                      os.path.join(DATA, "hardware"), max_tp=8, sp_space=probe_data["sp_space"])
        worst, mem_bad, fit_bad = 0.0, 0, 0
        for r in probe_rows(probe_data):
            sp: SpKind = "ulysses" if r["ulysses"] else ("megatron" if r["tp"] > 1 else None)
            layer = LayerStrategy(tp=r["tp"], dp=r["dp"], sp=sp,
                                  zero=(3 if r["fsdp"] else 2) if r["dp"] > 1 else 0,
                                  recompute="full" if r["ckpt"] else "none")
            per = 32 // r["pp"]
            plan = PlanStrategy(pp=r["pp"], micro_batches=r["chunks"], layers=(layer,) * 32,
                                stage_layers=(per,) * (r["pp"] - 1) + (32 - per * (r["pp"] - 1),), schedule="1f1b",
                                embedding=EmbeddingStrategy(tp=r["vtp"], dp=n // r["pp"] // r["vtp"],
                                                            zero=3 if r["embed_sdp"] else 2,
                                                            sp="ulysses" if r["vsp"] else None))
            est = base.evaluate(plan)
            worst = max(worst, abs(est.step_time_s / r["time_s"] - 1))
            ours = [round(g * 1024) for g in est.memory_gib_per_stage]
            mem_bad += ours != r["mem_mb_per_stage"]
            fit_bad += est.fits != (max(r["mem_mb_per_stage"]) <= budget)
        print(f"{fname[:-5]:22} {len(probe_data['rows']):6d} {worst:20.1e} {mem_bad:21d} {fit_bad:23d}")


def shipped_config() -> None:
    from solvers.formats.galvatron import plan_from_galvatron_config, read_galvatron_config

    profiles = os.path.join(REFERENCE, "profiles")
    cfg = read_galvatron_config(SHIPPED, [profiles])
    print(f"\nShipped {SHIPPED} on ../shared/reference/galvatron (1x8, 36 GB, its global batch {cfg['global_bsz']})")
    model = _model(1, 36, profiles, os.path.join(REFERENCE, "hardware"), batch=cfg["global_bsz"])
    est = model.evaluate(plan_from_galvatron_config(cfg, 8))
    print(f"  step {est.step_time_s:.4f} s, {est.throughput_samples_per_s:.3f} samples/s, "
          f"memory {est.peak_memory_gib * 1024:.0f} MB, fits {est.fits}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--refresh", action="store_true", help="re-run Galvatron and refresh bench/data/galvatron")
    p.add_argument("--workdir", default="/tmp/galvatron_parity", help="runner work directories (with --refresh)")
    p.add_argument("--reuse", action="store_true", help="with --refresh: keep runner outputs already in --workdir")
    p.add_argument("--probe", nargs=4, metavar=("NODES", "MEMORY_GB", "SP_SPACE", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.probe:
        probe(int(a.probe[0]), int(a.probe[1]), a.probe[2], a.probe[3])
        return
    sys.path.insert(0, ROOT)
    if a.refresh:
        refresh(a.workdir, a.reuse)
    t0 = time.time()
    worst = compare_cases()
    compare_probe()
    shipped_config()
    print(f"\nworst |relative time difference| on Galvatron's plans: {worst:.1e} (goal < 1e-2); "
          f"compared in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
