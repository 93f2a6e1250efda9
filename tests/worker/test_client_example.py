"""The public client and the example script: a user's training script asks the service for a plan for its
own model, applies it with the runtime's public functions, and trains (CPU, 2 gloo ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.conftest import ROOT, LiveServer
from worker.client import PlanClient, PlanError


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_example_requests_a_plan_and_trains_with_it(live_server_factory: Callable[..., LiveServer]) -> None:
    server = live_server_factory()
    token = server.token("submit")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "examples" / "train_with_plan.py"), "--server", server.url, "--token", token, "--steps", "3"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(summary["loss"]) == 3 and all(4.5 < x < 6.5 for x in summary["loss"])  # ~ln(256) untrained
    assert "pp" in summary["layout"] and "dp" in summary["layout"]


@pytest.mark.slow
def test_client_reports_the_bad_field(live_server_factory: Callable[..., LiveServer]) -> None:
    server = live_server_factory(dispatcher=False)
    with PlanClient(server.url, server.token("submit")) as client, pytest.raises(PlanError) as err:
        client.plan({"kind": "hybrid", "model": {"preset": "llama2-7b"}, "cluster": {"gpu": "cpu"},
                     "training": {"global_batch_size": -1}}, wait_s=5)
    assert any("global_batch_size" in str(p.get("loc")) for p in err.value.problems), err.value
