"""Multi-node runs over HTTP: claimed all-or-nothing by as many workers as the plan has nodes (never started on
fewer; a member that stops polling drops out), one lease per node, node 0 the rendezvous endpoint; any node lost
or failed re-queues the run whole. And the run request's checkpoint and dataset fields, and resumed_from_step."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from service.db.engine import Database
from service.db.models import Run, utcnow
from tests.service.helpers import store_plan
from tests.worker.plans import TINY_MODEL, plan_doc

pytestmark = pytest.mark.db


def _two_node_run(client: Any, db: Database, make_token: Callable[[str], str]) -> str:
    doc = plan_doc(dp=4, zero=3)
    doc["request"]["cluster"] = {"gpu": "cpu", "nodes": 2, "gpus_per_node": 2}
    plan_id = store_plan(db, doc["request"], doc["result"])
    r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 4},
                    headers={"Authorization": f"Bearer {make_token('submit')}"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


class Node:
    def __init__(self, client: Any, token: str, name: str, gpus: int) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {token}"}
        r = client.post("/v1/workers/register", json={"name": name, "host": f"host-{name}", "gpus": gpus},
                        headers=self.headers)
        assert r.status_code == 201, r.text
        self.id, self.endpoint = r.json()["id"], f"host-{name}:2950{gpus}"

    def claim(self) -> dict[str, Any] | None:
        r = self.client.post("/v1/runs/claim", json={"worker_id": self.id, "endpoint": self.endpoint},
                             headers=self.headers)
        assert r.status_code in (200, 204), r.text
        return r.json()["run"] if r.status_code == 200 else None

    def post(self, run_id: str, action: str, **body: Any) -> Any:
        return self.client.post(f"/v1/runs/{run_id}/{action}", json={"worker_id": self.id, **body},
                                headers=self.headers)


def _expire(db: Database, run_id: str, worker_id: str) -> None:
    """``worker_id``'s node lease ran out (its worker died)."""
    past = (utcnow() - timedelta(seconds=1)).isoformat()
    with db.writing() as s:
        run = s.execute(select(Run).where(Run.id == run_id)).scalar_one()
        run.nodes = [{**n, "lease_expires_at": past} if n["worker_id"] == worker_id else n for n in run.nodes]
        if run.status == "running":
            run.lease_expires_at = utcnow() - timedelta(seconds=1)


def test_a_two_node_run_starts_only_when_two_workers_hold_it(client: Any, db: Database,
                                                             make_token: Callable[[str], str]) -> None:
    token = make_token("worker")
    a, small, b = Node(client, token, "a", 2), Node(client, token, "small", 1), Node(client, token, "b", 2)
    run_id = _two_node_run(client, db, make_token)
    assert a.claim() is None  # joined, waiting for a second node
    view = client.get(f"/v1/runs/{run_id}").json()
    assert view["status"] == "queued" and view["nodes_needed"] == 2
    assert [n["worker_id"] for n in view["nodes"]] == [a.id]
    assert small.claim() is None  # one rank cannot hold a node of 2: it does not join
    assert a.claim() is None  # still one node: never started on fewer
    assert [n["worker_id"] for n in client.get(f"/v1/runs/{run_id}").json()["nodes"]] == [a.id]
    got_b = b.claim()
    assert got_b is not None
    assert (got_b["id"], got_b["node_rank"], got_b["nnodes"], got_b["attempt"]) == (run_id, 1, 2, 1)
    assert got_b["rendezvous_endpoint"] == a.endpoint  # the first node hosts the c10d rendezvous
    got_a = a.claim()
    assert got_a is not None and got_a["node_rank"] == 0 and got_a["rendezvous_endpoint"] == a.endpoint
    assert a.claim() is None  # told once
    view = client.get(f"/v1/runs/{run_id}").json()
    assert view["status"] == "running" and view["attempt"] == 1
    assert [(n["worker_id"], n["node_rank"], n["host"]) for n in view["nodes"]] == [(a.id, 0, "host-a"),
                                                                                     (b.id, 1, "host-b")]
    # one lease per node: each renews its own; a worker outside the run holds none
    assert a.post(run_id, "heartbeat").status_code == 200 and b.post(run_id, "heartbeat").status_code == 200
    assert small.post(run_id, "heartbeat").status_code == 409
    assert b.post(run_id, "metrics", step=0, loss=4.0, step_time_s=0.1).status_code == 200
    done = b.post(run_id, "complete", metrics={"loss": [4.0]})
    assert done.status_code == 200 and done.json()["status"] == "succeeded"
    assert a.post(run_id, "complete", metrics={}).status_code == 409  # exactly once
    assert [n["worker_id"] for n in client.get(f"/v1/runs/{run_id}").json()["nodes"]] == [a.id, b.id]


def test_a_lost_node_requeues_the_run_whole_and_the_others_abort(client: Any, db: Database,
                                                                 make_token: Callable[[str], str]) -> None:
    token = make_token("worker")
    a, b, c = Node(client, token, "a", 2), Node(client, token, "b", 2), Node(client, token, "c", 2)
    run_id = _two_node_run(client, db, make_token)
    assert a.claim() is None and b.claim() is not None and a.claim() is not None
    _expire(db, run_id, b.id)  # node 1 dies
    assert c.claim() is None  # the claim reaps: the run is queued again, whole; c joins it as its first node
    view = client.get(f"/v1/runs/{run_id}").json()
    assert view["status"] == "queued" and "expired" in view["error"] and view["attempts"] == 1
    assert [n["worker_id"] for n in view["nodes"]] == [c.id]
    assert a.post(run_id, "heartbeat").status_code == 409  # the surviving node learns it and aborts
    again = a.claim()
    assert again is not None and (again["attempt"], again["node_rank"]) == (2, 1)
    assert again["rendezvous_endpoint"] == c.endpoint
    # a node's retryable failure also sends the whole run back
    failed = a.post(run_id, "fail", error="rank 3 crashed", retryable=True)
    assert failed.status_code == 200 and failed.json()["status"] == "queued" and failed.json()["nodes"] == []
    assert c.post(run_id, "heartbeat").status_code == 409


def test_a_member_that_stops_polling_leaves_a_gathering_run(client: Any, db: Database,
                                                            make_token: Callable[[str], str]) -> None:
    token = make_token("worker")
    a, b = Node(client, token, "a", 2), Node(client, token, "b", 2)
    run_id = _two_node_run(client, db, make_token)
    assert a.claim() is None
    _expire(db, run_id, a.id)  # a died while waiting
    assert b.claim() is None  # b does not start the run with a dead partner: it is its first node now
    view = client.get(f"/v1/runs/{run_id}").json()
    assert view["status"] == "queued" and [(n["worker_id"], n["node_rank"]) for n in view["nodes"]] == [(b.id, 0)]


def test_run_request_fields_and_resumed_step(client: Any, db: Database, make_token: Callable[[str], str]) -> None:
    submit = {"Authorization": f"Bearer {make_token('submit')}"}
    doc = plan_doc(dp=4)
    plan_id = store_plan(db, doc["request"], doc["result"])
    body = {"steps": 10, "checkpoint_every_steps": 5, "dataset": {"path": "/data/tokens.bin", "dtype": "uint16"}}
    created = client.post(f"/v1/plans/{plan_id}/runs", json=body, headers=submit)
    assert created.status_code == 201, created.text
    assert created.json()["checkpoint_every_steps"] == 5 and created.json()["dataset"] == body["dataset"]
    for bad, loc in (({"dataset": {"path": "tokens.bin"}}, ["body", "dataset", "path"]),
                     ({"dataset": {"path": "/d/t.bin", "dtype": "int8"}}, ["body", "dataset", "dtype"]),
                     ({"dataset": {"path": "/d/t.bin", "document_separator": 0}},
                      ["body", "dataset", "document_separator"]),
                     ({"checkpoint_every_steps": 0}, ["body", "checkpoint_every_steps"])):
        r = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3, **bad}, headers=submit)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, r.text
    big = copy.deepcopy(plan_doc(dp=4, model={**TINY_MODEL, "vocab_size": 70_000}))
    big_id = store_plan(db, big["request"], big["result"])
    r = client.post(f"/v1/plans/{big_id}/runs", json={"dataset": {"path": "/d/t.bin", "dtype": "uint16"}},
                    headers=submit)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "dataset", "dtype"]
    assert "vocabulary of 70000" in r.json()["detail"][0]["msg"]

    node = Node(client, make_token("worker"), "w", 4)
    claimed = node.claim()
    assert claimed is not None and claimed["checkpoint_every_steps"] == 5 and claimed["dataset"] == body["dataset"]
    run_id = claimed["id"]
    assert client.get(f"/v1/runs/{run_id}").json()["resumed_from_step"] is None
    assert node.post(run_id, "metrics", step=5, loss=3.0, step_time_s=0.1, resumed_from_step=5).status_code == 200
    assert client.get(f"/v1/runs/{run_id}").json()["resumed_from_step"] == 5
    assert node.post(run_id, "fail", error="oom", retryable=True).json()["status"] == "queued"
    again = node.claim()
    assert again is not None and again["attempt"] == 2
    assert client.get(f"/v1/runs/{run_id}").json()["resumed_from_step"] is None  # until attempt 2 reports its own
