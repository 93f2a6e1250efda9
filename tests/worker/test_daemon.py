"""The daemon's protocol against an in-test fake of the runs API (httpx MockTransport): it stops on
401/403, backs off on transient errors, aborts a run whose lease is lost, refuses invalid plans without
launching anything, and only ever builds paraplan's own training command."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from service.demo import DEMO_REQUESTS
from tests.contract_json import solve
from tests.worker.plans import plan_doc
from worker.api import LeaseLost, Unauthorized, WorkerApi, backoff_delays
from worker.daemon import EXIT_SERVER_UNAVAILABLE, EXIT_UNAUTHORIZED, Daemon, DaemonConfig
from worker.launch import TRAIN_MODULE, Launch, ProgressTail, train_command


class FakeServer:
    """Answers the worker endpoints from a script of (method, path-prefix) -> list of responses."""

    def __init__(self, script: dict[tuple[str, str], list[httpx.Response]]) -> None:
        self.script = script
        self.calls: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        for (method, prefix), responses in self.script.items():
            if request.method == method and request.url.path.startswith(prefix):
                return responses.pop(0) if len(responses) > 1 else responses[0]
        return httpx.Response(404, json={"detail": "not found"})


def api_for(fake: FakeServer, sleeps: list[float] | None = None) -> WorkerApi:
    return WorkerApi("http://fake", "t", transport=httpx.MockTransport(fake), max_retry_s=60,
                     sleep=(sleeps.append if sleeps is not None else lambda s: None),
                     delays=backoff_delays(rng=random.Random(0)))


REGISTERED = httpx.Response(201, json={"id": "w1", "heartbeat_interval_s": 0.05, "lease_s": 1.0})


def test_register_refused_stops_with_exit_code(tmp_path: Path) -> None:
    fake = FakeServer({("POST", "/v1/workers/register"): [httpx.Response(401, json={"detail": "bad token"})]})
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(fake))
    assert daemon.run() == EXIT_UNAUTHORIZED
    assert [c[1] for c in fake.calls] == ["/v1/workers/register"]  # no retry of a refused token


def test_transient_errors_are_retried_with_growing_backoff() -> None:
    fake = FakeServer({("POST", "/v1/workers/register"): [httpx.Response(503), httpx.Response(502),
                                                         httpx.Response(429), REGISTERED]})
    sleeps: list[float] = []
    assert api_for(fake, sleeps).register({"name": "n", "host": "h"})["id"] == "w1"
    assert len(sleeps) == 3 and len(fake.calls) == 4
    caps = [0.5 * 2**n for n in range(3)]
    assert all(0 <= s <= cap for s, cap in zip(sleeps, caps, strict=True))


def test_backoff_is_capped_and_jittered() -> None:
    delay = backoff_delays(base_s=0.5, cap_s=30, rng=random.Random(1))
    samples = [delay(20) for _ in range(200)]
    assert max(samples) <= 30 and min(samples) >= 0 and len(set(samples)) > 150


def test_403_mid_run_is_unauthorized_and_409_is_lease_lost() -> None:
    fake = FakeServer({("POST", "/v1/runs/r1/heartbeat"): [httpx.Response(409, json={"detail": "lease lost"})],
                       ("POST", "/v1/runs/r2/heartbeat"): [httpx.Response(403, json={"detail": "scope"})]})
    api = api_for(fake)
    with pytest.raises(LeaseLost):
        api.run_heartbeat("r1", "w1")
    with pytest.raises(Unauthorized):
        api.run_heartbeat("r2", "w1")


def test_lost_lease_sets_the_abort_event(tmp_path: Path) -> None:
    fake = FakeServer({("POST", "/v1/runs/r1/heartbeat"): [httpx.Response(200, json={"lease_expires_at": "x"}),
                                                          httpx.Response(409, json={"detail": "lease lost"})]})
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(fake))
    daemon.worker_id, daemon.heartbeat_s = "w1", 0.01
    lost = threading.Event()
    t = threading.Thread(target=daemon._hold_lease, args=("r1", lost))
    t.start()
    assert lost.wait(5)
    t.join(5)
    assert [c[1] for c in fake.calls].count("/v1/runs/r1/heartbeat") == 2


def test_a_node_done_with_its_part_holds_its_lease_until_the_run_is_reported(tmp_path: Path) -> None:
    """A node of a multi-node run whose ranks finished keeps renewing its lease until the server answers 409 (the
    node with global rank 0 completed the run): letting it lapse first would re-queue a finished run."""
    ok = httpx.Response(200, json={"lease_expires_at": "x"})
    fake = FakeServer({("POST", "/v1/runs/r1/heartbeat"): [ok, ok, ok, httpx.Response(409, json={"detail": "done"})]})
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(fake))
    daemon.worker_id, daemon.heartbeat_s, daemon.lease_s = "w1", 0.01, 30.0
    lost = threading.Event()
    t = threading.Thread(target=daemon._hold_lease, args=("r1", lost))
    t.start()
    started = time.monotonic()
    daemon._await_report("r1", lost)
    t.join(5)
    assert lost.is_set() and time.monotonic() - started < 5
    assert [c[1] for c in fake.calls].count("/v1/runs/r1/heartbeat") == 4  # renewed until the 409
    daemon.lease_s = 0.05
    daemon._await_report("r1", threading.Event())  # no answer at all: gives up after one lease


def test_invalid_plan_fails_the_run_without_launching(tmp_path: Path) -> None:
    bad = plan_doc(tp=3)  # 4 heads are not divisible by 3
    claimed = httpx.Response(200, json={"run": {"id": "r1", "plan_id": "p1", "steps": 2, "attempt": 1,
                                                "lease_expires_at": "x", "plan": bad}})
    fake = FakeServer({("POST", "/v1/workers/register"): [REGISTERED],
                       ("POST", "/v1/runs/claim"): [claimed],
                       ("POST", "/v1/runs/r1/fail"): [httpx.Response(200, json={})],
                       ("POST", "/v1/workers/w1/heartbeat"): [httpx.Response(200, json={"ok": True})]})
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path, max_runs=1), api=api_for(fake))
    assert daemon.run() == 0
    fails = [c[2] for c in fake.calls if c[1] == "/v1/runs/r1/fail"]
    assert len(fails) == 1 and fails[0]["retryable"] is False
    assert "num_attention_heads" in fails[0]["error"] and "tp=3" in fails[0]["error"]
    assert not any(tmp_path.rglob("plan.json"))  # nothing was launched


def test_a_spindle_plan_its_runtime_cannot_run_fails_the_run_naming_the_field(tmp_path: Path) -> None:
    """A Spindle plan its runtime cannot run (the demo's explicit times: no model) fails its run, not retryable,
    naming the metaop's field, rather than with the hybrid schema's complaints about its fields. Nothing is
    launched."""
    request = DEMO_REQUESTS["spindle"]
    doc = {"id": "p1", "kind": "spindle", "request": request, "result": solve(request)}
    fake = FakeServer({("POST", "/v1/runs/r1/fail"): [httpx.Response(200, json={})]})
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(fake))
    daemon.worker_id = "w1"
    daemon.execute({"id": "r1", "plan_id": "p1", "steps": 2, "attempt": 1, "plan": doc})
    fails = [c[2] for c in fake.calls if c[1] == "/v1/runs/r1/fail"]
    assert len(fails) == 1 and fails[0]["retryable"] is False
    assert "request.workload.metaops.0.module" in fails[0]["error"], fails[0]["error"]
    assert not any(tmp_path.rglob("plan.json"))


def test_a_flexsp_plan_is_checked_by_its_own_runtime_before_launching(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A FlexSP plan for GPUs on a node without CUDA goes back to the queue (retryable); one its runtime cannot run
    (bf16 on CPU ranks) fails, not retryable, naming the field; neither launches anything."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu = DEMO_REQUESTS["flexsp"]
    cpu = {"kind": "flexsp", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 4}, "precision": "bf16",
           "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128},
           "batch": {"sequence_lengths": [96, 40, 24, 16, 8]}}
    for request, retryable, says in ((gpu, True, "this node has no CUDA device"), (cpu, False, "request.precision")):
        doc = {"id": "p1", "kind": "flexsp", "request": request, "result": solve(request)}
        fake = FakeServer({("POST", "/v1/runs/r1/fail"): [httpx.Response(200, json={})]})
        daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(fake))
        daemon.worker_id = "w1"
        daemon.execute({"id": "r1", "plan_id": "p1", "steps": 2, "attempt": 1, "plan": doc})
        fails = [c[2] for c in fake.calls if c[1] == "/v1/runs/r1/fail"]
        assert len(fails) == 1 and fails[0]["retryable"] is retryable and says in fails[0]["error"], fails
    assert not any(tmp_path.rglob("plan.json"))


def _gpu_node(monkeypatch: pytest.MonkeyPatch, gpus: int, total_gib: float) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(name="NVIDIA A100-SXM4-80GB", total_memory=total_gib * 2**30))


def _gpu_plan(peak_gib: float) -> dict[str, Any]:
    doc = plan_doc(dp=4)
    doc["request"]["cluster"]["gpu"] = "A100-80GB"
    doc["result"]["estimate"]["peak_memory_gib"] = peak_gib
    return doc


@pytest.mark.parametrize(("gpus", "peak_gib", "refusal"),
                         [(8, 79.7, "needs 79.70 GiB per GPU; this node's GPUs give CUDA 79.15 GiB"),
                          (2, 10.0, "needs 4 GPUs on one node; this node has 2")])
def test_a_plan_this_node_cannot_hold_is_handed_back_without_launching(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int, peak_gib: float, refusal: str) -> None:
    """A plan whose estimate exceeds the memory the GPUs give CUDA would OOM after launch and warm-up: the run
    goes back to the queue (retryable: a larger node may take it) with the reason, and nothing starts."""
    _gpu_node(monkeypatch, gpus, 79.15)
    fake = FakeServer({("POST", "/v1/runs/r1/fail"): [httpx.Response(200, json={})]})
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(fake))
    daemon.worker_id = "w1"
    daemon.execute({"id": "r1", "plan_id": "p1", "steps": 2, "attempt": 1, "plan": _gpu_plan(peak_gib)})
    fails = [c[2] for c in fake.calls if c[1] == "/v1/runs/r1/fail"]
    assert len(fails) == 1 and fails[0]["retryable"] is True and refusal in fails[0]["error"]
    assert not any(tmp_path.rglob("plan.json"))


def test_a_plan_that_fits_the_device_passes_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu_node(monkeypatch, 8, 79.15)
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(FakeServer({})))
    assert daemon._world_size(_gpu_plan(79.0)) == 4
    assert daemon._world_size(plan_doc(dp=4)) == 4  # a CPU plan carries no GPU check

def test_only_paraplans_entrypoint_is_ever_built(tmp_path: Path) -> None:
    cmd = train_command(4, tmp_path / "plan.json", 5, tmp_path / "m.json", tmp_path / "p.jsonl")
    assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert cmd[cmd.index("-m", 2) + 1] == TRAIN_MODULE


def test_a_node_of_a_multi_node_run_joins_node_0s_rendezvous(tmp_path: Path) -> None:
    launch = Launch(nproc=2, nnodes=2, node_rank=1, rendezvous_endpoint="10.0.0.5:29512", rendezvous_id="r1-2",
                    checkpoint_dir=tmp_path / "run-r1", checkpoint_every=5, dataset=tmp_path / "t.bin")
    cmd = train_command(launch, tmp_path / "plan.json", 5, tmp_path / "m.json", tmp_path / "p.jsonl")
    assert "--standalone" not in cmd and cmd[cmd.index("-m", 2) + 1] == TRAIN_MODULE
    for arg in ("--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.5:29512",
                "--rdzv-id=r1-2", "--rdzv-conf=is_host=false"):
        assert arg in cmd
    assert cmd[cmd.index("--checkpoint-dir") + 1] == str(tmp_path / "run-r1")
    assert cmd[cmd.index("--checkpoint-every") + 1] == "5" and cmd[cmd.index("--dataset-dtype") + 1] == "uint16"
    node0 = train_command(Launch(2, 2, 0, "10.0.0.5:29512"), tmp_path / "p", 5, tmp_path / "m", tmp_path / "q")
    assert "--rdzv-conf=is_host=true" in node0 and "--checkpoint-dir" not in node0


def test_progress_tail_returns_complete_lines_once(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    tail = ProgressTail(path)
    assert tail.new_lines() == []
    path.write_text('{"step": 0}\n{"step": 1}\n{"ste')
    assert [x["step"] for x in tail.new_lines()] == [0, 1]
    with path.open("a") as f:
        f.write('p": 2}\n')
    assert tail.new_lines() == [{"step": 2}]
    assert tail.new_lines() == []




def test_unreachable_server_exits_with_a_message_not_a_traceback(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    sleeps: list[float] = []
    api = WorkerApi("http://fake", "t", transport=httpx.MockTransport(refuse), max_retry_s=5.0,
                    sleep=sleeps.append, delays=lambda n: 1.0)
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api)
    assert daemon.run() == EXIT_SERVER_UNAVAILABLE
    assert 3 <= len(sleeps) <= 5  # retried within its budget, then gave up


def test_paraplan_worker_gpus_declares_the_ranks_this_host_offers(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import worker.daemon
    from paraplan_cli.main import app

    seen: dict[str, Any] = {}
    monkeypatch.setattr(worker.daemon, "main", lambda **kw: seen.update(kw) or 0)
    result = CliRunner().invoke(app, ["worker", "--server", "http://s", "--token", "t", "--gpus", "2"])
    assert result.exit_code == 0, result.output
    assert seen == {"server": "http://s", "token": "t", "gpus": 2}
    assert worker.daemon.host_info("n", 2)["gpus"] == 2
    bad = CliRunner().invoke(app, ["worker", "--server", "http://s", "--token", "t", "--gpus", "0"])
    assert bad.exit_code == 2 and "--gpus" in bad.output


def test_a_runs_dataset_reaches_the_training_command_with_its_document_separator(tmp_path: Path) -> None:
    """The claimed run's dataset (as the service stores it) becomes the launch's --dataset, --dataset-dtype and, for
    a FlexSP run that reads documents, --document-separator; a run without one launches without them."""
    daemon = Daemon(DaemonConfig("http://fake", "t", workdir=tmp_path), api=api_for(FakeServer({})))
    run = {"id": "r1", "dataset": {"path": "/shared/docs.bin", "dtype": "uint32", "document_separator": 2}}
    cmd = train_command(daemon._launch(run, 4, 1), tmp_path / "plan.json", 5, tmp_path / "m.json", tmp_path / "p")
    assert cmd[cmd.index("--dataset") + 1] == "/shared/docs.bin" and cmd[cmd.index("--dataset-dtype") + 1] == "uint32"
    assert cmd[cmd.index("--document-separator") + 1] == "2"
    plain = train_command(daemon._launch({"id": "r2"}, 4, 1), tmp_path / "p.json", 5, tmp_path / "m", tmp_path / "q")
    assert "--dataset" not in plain and "--document-separator" not in plain
