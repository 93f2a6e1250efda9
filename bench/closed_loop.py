"""Closed loop on this machine: profile the CPU "cluster", predict the step time of several plans with the
cost model calibrated by that profile, run the plans with the worker runtime, compare.

    .venv/bin/python bench/closed_loop.py --interleave 4    # 21 plans on 4 gloo ranks, profiled in their launch
    .venv/bin/python bench/closed_loop.py --interleave 2 --launches 2   # the same rounds over two launches
    .venv/bin/python bench/closed_loop.py                 # profile first, then one daemon-style launch per plan
    .venv/bin/python bench/closed_loop.py --profile P.json  # reuse a profile written by worker.profiler
    .venv/bin/python bench/closed_loop.py --ranks 2         # 7 plans on 2 ranks (one core per rank here)
    .venv/bin/python bench/closed_loop.py --kind flexsp     # FlexSP plans (bench/flexsp_runtime.py, its options)
    .venv/bin/python bench/closed_loop.py --kind spindle    # Spindle plans (bench/spindle_runtime.py, its options)

Plans on 4 ranks (``PLANS_4``): 10 uniform dense ones (dp4 with ZeRO-0/1/3 and recompute, tp4, tp2 x Megatron-SP
x dp2 ZeRO-2, pp4 1F1B / GPipe, pp2 x tp2, pp2 x dp2), ring-attention cp (cp2 x dp2, cp4 ZeRO-3), three per-layer
mixes in the contract's full strategy form (TP / SP kind / ZeRO / cp changing between neighbouring layers, one
with a tp4 embedding), four MoE plans on ``MOE_MODEL`` (ep4 x dp4, ep2 x dp4 ZeRO-2, ep2 x etp2 on tp2 x SP x dp2,
ep2 x dp2 in each of two 1F1B stages) and two 2-node runs (tp2 in a node x dp2 across, dp4 ZeRO-3), each 2-node run
launched as two torchrun agents meeting at a c10d rendezvous on this host and priced on a 2 x 2 cluster.
``HELD_OUT`` names five plans fixed before any modelling change was tuned on this bench (mix-z3-z2-tp4-z1-emb-tp4,
cp4-zero3, moe-ep2-etp2-tp2-dp2, 2node-dp4-zero3, pp2-tp2-1f1b) and a sixth, moe-pp2-ep2-dp2-1f1b, fixed before
the MoE layer was profiled under expert parallelism; their MAPE and Spearman are printed apart.

With ``--interleave`` (and no ``--profile`` / ``--separate-profile``) the profile is taken inside the launch
that runs the plans: every round is one pass of ``worker.profiler.measure_node`` with the round's plans run
between its measurements, so profile and plans share the machine's background load (this host is shared, and
a profile taken minutes earlier under another load missed by 20-40 %). The passes are merged point by point
(median, ``worker.profiler.merge_profiles``); the plans are priced from the merged profile after they ran, by
the cost model alone (nothing is fitted to their measured times). The 2-node launch takes its own profile the same
way, layers included, and its plans are priced from it: its collectives across nodes (groups spanning the two
agents) are its own, and its layers run under its own load (it runs 2 plans where the 1-node launch runs 18;
priced with the 1-node launch's layer times, both 2-node plans came out 15-20 % slow). ``--launches K`` runs each
launch K times and pools the samples and profile passes of its K launches: one plan can run 10-20 % slower than
another through every round of one launch and not of the next (moe-ep2-etp2-tp2-dp2 against pp2-tp2-1f1b, two runs
of one commit), and the communication-heavy TP plans up to 50 % slower in one of two launches than in the other
(pp2-tp2-1f1b 2.87 vs 1.88 s, while dp4 moved 8 %), which no number of rounds within one launch averages out.
A launch's ranks share one gloo group per set of ranks across all its plans and profile passes
(``worker.runtime.groups``): built plan by plan, the 21 plans' meshes gave each rank 364 threads (121 groups, each
with a transport loop waking every 10 ms) and a load average of ~80 on this 2-core host; shared, 16 threads and ~5.

What the profile carries beyond layer and collective times (all measured by ``worker.profiler``, none fitted
to these plans): layer times with every rank busy (each repeat as long as its slowest rank took, as the next
synchronisation waits for it; the median repeat), Megatron-SP layer times as the runtime runs them,
ring-attention layers as the runtime runs them (cp 2 and 4, the ring's exchanges inside), DeepSpeed-Ulysses layers
as the runtime runs them (over 2 and 4 ranks, the all-to-alls inside), the model's MoE layer
as the runtime runs it (all experts on one rank; under tp 2 / 4 with and without SP with its experts split over
the tp ranks, the expert-TP exchanges inside; its experts dealt over ep 2 / 4 ranks, alone and with tp 2, the
dispatch and combine all-to-alls inside), FSDP2's per-layer wrapper overhead with and without resharding, the host
contention (a layer with all ranks busy vs one rank alone: idle pipeline ranks hand their cores to busy ones;
the cost model simulates GPipe and 1F1B steps under that processor sharing), p2p send/recv (the cluster's link
bandwidth in the request, ``measured_links``) and the AdamW step time per parameter over the model's blocks
(passed to the cost model as ``optimizer_traffic_bytes`` at the measured bandwidth).

Prints a table (predicted vs measured step time per plan, * = held out), the spread of the measured times,
the MAPE and Spearman's rank correlation over all plans, over the plans tuned on and over the held-out ones.
With ``--interleave`` it then prints each round's host speed against the launch's median round and the same
scores against each plan's time with that round-to-round drift removed (``drift_removed``: a plan x round
median polish of the samples), beside the plain medians, which stay the headline figures. With ``--launches K``
(K >= 2) it also prints the measurement against itself: Spearman's rank correlation between each two launches'
medians of the plans (``launch_agreement``, no model involved), over all plans and the held-out ones, the
ceiling against which a model's rank correlation with one measurement is read.
Goal (issue 31): over all plans MAPE <= 20 %, Spearman >= 0.9, reported apart for the held-out plans.
The FlexSP and Spindle plans' closed loops (issue 32: ``--kind flexsp`` / ``--kind spindle``) run
``bench/flexsp_runtime.py`` and ``bench/spindle_runtime.py`` with the options that follow. Measured
step time = median of the steps after warm-up. The machine is shared: the load average is printed at the start
and the end, as noise on it is noise in the result.
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from solvers.api import estimate  # noqa: E402
from solvers.cost_model.calibration import DEFAULT_CALIBRATION  # noqa: E402
from solvers.run_layout import RUNTIME_STACK  # noqa: E402
from worker.launch import Launch, run_locally, torchrun_command  # noqa: E402

if TYPE_CHECKING:
    from worker.runtime.parallelize import ParallelModel

RANKS = 4
MODEL: dict[str, Any] = {"name": "small-llama", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 8,
                         "num_kv_heads": 4, "ffn_hidden_size": 688, "vocab_size": 1024, "mlp": "swiglu"}
# The same model with every 2nd layer MoE: 4 experts, top-2; a capacity factor of num_experts / top_k drops no token.
MOE_MODEL: dict[str, Any] = {**MODEL, "name": "small-moe",
                             "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 344,
                                     "capacity_factor": 2.0, "moe_layer_frequency": 2}}
# on the stack the runtime runs (framework "paraplan": eager elementwise ops, no TP overlap, the gradient sync after
# the backward), as a run's own prediction is (service.runs.runtime_predicted)
TRAINING = {"global_batch_size": 16, "seq_length": 128, "precision": "fp32",
            "stack": RUNTIME_STACK.model_dump(mode="json", exclude_unset=True)}


def per_layer(layers: list[dict[str, Any]], embedding: dict[str, Any]) -> dict[str, Any]:
    """A full strategy (the contract's per-layer form) on one stage: ``layers`` repeated over the 8 layers in
    order (each entry covers 8 / len(layers) consecutive layers)."""
    n = MODEL["num_layers"] // len(layers)
    return {"pp": 1, "micro_batches": 1, "schedule": "1f1b", "stage_layers": [MODEL["num_layers"]],
            "layers": [{"cp": 1, "sp": None, "zero": 0, "recompute": "none", **x} for x in layers for _ in range(n)],
            "embedding": embedding}


# name -> (strategy, model, nodes): ``nodes`` > 1 is launched as that many torchrun agents (RANKS // nodes ranks
# each) meeting at a c10d rendezvous on this host, and priced on a cluster of that many nodes.
Plan = tuple[dict[str, Any], dict[str, Any], int]
PLANS_4: dict[str, Plan] = {
    # uniform strategies (the contract's shorthand), chosen to spread step times and exercise every parallelism
    "dp4": ({"dp": 4, "zero": 0, "micro_batches": 1}, MODEL, 1),
    "dp4-zero3": ({"dp": 4, "zero": 3, "micro_batches": 1}, MODEL, 1),
    "dp4-zero1": ({"dp": 4, "zero": 1, "micro_batches": 1}, MODEL, 1),
    "dp4-recompute": ({"dp": 4, "zero": 0, "micro_batches": 1, "recompute": "full"}, MODEL, 1),
    "tp4": ({"tp": 4, "micro_batches": 1}, MODEL, 1),
    "tp2-sp-dp2-zero2": ({"tp": 2, "dp": 2, "sp": "megatron", "zero": 2, "micro_batches": 1}, MODEL, 1),
    "pp4-1f1b": ({"pp": 4, "micro_batches": 8, "schedule": "1f1b"}, MODEL, 1),
    "pp2-tp2-1f1b": ({"pp": 2, "tp": 2, "micro_batches": 4, "schedule": "1f1b"}, MODEL, 1),
    "pp2-dp2-gpipe": ({"pp": 2, "dp": 2, "zero": 2, "micro_batches": 4, "schedule": "gpipe"}, MODEL, 1),
    "pp4-gpipe-mb4": ({"pp": 4, "micro_batches": 4, "schedule": "gpipe"}, MODEL, 1),
    # ring-attention context parallelism
    "cp2-dp2": ({"cp": 2, "dp": 2, "zero": 0, "micro_batches": 1}, MODEL, 1),
    "cp4-zero3": ({"cp": 4, "dp": 1, "zero": 3, "micro_batches": 1}, MODEL, 1),
    # per-layer mixes: TP / SP kind / ZeRO / cp change between neighbouring layers, the embedding its own layout
    "mix-tp2dp2-tp4-uly4-dp4z3": (per_layer(
        [{"tp": 2, "dp": 2}, {"tp": 4, "dp": 1, "sp": "megatron"}, {"tp": 4, "dp": 1, "sp": "ulysses"},
         {"tp": 1, "dp": 4, "zero": 3}], {"tp": 1, "dp": 4, "zero": 0}), MODEL, 1),
    "mix-z3-z2-tp4-z1-emb-tp4": (per_layer(
        [{"tp": 1, "dp": 4, "zero": 3}, {"tp": 2, "dp": 2, "sp": "megatron", "zero": 2}, {"tp": 4, "dp": 1},
         {"tp": 2, "dp": 2, "sp": "ulysses", "zero": 1}], {"tp": 4, "dp": 1, "zero": 0}), MODEL, 1),
    "mix-cp2dp2-tp4-cp4-dp4": (per_layer(
        [{"tp": 1, "dp": 2, "cp": 2}, {"tp": 4, "dp": 1, "sp": "megatron"}, {"tp": 1, "dp": 1, "cp": 4, "zero": 3},
         {"tp": 1, "dp": 4}], {"tp": 1, "dp": 4, "zero": 0}), MODEL, 1),
    # MoE expert parallelism on MOE_MODEL (expert fields on its MoE layers; etp = the layer's tp unless given)
    "moe-ep4-dp4": ({"dp": 4, "zero": 0, "ep": 4, "micro_batches": 1}, MOE_MODEL, 1),
    "moe-ep2-dp4-zero2": ({"dp": 4, "zero": 2, "ep": 2, "micro_batches": 1}, MOE_MODEL, 1),
    "moe-ep2-etp2-tp2-dp2": ({"tp": 2, "dp": 2, "sp": "megatron", "zero": 1, "ep": 2, "micro_batches": 1},
                             MOE_MODEL, 1),
    # added to HELD_OUT at stop 48, before the MoE layer was profiled under expert parallelism: MoE in a pipeline
    "moe-pp2-ep2-dp2-1f1b": ({"pp": 2, "dp": 2, "zero": 0, "ep": 2, "micro_batches": 4, "schedule": "1f1b"},
                             MOE_MODEL, 1),
    # two nodes of 2 ranks: tp inside a node, dp across the nodes
    "2node-tp2-dp2": ({"tp": 2, "dp": 2, "zero": 0, "micro_batches": 1}, MODEL, 2),
    "2node-dp4-zero3": ({"dp": 4, "zero": 3, "micro_batches": 1}, MODEL, 2),
}
# Fixed before any modelling change was tuned on this bench (issue 31): no change may be tuned on these; the
# bench reports their MAPE and Spearman apart. One of each new kind: a per-layer mix, cp, MoE/EP, a 2-node run,
# and a uniform plan.
# The sixth, moe-pp2-ep2-dp2-1f1b, was added (stop 48) before the MoE layer was profiled under expert parallelism, a
# change decided from the other MoE plans' errors (moe-ep2-etp2-tp2-dp2's among them): it is the MoE plan that
# change was not tuned on.
HELD_OUT = ("mix-z3-z2-tp4-z1-emb-tp4", "cp4-zero3", "moe-ep2-etp2-tp2-dp2", "2node-dp4-zero3", "pp2-tp2-1f1b",
            "moe-pp2-ep2-dp2-1f1b")
# The same kinds on 2 ranks: on a 2-core host that is one core per rank, as a device per rank would be.
PLANS_2: dict[str, Plan] = {
    "dp2": ({"dp": 2, "zero": 0, "micro_batches": 1}, MODEL, 1),
    "dp2-zero3": ({"dp": 2, "zero": 3, "micro_batches": 1}, MODEL, 1),
    "dp2-recompute": ({"dp": 2, "zero": 0, "micro_batches": 1, "recompute": "full"}, MODEL, 1),
    "tp2": ({"tp": 2, "micro_batches": 1}, MODEL, 1),
    "tp2-sp": ({"tp": 2, "sp": "megatron", "micro_batches": 1}, MODEL, 1),
    "pp2-1f1b": ({"pp": 2, "micro_batches": 8, "schedule": "1f1b"}, MODEL, 1),
    "pp2-gpipe-mb2": ({"pp": 2, "micro_batches": 2, "schedule": "gpipe"}, MODEL, 1),
}
PLANS = {4: PLANS_4, 2: PLANS_2}
# What a CPU host with gloo does differently from a GPU: nothing overlaps (communication and compute share
# the cores) and the host cost of launching kernels is inside the measured layer times.
CPU_CALIBRATION = {"kernel_overhead_s": 0.0, "zero_overlap": 0.0, "dp_overlap": 0.0, "tp_overlap": 0.0,
                   "cp_overlap": 0.0, "microbatch_overhead_s": 1e-3}


def run_profiler(workdir: Path, repeats: int, ranks: int) -> dict[str, Any]:
    out = workdir / "profile.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           "-m", "worker.profiler", "--model", json.dumps(MOE_MODEL), "--seqs", str(TRAINING["seq_length"]),
           "--batches", "1,2,4,8,16", "--repeats", str(repeats), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def request(plan: Plan, profiled: dict[str, Any] | None, ranks: int = RANKS) -> dict[str, Any]:
    strategy, model, nodes = plan
    gpu: dict[str, Any] = {"name": "cpu", "peak_tflops": 0.2, "peak_tflops_fp32": 0.2, "memory_gib": 16}
    cost_model: dict[str, Any] = {"kind": "analytic", "calibration": CPU_CALIBRATION}
    if profiled is not None:
        dev = profiled["device"]
        gpu.update(peak_tflops=dev["peak_tflops"], peak_tflops_fp32=dev["peak_tflops"],
                   memory_bandwidth_GBps=dev["memory_bandwidth_GBps"])
        calibration = dict(CPU_CALIBRATION)
        if dev.get("optimizer_s_per_param"):
            # the measured AdamW step, as the bytes per parameter that take that long at the measured bandwidth
            hbm_Bps = dev["memory_bandwidth_GBps"] * 1e9 * DEFAULT_CALIBRATION.hbm_efficiency
            calibration["optimizer_traffic_bytes"] = dev["optimizer_s_per_param"] * hbm_Bps
        cost_model = {"kind": "profile", "profile": profiled["profile"], "calibration": calibration}
    cluster: dict[str, Any] = {"gpu": gpu, "nodes": nodes, "gpus_per_node": ranks // nodes}
    if profiled is not None:
        cluster |= measured_links(profiled["profile"])
    return {"kind": "hybrid", "model": model, "training": TRAINING, "cluster": cluster,
            "strategy": strategy, "cost_model": cost_model}


def measured_links(profile: dict[str, Any]) -> dict[str, float]:
    """The cluster's links as the profiler measured them: its p2p send/recv between two ranks of this host
    (gloo over loopback), fitted as latency + bytes / bandwidth. Both "nodes" of a 2-node run are on this host,
    so the link between them is the same loopback. Without this the cluster would claim the GPU defaults
    (300 GB/s within a node), which price the analytic parts (ring attention's hops, MoE all-to-alls,
    re-layouts between layers, collectives across nodes) ~100 times too fast for gloo."""
    import numpy as np

    pts = [(c["message_bytes"], c["time_ms"] / 1e3) for c in profile["collectives"] if c["op"] == "p2p"]
    if len(pts) < 2:
        return {}
    per_byte, _ = np.polyfit([b for b, _ in pts], [t for _, t in pts], 1)
    if per_byte <= 0:
        return {}
    GBps = 1.0 / float(per_byte) / 1e9
    return {"intra_node_bandwidth_GBps": GBps, "inter_node_bandwidth_Gbps": 8 * GBps}


def predict_with_cost_model(plan: Plan, profiled: dict[str, Any] | None, ranks: int) -> float:
    """The predictor: paraplan's cost model (``kind: profile`` with this node's profile)."""
    return float(estimate(request(plan, profiled, ranks)).to_json()["step_time_s"])


PREDICTORS: dict[str, Callable[[Plan, dict[str, Any] | None, int], float]] = {
    "cost_model": predict_with_cost_model,
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ROUND_STEPS = 2  # each plan's steps in one round of ``measure_interleaved``
PROFILE_SPEC: dict[str, Any] = {"model": MOE_MODEL, "batches": [1, 2, 4, 8, 16], "seqs": [TRAINING["seq_length"]]}


def measure_interleaved(docs: dict[str, dict[str, Any]], ranks: int, rounds: int, steps: int, workdir: Path,
                        nnodes: int = 1, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every plan in one launch, round-robin (``rounds`` x ``steps`` steps each, after one warm-up round),
    so that a change in the machine's background load hits all plans alike: ``{"samples": {plan: step times,
    round after round}, "profiles": [...]}``. With ``profile`` (``PROFILE_SPEC`` and ``repeats``) each round is
    also one pass of ``worker.profiler.measure_node`` on the same ranks, the round's plans run between its
    measurements, evenly spread: the profile is taken under the load the plans see (the warm-up round's pass is
    discarded). ``nnodes`` > 1: that many torchrun agents on this host (``ranks // nnodes`` ranks each), node 0
    hosting the c10d rendezvous, as ``worker.launch`` starts the nodes of a multi-node run."""
    spec = workdir / f"interleave-{nnodes}n.json"
    out = workdir / f"interleave-{nnodes}n-out.json"
    spec.write_text(json.dumps({"plans": docs, "rounds": rounds, "steps": steps, "profile": profile}))
    entry = [str(Path(__file__).resolve()), "--interleaved-rank", str(spec), str(out)]
    run = sys.executable, "-m", "torch.distributed.run"
    if nnodes == 1:
        subprocess.run([*run, "--standalone", f"--nproc-per-node={ranks}", *entry], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=1800)
    else:
        endpoint = f"127.0.0.1:{_free_port()}"
        nodes = [Launch(ranks // nnodes, nnodes=nnodes, node_rank=node, rendezvous_endpoint=endpoint,
                        rendezvous_id="closed-loop") for node in range(nnodes)]
        procs = [subprocess.Popen([*torchrun_command(node), *entry], cwd=ROOT, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for node in nodes]
        codes = [p.wait(timeout=1800) for p in procs]
        if any(codes):
            raise RuntimeError(f"{nnodes}-node launch failed: exit codes {codes}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _profile_pass(spec: dict[str, Any], pause: Callable[[], None]) -> dict[str, Any]:
    """One pass of ``worker.profiler``'s measurements on the launched ranks (see ``measure_interleaved``), calling
    ``pause`` between two measurements."""
    import torch

    from solvers.specs import ModelSpec
    from worker import profiler
    from worker.runtime.model import ModelConfig

    full = ModelConfig.from_spec(ModelSpec.model_validate(spec["model"]))
    device, repeats = torch.device("cpu"), int(spec["repeats"])
    return profiler.measure_node(full, spec["batches"], spec["seqs"], None, device, repeats, pause=pause)


def launched_plans(docs: dict[str, dict[str, Any]]) -> dict[str, ParallelModel]:
    """On a rank started by torchrun: join the launch's gloo group and build every plan document of ``docs`` on
    this rank with the worker runtime's own ``parallelize``."""
    import torch
    import torch.distributed as dist

    from worker.runtime.parallelize import parallelize
    from worker.runtime.plan import from_document, load_plan

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    return {name: parallelize(from_document(*load_plan(doc), world_size=world), 0, torch.device("cpu"))
            for name, doc in docs.items()}


def round_order(names: list[str], r: int) -> list[str]:
    """The plans in round ``r``'s order: each round starts at another plan."""
    return names[r % len(names):] + names[:r % len(names)]


def interleaved_rank(spec_path: Path, out: Path) -> int:
    """One rank of ``measure_interleaved`` (run by torchrun): the worker runtime's own parallelize/train_step."""
    import torch.distributed as dist

    from worker.runtime.data import global_batch

    spec = json.loads(spec_path.read_text())
    models = launched_plans(spec["plans"])
    times: dict[str, list[float]] = {name: [] for name in models}
    profiles: list[dict[str, Any]] = []
    step = 0

    def run(name: str, keep: bool) -> None:
        nonlocal step
        pm = models[name]
        for _ in range(spec["steps"]):
            tokens = global_batch(pm.plan.model.vocab_size, pm.plan.global_batch_size, pm.plan.seq_length, 0, step)
            dist.barrier()
            start = time.perf_counter()
            pm.train_step(tokens)
            if keep:
                times[name].append(time.perf_counter() - start)
            step += 1

    names = list(models)
    pauses, every = 0, 1
    for r in range(spec["rounds"] + 1):  # round 0 warms every plan (and the profiler) up
        queue = round_order(names, r)

        def pause(r: int = r, queue: list[str] = queue, every: int = every) -> None:
            nonlocal pauses
            pauses += 1
            if queue and pauses % every == 0:
                run(queue.pop(0), r > 0)

        if spec.get("profile"):
            # the profile pass with the round's plans spread over it (a plan's steps every ``every`` measurements)
            pauses = 0
            doc = _profile_pass(spec["profile"], pause)
            if r > 0:
                profiles.append(doc)
            else:
                every = max(1, pauses // len(names))
        for name in queue:
            run(name, r > 0)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"samples": times, "profiles": profiles}))
    dist.barrier()
    return 0


def drift_removed(samples: dict[str, list[float]], steps: int) -> tuple[dict[str, float], list[float]]:
    """Each plan's step time with the host's round-to-round speed taken out, and each round's speed factor.

    ``samples[plan]`` holds ``steps`` step times a round, round after round (``interleaved_rank``). The table of
    each (plan, round)'s mean log step time is fitted as overall + plan effect + round effect by Tukey's median
    polish: a round in which the shared host ran every plan slow moves its round effect, not the plans' times, and
    one slow sample moves no median. A plan's time is ``exp(overall + plan effect)``, its time at the run's
    median round speed; the factors are ``exp(round effect)`` (1.10: that round ran 10 % slow)."""
    import numpy as np

    names = list(samples)
    rounds = min(len(samples[n]) for n in names) // steps
    table = np.array([[np.mean(np.log(samples[n][r * steps:(r + 1) * steps])) for r in range(rounds)]
                      for n in names])
    overall, plan, round_ = 0.0, np.zeros(len(names)), np.zeros(rounds)
    for _ in range(20):  # median polish converges in a few sweeps
        rows = np.median(table, axis=1)
        table, plan = table - rows[:, None], plan + rows
        shift = float(np.median(round_))
        overall, round_ = overall + shift, round_ - shift
        cols = np.median(table, axis=0)
        table, round_ = table - cols[None, :], round_ + cols
        shift = float(np.median(plan))
        overall, plan = overall + shift, plan - shift
    return ({n: float(np.exp(overall + plan[i])) for i, n in enumerate(names)},
            [float(np.exp(b)) for b in round_])


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for pos, i in enumerate(order):
            r[i] = float(pos)
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def scores(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(MAPE, Spearman) of the rows' predicted vs measured step times."""
    mape = sum(abs(r["error"]) for r in rows) / len(rows)
    return mape, spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])


def subsets(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows the scores are printed for: all of them, the plans tuned on and the held-out ones (those there are)."""
    tuned, held = [r for r in rows if not r["held_out"]], [r for r in rows if r["held_out"]]
    return [(label, part) for label, part in (("all", rows), ("tuned-on", tuned), ("held out", held)) if part]


def launch_agreement(launches: list[dict[str, float]], names: list[str]) -> list[float]:
    """Spearman's rank correlation of the plans ``names`` between every two launches' measured times (each launch a
    plan -> median step time): how well the measurement agrees with itself from launch to launch, the ceiling
    against which a model's rank correlation with one measurement is to be read."""
    return [spearman([a[n] for n in names], [b[n] for n in names])
            for i, a in enumerate(launches) for b in launches[i + 1:]]


def describe(profiled: dict[str, Any], label: str) -> None:
    prof, dev = profiled["profile"], profiled["device"]
    print(f"{label}: host {prof.get('host')}; wrapper overheads {prof.get('overheads', [])}; "
          f"AdamW {1e9 * dev.get('optimizer_s_per_param', 0.0):.2f} ns/param; {len(prof['layer_times'])} layer points, "
          f"{len(prof['collectives'])} collective points, {dev['peak_tflops']:.3f} TFLOP/s and "
          f"{dev['memory_bandwidth_GBps']:.1f} GB/s per rank", flush=True)


# the closed loops of the other plan kinds: their own calibrations and runtimes, their own scripts
OTHER_KINDS = {"flexsp": "flexsp_runtime.py", "spindle": "spindle_runtime.py"}


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--interleaved-rank":
        from worker.runtime.groups import shared_process_groups

        with shared_process_groups():  # one gloo group per set of ranks for all the launch's plans and profile
            code = interleaved_rank(Path(sys.argv[2]), Path(sys.argv[3]))
        os._exit(code)  # skip gloo teardown (see worker/runtime/train.py)
    if len(sys.argv) >= 3 and sys.argv[1] == "--kind" and sys.argv[2] in OTHER_KINDS:
        script = Path(__file__).with_name(OTHER_KINDS[sys.argv[2]])
        return subprocess.run([sys.executable, str(script), *sys.argv[3:]], check=False).returncode
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path, help="profile JSON from worker.profiler (default: profile now)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--predictor", choices=sorted(PREDICTORS), default="cost_model")
    ap.add_argument("--ranks", type=int, choices=sorted(PLANS), default=RANKS)
    ap.add_argument("--plans", help="comma-separated subset of the plans for --ranks (default: all)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                    help="measure all plans in one launch, round-robin, ROUNDS x 2 steps each (less exposed to "
                         "background load drifting between plans), each round after one profile pass on the same "
                         "ranks (unless --profile or --separate-profile); default: one daemon-style launch per plan")
    ap.add_argument("--launches", type=int, default=1, metavar="K",
                    help="with --interleave: run each launch K times (ROUNDS rounds each) and pool their samples and "
                         "profile passes: a plan can run 10 %% or more slower through a whole launch, and only "
                         "another launch averages that out")
    ap.add_argument("--separate-profile", action="store_true",
                    help="with --interleave: profile in a launch of its own before the plans run")
    args = ap.parse_args()
    if args.launches < 1 or (args.launches > 1 and not args.interleave):
        ap.error("--launches K needs K >= 1, and --interleave when K > 1")
    work = Path(tempfile.mkdtemp(prefix="closed-loop-"))
    t0 = time.time()
    print(f"load average at start {os.getloadavg()}", flush=True)
    ranks, plans = args.ranks, PLANS[args.ranks]
    names = args.plans.split(",") if args.plans else list(plans)
    in_launch = bool(args.interleave) and args.profile is None and not args.separate_profile
    profiled: dict[str, Any] | None = None
    if not in_launch:
        profiled = json.loads(args.profile.read_text()) if args.profile else run_profiler(work, args.repeats, ranks)
        describe(profiled, f"profile ({time.time() - t0:.0f} s)")
    # no result: the worker runs the request's strategy as the cost model reads it, the plan the predictor priced
    # (the runtime reads the strategy, not the cost model, so an in-launch profile is not needed to build them)
    docs = {n: {"kind": "hybrid", "request": request(plans[n], profiled, ranks)} for n in names}
    interleaved: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    profile_of_nodes: dict[int, dict[str, Any]] = {}
    passes_of_nodes: dict[int, list[dict[str, Any]]] = {}  # each launch's profile passes before the merge
    launch_medians: list[dict[str, float]] = [{} for _ in range(args.launches)]  # the k-th launch of every group
    profile_spec = {**PROFILE_SPEC, "repeats": args.repeats} if in_launch else None
    launches = sorted({plans[n][2] for n in names} if args.interleave else set(plans[n][2] for n in names) - {1})
    for nnodes in launches:  # a multi-node run is its own launch (its nodes meet at one rendezvous)
        group = {n: d for n, d in docs.items() if plans[n][2] == nnodes}
        # every launch profiles in full: its plans are priced from what its own ranks measured under its own load;
        # --launches K repeats the launch, its samples and profile passes pooled (rounds numbered on across them)
        passes: list[dict[str, Any]] = []
        for k in range(args.launches if args.interleave else 1):
            got = measure_interleaved(group, ranks, args.interleave or max(1, args.steps // ROUND_STEPS), ROUND_STEPS,
                                      work, nnodes, profile_spec)
            for name, t in got["samples"].items():
                samples.setdefault(name, []).extend(t)
                launch_medians[k][name] = statistics.median(t)
            passes += got["profiles"]
        interleaved |= {name: statistics.median(samples[name]) for name in group}
        if passes:
            from worker.profiler import merge_profiles

            passes_of_nodes[nnodes] = passes
            merged = merge_profiles(passes)
            profile_of_nodes[nnodes] = merged
            describe(merged, f"{nnodes}-node launch x{args.launches}, {len(passes)} profile passes "
                             f"({time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f})")
    predictor = PREDICTORS[args.predictor]
    rows: list[dict[str, Any]] = []
    for name in names:
        load = os.getloadavg()[0]
        if name in interleaved:
            measured, notes = interleaved[name], []
        else:
            metrics = run_locally(docs[name], ranks, args.steps, work / name)
            measured, notes = float(metrics["step_time_s"]), metrics.get("notes", [])
        # priced by the cost model from the profile: taken before any plan ran, or in the plan's own launch
        predicted = predictor(plans[name], profiled or profile_of_nodes[plans[name][2]], ranks)
        rows.append({"plan": name, "predicted_s": predicted, "measured_s": measured,
                     "error": (predicted - measured) / measured, "load": load, "notes": notes,
                     "held_out": name in HELD_OUT, "nodes": plans[name][2]})
    print(f"\n{'plan':<28}{'predicted s':>13}{'measured s':>12}{'error':>9}")
    for r in rows:
        print(f"{r['plan'] + (' *' if r['held_out'] else ''):<28}{r['predicted_s']:>13.4f}{r['measured_s']:>12.4f}"
              f"{100 * r['error']:>8.1f}%")
    mape, rho = scores(rows)
    measured_s = sorted(r["measured_s"] for r in rows)
    print(f"\nmeasured step times {measured_s[0]:.3f} .. {measured_s[-1]:.3f} s")
    print(f"all {len(rows)} plans: MAPE {100 * mape:.1f}% (goal <= 20%)   Spearman {rho:.3f} (goal >= 0.9)   "
          f"on {ranks} gloo ranks, {time.time() - t0:.0f} s, load average {os.getloadavg()}")
    parts = subsets(rows)
    for label, subset in parts[1:] if any(r["held_out"] for r in rows) else []:  # ("all": the line above)
        s_mape, s_rho = scores(subset)
        tag = f"* {len(subset)} plans, fixed before tuning" if label == "held out" else f"{len(subset)} plans"
        print(f"{label} ({tag}): MAPE {100 * s_mape:.1f}%   Spearman {s_rho:.3f}")
    if args.interleave and args.launches > 1:
        # the measurement against itself: each launch's medians against another's (no model involved)
        for label, subset in parts:
            agree = launch_agreement(launch_medians, [r["plan"] for r in subset])
            print(f"launch against launch, measured only, {label} ({len(subset)} plans): Spearman "
                  f"{', '.join(f'{a:.3f}' for a in agree)}")
    if args.interleave:
        # the same comparison with each launch's round-to-round host drift removed (``drift_removed``)
        for nnodes in launches:
            launch = {n: samples[n] for n in names if plans[n][2] == nnodes}
            steady, factors = drift_removed(launch, ROUND_STEPS)
            print(f"{nnodes}-node launch: rounds ran x{', x'.join(f'{f:.3f}' for f in factors)} the median round")
            for r in rows:
                if r["plan"] in steady:
                    r["measured_steady_s"] = steady[r["plan"]]
        steady_rows = [{**r, "measured_s": r["measured_steady_s"],
                        "error": (r["predicted_s"] - r["measured_steady_s"]) / r["measured_steady_s"]} for r in rows]
        for label, subset in subsets(steady_rows):
            s_mape, s_rho = scores(subset)
            print(f"drift removed, {label} ({len(subset)} plans): MAPE {100 * s_mape:.1f}%   Spearman {s_rho:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "mape": mape, "spearman": rho,
                                         "samples": samples, "launch_medians": launch_medians,
                                         "profiles": {str(k): v for k, v in profile_of_nodes.items()},
                                         "profile_passes": {str(k): v for k, v in passes_of_nodes.items()}},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
