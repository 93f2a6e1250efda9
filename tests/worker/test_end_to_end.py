"""Service + worker subprocesses: plans are requested and solved by the service, claimed and executed by
the worker daemon with 4 gloo ranks, and their measured metrics appear on the run. Two worker daemons on one
host form 2-node runs: one trains as the single-process model does; in another a node is SIGKILLed mid-run, its
lease expires, and the run, re-queued whole, is completed once by the surviving node and a new worker, resuming
from the checkpoint the first attempt wrote, with the uninterrupted run's losses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, LiveServer

MODEL = {"name": "tiny-llama", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 4,
         "ffn_hidden_size": 128, "vocab_size": 128, "mlp": "swiglu"}


def request(gbs: int, **constraints: Any) -> dict[str, Any]:
    return {"kind": "hybrid", "model": MODEL, "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 4},
            "training": {"global_batch_size": gbs, "seq_length": 32, "precision": "fp32"},
            "constraints": {"max_cp": 1, **constraints}}


# The solver chooses the strategy; these constraints leave it one layout of each kind on 4 ranks
# (e.g. one sample per micro-batch forbids data parallelism). With tensor parallelism the torchtitan target keeps
# the embedding and LM head on the layers' TP group, the layout the runtime runs (other plans are refused).
# One run per family of layout through service and daemon (data parallelism sharded, tensor parallelism with SP, a
# pipeline with TP); every layout's numerics are checked in test_equivalence.py, in one launch.
CASES: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = {
    "fsdp": (request(8, max_tp=1, max_pp=1, zero=3),
             lambda s: s["layers"][0]["dp"] == 4 and s["layers"][0]["zero"] == 3),
    "tp+sp": (request(1, micro_batches=1, max_pp=1, sp="megatron", target="torchtitan"),
              lambda s: s["pp"] == 1 and s["layers"][0]["tp"] == 4 and s["layers"][0]["sp"] == "megatron"),
    "pp2-tp2": (request(2, micro_batches=2, max_pp=2, schedule="1f1b", target="torchtitan"),
                lambda s: s["pp"] == 2 and s["layers"][0]["tp"] == 2),
}


class Worker:
    """``python -m worker.daemon`` in its own session (so SIGKILL takes the whole node down)."""

    def __init__(self, server: LiveServer, token: str, workdir: Path, name: str, *args: str,
                 checkpoints: Path | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.name, self.log = name, workdir / "daemon.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PARAPLAN_WORKER_ADDRESS": "127.0.0.1"}
        if checkpoints is not None:
            env["PARAPLAN_CHECKPOINT_DIR"] = str(checkpoints)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker.daemon", "--server", server.url, "--token", token, "--name", name,
                 "--workdir", str(workdir), "--claim-wait-s", "2", "--idle-exit-s", "120", *args],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:  # all at once: each finishes its long-poll first
        w.stop()
    for w in started:
        w.wait()


def submit_run(http: httpx.Client, req: dict[str, Any], steps: int, **fields: Any) -> tuple[dict[str, Any], str]:
    plan = http.post("/v1/plans", params={"wait": 60}, json=req, timeout=90).json()
    assert plan["status"] == "succeeded", plan
    plan = http.get(f"/v1/plans/{plan['id']}").json()
    run = http.post(f"/v1/plans/{plan['id']}/runs", json={"steps": steps, **fields})
    assert run.status_code == 201, run.text
    return plan, run.json()["id"]


def wait_run(http: httpx.Client, run_id: str, timeout_s: float, done: Callable[[dict[str, Any]], bool]
             ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        run: dict[str, Any] = http.get(f"/v1/runs/{run_id}").json()
        if done(run) or time.monotonic() > deadline:
            return run
        time.sleep(0.3)


def terminal(run: dict[str, Any]) -> bool:
    return run["status"] in ("succeeded", "failed", "cancelled")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_service_solves_and_worker_executes_each_layout(live_server_factory: Callable[..., LiveServer],
                                                        workers: list[Worker], tmp_path: Path) -> None:
    server = live_server_factory()
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token('admin')}"})
    runs = {}
    for name, (req, expected) in CASES.items():
        plan, run_id = submit_run(http, req, steps=3)
        strategy = plan["result"]["strategy"]
        assert expected(strategy), (f"{name}: the planner did not honour the request's constraints "
                                    f"(plan_from={plan['result'].get('search', {}).get('plan_from')})",
                                    req["constraints"], strategy["pp"], strategy["layers"][0])
        runs[name] = run_id
    workers.append(Worker(server, server.token("worker"), tmp_path / "w1", "w1"))
    for name, run_id in runs.items():
        run = wait_run(http, run_id, 150, terminal)
        log = workers[0].log.read_text(errors="replace")[-3000:]
        assert run["status"] == "succeeded", (name, run.get("error"), log)
        m = run["metrics"]
        assert m["world_size"] == 4 and len(m["peak_memory_gib_per_rank"]) == 4, name
        assert len(m["loss"]) == 3 and all(3.0 < x < 6.0 for x in m["loss"]), name  # ~ln(128) untrained
        assert m["step_time_s"] > 0 and m["tokens_per_s"] > 0 and 0 < m["mfu"] < 1, name
        assert [p["step"] for p in run["progress"]] == [0, 1, 2], name  # relayed while it ran
        assert run["worker"] and run["attempts"] == 1


def worker_ids(http: httpx.Client) -> dict[str, str]:
    return {w["name"]: w["id"] for w in http.get("/v1/workers").json()}


def newest_checkpoint(root: Path) -> int | None:
    """Steps of the newest checkpoint the run has marked complete (``train_checkpoint``), or None."""
    done = [int(p.parent.name.split("-")[1]) for p in root.glob("step-*/COMPLETE")]
    return max(done) if done else None


TWO_NODE_STEPS, EVERY = 6, 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_two_node_run_loses_a_node_and_completes_once_from_its_checkpoint(
        live_server_factory: Callable[..., LiveServer], workers: list[Worker], tmp_path: Path) -> None:
    """Two ``paraplan worker --gpus 2`` daemons on one host form 2-node runs of a pp2 x tp2 plan (one pipeline stage
    per node, 4 gloo ranks), checkpointing every 2 steps. The first run, uninterrupted, trains as the single-process
    model does. In the second, node 0's daemon (the c10d rendezvous host) is SIGKILLed with its torchrun and ranks
    once a checkpoint is complete: node 1 aborts, the run is re-queued whole, node 1 and a freshly started daemon
    run attempt 2 from that checkpoint, the run completes exactly once, and its loss curve from the checkpoint on
    equals the uninterrupted run's within 1e-5."""
    from tests.worker.test_equivalence import reference_losses

    server = live_server_factory(run_lease_s=3)  # heartbeats every 0.75 s
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token('admin')}"})
    shared, token = tmp_path / "checkpoints", server.token("worker")  # PARAPLAN_CHECKPOINT_DIR: seen by every node
    for name in ("n0", "n1"):  # starting while the plan is solved
        workers.append(Worker(server, token, tmp_path / name, name, "--gpus", "2", checkpoints=shared))
    req = request(2, micro_batches=2, max_pp=2, schedule="1f1b", target="torchtitan")
    req["cluster"] = {"gpu": "cpu", "nodes": 2, "gpus_per_node": 2}
    plan, plain_id = submit_run(http, req, steps=TWO_NODE_STEPS, checkpoint_every_steps=EVERY)
    strategy = plan["result"]["strategy"]
    assert (strategy["pp"], strategy["layers"][0]["tp"]) == (2, 2), strategy
    posted = http.post(f"/v1/plans/{plan['id']}/runs", json={"steps": TWO_NODE_STEPS, "checkpoint_every_steps": EVERY})
    assert posted.status_code == 201, posted.text
    run_id = posted.json()["id"]  # queued behind the uninterrupted one: the same nodes take it next

    deadline = time.monotonic() + 150
    while (saved := newest_checkpoint(shared / f"run-{run_id}")) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first = http.get(f"/v1/runs/{run_id}").json()
    assert saved is not None and first["status"] == "running" and first["attempt"] == 1, first
    ids = worker_ids(http)
    node0 = next(n["worker_id"] for n in first["nodes"] if n["node_rank"] == 0)
    victim = next(w for w in workers if ids[w.name] == node0)
    survivor = next(w for w in workers if w is not victim)
    victim.kill()  # the daemon, its torchrun and ranks: node 0 lost mid-run
    workers.append(Worker(server, token, tmp_path / "n2", "n2", "--gpus", "2", checkpoints=shared))
    # Attempt 1 over (its last checkpoint marker, written after a barrier all ranks passed, is on disk), attempt 2
    # not yet up to a checkpoint of its own: the newest complete one is the one attempt 2 must start from.
    wait_run(http, run_id, 60, lambda r: r["status"] != "running" or r["attempts"] > 1)
    saved = newest_checkpoint(shared / f"run-{run_id}")
    assert saved is not None and saved < TWO_NODE_STEPS
    run = wait_run(http, run_id, 150, terminal)
    logs = [w.log.read_text(errors="replace")[-3000:] for w in workers]
    assert run["status"] == "succeeded", (run.get("error"), logs)
    plain = http.get(f"/v1/runs/{plain_id}").json()

    # uninterrupted: one attempt on two nodes, the single-process model's losses
    assert plain["status"] == "succeeded" and plain["attempts"] == 1 and plain["resumed_from_step"] is None
    assert plain["nodes_needed"] == 2 and sorted(n["node_rank"] for n in plain["nodes"]) == [0, 1]
    assert {n["worker_id"] for n in plain["nodes"]} == {ids["n0"], ids["n1"]}
    m = plain["metrics"]
    assert m["world_size"] == 4 and m["nnodes"] == 2 and len(m["peak_memory_gib_per_rank"]) == 4
    assert m["loss"] == pytest.approx(reference_losses(plan, TWO_NODE_STEPS), abs=1e-4)

    # faulted: the survivor aborted attempt 1 (its ranks lost their peers, or its heartbeat got 409) and ran
    # attempt 2 with the new node, from the checkpoint, every later step once
    aborted = survivor.log.read_text()
    assert f"run {run_id}: launch 1 failed" in aborted or f"run {run_id}: lease lost" in aborted
    assert run["attempts"] == run["attempt"] == 2 and run["nodes_needed"] == 2
    assert {n["worker_id"] for n in run["nodes"]} == {ids[survivor.name], worker_ids(http)["n2"]}
    assert run["resumed_from_step"] == run["metrics"]["resumed_from_step"] == saved
    assert sorted(p["step"] for p in run["progress"] if p["attempt"] == 2) == list(range(saved, TWO_NODE_STEPS))
    curve, uninterrupted = run["metrics"]["loss"], m["loss"]
    assert len(curve) == TWO_NODE_STEPS
    assert curve[saved:] == pytest.approx(uninterrupted[saved:], abs=1e-5)
    # negative control: 1e-5 tells the steps apart (a resume one step off would fail)
    assert max(abs(a - b) for a, b in zip(uninterrupted[saved:], uninterrupted[saved - 1:], strict=False)) > 1e-3
    # completed exactly once: one success reported; a repeat completion is refused
    assert sum(w.log.read_text().count(f"run {run_id} succeeded") for w in workers) == 1
    again = httpx.post(f"{server.url}/v1/runs/{run_id}/complete", json={"worker_id": run["worker"], "metrics": {}},
                       headers={"Authorization": f"Bearer {token}"})
    assert again.status_code in (403, 409)
    # nothing of the lost node keeps running
    assert str(tmp_path / victim.name) not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                                             text=True).stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_spindle_plan_is_solved_and_run_by_the_worker(live_server_factory: Callable[..., LiveServer],
                                                         workers: list[Worker], tmp_path: Path) -> None:
    """The service plans a captioning + text workload (a vision encoder feeding a decoder the text task shares) with
    Spindle on 4 CPU "GPUs"; the daemon runs it with the Spindle runtime on 4 gloo ranks: per-iteration progress,
    per-task losses equal to the tasks run in turn on one process, the plan's prediction beside the measurement."""
    from tests.worker.spindle_plans import captioning_request
    from tests.worker.test_spindle_runtime import reference_of

    server = live_server_factory()
    http = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token('admin')}"})
    plan, run_id = submit_run(http, captioning_request(), steps=3)
    workers.append(Worker(server, server.token("worker"), tmp_path / "w1", "w1"))
    run = wait_run(http, run_id, 150, terminal)
    assert run["status"] == "succeeded", (run.get("error"), workers[0].log.read_text(errors="replace")[-3000:])
    m = run["metrics"]
    assert m["world_size"] == 4 and len(m["peak_memory_gib_per_rank"]) == 4 and m["step_time_s"] > 0
    assert run["predicted"]["step_time_s"] == m["predicted_step_time_s"] == plan["result"]["estimate"][
        "iteration_time_s"]
    assert m["predicted_peak_memory_gib"] == plan["result"]["estimate"]["peak_memory_gib"]
    assert len(m["step_times_s"]) == 3 and all(t > 0 for t in m["step_times_s"]) and m["peak_memory_gib"] > 0
    expected, _ = reference_of(plan, 3)
    assert m["loss"] == pytest.approx([sum(e.values()) for e in expected], abs=2e-4)
    assert [p["step"] for p in run["progress"]] == [0, 1, 2]
    assert run["progress"][0]["task_loss"] == pytest.approx(expected[0], abs=1e-4)
