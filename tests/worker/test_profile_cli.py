"""``paraplan worker profile`` measures this node (2 gloo ranks, tiny model) and uploads a profile that the
cost model accepts; the profile's layer times grow with the batch."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from solvers.cost_model.fitting import CollectiveMeasurement, profile_measurements
from solvers.cost_model.profile import load_profile
from tests.conftest import PARAPLAN, ROOT, LiveServer, free_port
from tests.worker.plans import TINY_MODEL


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_profile_is_measured_uploaded_and_readable_by_the_cost_model(
        live_server_factory: Callable[..., LiveServer]) -> None:
    server = live_server_factory(dispatcher=False)
    proc = subprocess.run(
        [*PARAPLAN, "worker", "profile", "--model", json.dumps(TINY_MODEL), "--nproc", "2", "--seqs", "64",
         "--batches", "1,8", "--repeats", "5", "--server", server.url, "--token", server.token("worker")],
        capture_output=True, text=True, timeout=150, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    created = json.loads(proc.stdout.strip().splitlines()[-1])
    got = httpx.get(f"{server.url}/v1/profiles/{created['id']}",
                    headers={"Authorization": f"Bearer {server.token('admin')}"}).json()
    assert got["kind"] == "hardware"
    profile = load_profile(got["data"])
    assert profile.stack is not None and profile.stack.framework == "paraplan"  # what its layers were timed on
    assert profile.model is not None and profile.model.hidden_size == TINY_MODEL["hidden_size"]  # and whose layers
    plain = [x for x in profile.layer_times if x.cp == x.ulysses == 1 and not x.sp and x.layer_type == "dense"]
    by_tp = {(x.tp, x.batch): x for x in plain}
    assert {tp for tp, _ in by_tp} == {1, 2} and all(x.seq == 64 for x in profile.layer_times)
    assert by_tp[(1, 8)].forward_ms > by_tp[(1, 1)].forward_ms  # 8x the tokens costs more
    assert {x.cp for x in profile.layer_times} == {1, 2}  # ring attention measured as the runtime runs it
    assert {x.ulysses for x in profile.layer_times} == {1, 2}  # and DeepSpeed-Ulysses
    heads = {(x.tp, x.batch): x for x in profile.head_times}  # the LM head and loss, vocabulary-parallel at tp 2
    assert set(heads) == {(1, 1), (1, 8), (2, 1), (2, 8)} and heads[(1, 8)].forward_ms > heads[(1, 1)].forward_ms
    ops = {c.op for c in profile.collectives}
    assert {"allreduce", "allgather", "alltoall", "p2p"} <= ops
    assert all(c.group_size == 2 for c in profile.collectives)
    # FSDP2's wrapper overhead with and without resharding, and how much slower a layer runs with both ranks busy
    assert sorted(o.reshard for o in profile.overheads) == [False, True]
    assert profile.host is not None and profile.host.busy_ranks == 2 and profile.host.slowdown >= 1.0


def test_profile_rejects_an_unknown_model_preset() -> None:
    proc = subprocess.run([*PARAPLAN, "worker", "profile", "--model", "no-such-model"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "--model" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_nodes_profiled_together_measure_their_network_and_fit_a_set_for_it(
        live_server_factory: Callable[..., LiveServer], tmp_path: Path) -> None:
    """Two nodes of one rank each (two commands on this host, meeting at node 0's rendezvous, given the same --out
    as on a shared filesystem, and the network they are on): the node holding rank 0 saves and uploads one profile
    whose collectives span both nodes and say so, with the network stated; a calibration set fitted on it over HTTP
    fits the network's efficiency on those collectives, relative to that network. (Whether the fit pins the
    efficiency down is up to the host: gloo on a loaded loopback times the collectives many times slower than any
    network constant prices them, and the fit then moves it without pinning it; the fitting and calibration-set
    tests check the pinning against a known truth.)"""
    server = live_server_factory(dispatcher=False)
    endpoint = f"127.0.0.1:{free_port()}"
    saved = tmp_path / "profile.json"
    nodes = [subprocess.Popen(
        [*PARAPLAN, "worker", "profile", "--model", json.dumps(TINY_MODEL), "--nproc", "1", "--seqs", "64",
         "--batches", "1,2", "--repeats", "3", "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint,
         "--out", str(saved), "--server", server.url, "--token", server.token("worker"),
         "--inter-node-bandwidth-Gbps", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        # one thread a rank, as torchrun gives ranks that share a node: these two "nodes" share this host's cores,
        # and two threads a rank over-subscribed them (a loaded host then timed this tiny layer at 300 ms, not 6)
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}) for rank in (0, 1)]
    outputs = [p.communicate(timeout=200) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [err[-3000:] for _, err in outputs]
    uploaded = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs if out.strip()]
    assert len(uploaded) == 1  # one profile, from the node holding rank 0; the other says so
    assert any("the node holding rank 0 writes the profile" in err for _, err in outputs)
    admin = {"Authorization": f"Bearer {server.token('admin')}"}
    profile = load_profile(httpx.get(f"{server.url}/v1/profiles/{uploaded[0]['id']}", headers=admin).json()["data"])
    assert profile.gpus_per_node == 1 and load_profile(json.loads(saved.read_text())["profile"]) == profile
    assert profile.inter_node_bandwidth_Gbps == 10
    assert profile.collectives and all(c.across_nodes and c.nodes == 2 for c in profile.collectives)
    submit = {"Authorization": f"Bearer {server.token('submit')}"}
    made = httpx.post(f"{server.url}/v1/calibration-sets", headers=submit, timeout=120,
                      json={"name": "two-cpu-nodes", "profiles": [uploaded[0]["id"]], "gpu": "cpu"})
    assert made.status_code == 201, made.text
    fit = made.json()["fit"]
    measured = profile_measurements(profile, "cpu")  # every collective across the two nodes goes into the fit
    assert sum(isinstance(m, CollectiveMeasurement) and m.across_nodes for m in measured) == len(profile.collectives)
    assert fit["measurements"] == len(measured) and "inter_efficiency" in fit["keys"]
    assert (fit["network_Gbps"], fit["network_stated"]) == (10, True)


@pytest.mark.parametrize(("args", "option"), [
    (["--nnodes", "2"], "--rdzv-endpoint"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank"),
    (["--nnodes", "0"], "--nnodes"),
    (["--inter-node-bandwidth-Gbps", "0"], "--inter-node-bandwidth-Gbps")])
def test_profile_refuses_an_inconsistent_multi_node_launch(args: list[str], option: str) -> None:
    proc = subprocess.run([*PARAPLAN, "worker", "profile", "--model", json.dumps(TINY_MODEL), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and option in proc.stderr and "Traceback" not in proc.stderr
