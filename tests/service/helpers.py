"""Test helpers: put plans into a state without running a solver (for the API around them)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from service import jobs, plans
from service.db.engine import Database
from service.db.models import Job
from solvers.documents import load_result

HYBRID = {"kind": "hybrid", "model": {"preset": "llama2-7b"},
          "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
          "training": {"global_batch_size": 64, "seq_length": 2048}}
RESULT = {"estimate": {"step_time_s": 4.2, "peak_memory_gib": 30.5, "throughput_samples_per_s": 15.2,
                       "tokens_per_s": 15.2 * 2048, "mfu": 0.41, "memory_gib_per_stage": [30.5],
                       "breakdown_s": {"compute": 3.6, "tp_comm": 0.4, "dp_comm_exposed": 0.2}},
          "strategy": {"pp": 1, "micro_batches": 8, "schedule": "1f1b", "stage_layers": [32],
                       "layers": [{"tp": 2, "dp": 4, "sp": "megatron", "cp": 1, "zero": 3, "recompute": "none"}] * 32,
                       "embedding": {"tp": 2, "dp": 4, "zero": 3}},
          "search": {"time_s": 0.5, "solver": "dp"}}

SPINDLE_RESULT = {"estimate": {"iteration_time_s": 0.2}, "lower_bound_s": 0.18, "search": {"time_s": 0.1},
                  "slices": [{"metaop": "vision", "devices": [0, 1], "layers": 24, "start_s": 0.0, "end_s": 0.2}],
                  "baselines": {"sequential_full_cluster_s": 0.3}}


def variant(i: int, base: dict[str, Any] = HYBRID) -> dict[str, Any]:
    """A distinct but equally valid request (different global batch size)."""
    return {**base, "training": {**base["training"], "global_batch_size": 8 * (i + 1)}}


def store_plan(db: Database, request: dict[str, Any] | None = None, result: dict[str, Any] | None = None,
               kind: str = "hybrid") -> str:
    """A succeeded plan, completed through the queue as a dispatcher would."""
    view, _ = plans.submit_plan(db, request or HYBRID, kind, 3)
    with db.writing() as s:  # lease this plan's job (claim_job would take the oldest queued one)
        job = s.execute(select(Job).where(Job.plan_id == view["id"])).scalar_one()
        job.status, job.lease_owner, job.attempts = "running", "test-dispatcher", 1
    assert jobs.complete_job(db, job.id, "test-dispatcher", load_result(kind, result or RESULT))
    return str(view["id"])


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
