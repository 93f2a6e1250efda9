"""Service + worker subprocesses for a FlexSP plan: the service solves it and queues a run, a worker daemon claims
it and trains it with 4 gloo ranks (``flexsp_train``: without a length stream of its own the worker draws each
step's batch from the plan's lengths, and rank 0 plans every next step) and is SIGKILLed mid-run with its torchrun
and ranks; the lease expires, the run is re-queued, a second daemon runs it again from step 0 (FlexSP runs keep no
checkpoints) and it completes exactly once, with the measured metrics beside the plan's prediction and every
step's progress."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.worker.test_end_to_end import Worker, submit_run, terminal, wait_run
from tests.worker.test_end_to_end import workers as workers  # the fixture

STEPS = 20  # the issue asks for a run of >= 20 steps
REQUEST = {"kind": "flexsp", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 4}, "precision": "fp32",
           "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128},
           # attention-heavy, fast all-to-all: the planner splits this tiny model's long sequences over groups
           "cost_model": {"kind": "flexsp", "alpha1_ms_per_token2": 1e-4, "alpha2_ms_per_token": 0.01,
                          "beta_ms": 0.5, "activation_mb_per_token": 0.01, "params_billion": 0.0001,
                          "alltoall_GBps_by_group_size": {"2": 1.0, "4": 0.5}},
           "batch": {"sequence_lengths": [308, 490, 380, 99, 89, 149, 140, 392]}}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_service_queues_and_worker_trains_a_flexsp_plan_once_through_a_sigkill(
        live_server_factory: Callable[..., LiveServer], workers: list[Worker], tmp_path: Path) -> None:
    server = live_server_factory(run_lease_s=3)  # heartbeats every 0.75 s
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token('admin')}"})
    token = server.token("worker")
    plan, run_id = submit_run(http, REQUEST, steps=STEPS)
    workers.append(Worker(server, token, tmp_path / "w1", "w1"))
    first = wait_run(http, run_id, 90, lambda r: terminal(r) or len(r["progress"]) >= 3)
    assert first["status"] == "running" and len(first["progress"]) < STEPS, first["status"]
    workers[0].kill()  # the daemon, its torchrun and ranks, mid-run
    workers.append(Worker(server, token, tmp_path / "w2", "w2"))
    run = wait_run(http, run_id, 120, terminal)
    logs = [w.log.read_text(errors="replace")[-3000:] for w in workers]
    assert run["status"] == "succeeded", (run.get("error"), logs)
    assert run["attempts"] == run["attempt"] == 2
    assert sorted(p["step"] for p in run["progress"] if p["attempt"] == 2) == list(range(STEPS))
    assert sum(w.log.read_text().count(f"run {run_id} succeeded") for w in workers) == 1
    assert str(tmp_path / "w1") not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout

    m: dict[str, Any] = run["metrics"]
    assert m["layout"] == "flexsp" and m["world_size"] == 4
    assert len(m["loss"]) == STEPS and all(math.isfinite(x) for x in m["loss"])
    assert sum(m["loss"][-5:]) < sum(m["loss"][:5]) - 1.0  # falls by > 0.2 per step on average over the ends
    assert run["predicted"]["step_time_s"] == plan["result"]["estimate"]["step_time_s"] > 0
    steps = m["flexsp_steps"]
    assert len(steps) == STEPS and steps[0]["grouping"] == "plan" and m["groupings"]["planned"] >= STEPS // 2
    assert steps[0]["micro_batches"] == [{"groups": [{k: g[k] for k in ("sp", "ranks", "sequences")}
                                                     for g in mb["groups"]]} for mb in plan["result"]["micro_batches"]]
    for step in steps:  # drawn from the plan's own lengths
        assert set(step["lengths"]) <= set(REQUEST["batch"]["sequence_lengths"])  # type: ignore[index]
        assert step["predicted_step_time_s"] > 0 and step["step_time_s"] > 0
