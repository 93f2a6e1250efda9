"""The published schema is what the API returns: stored documents of every kind, read back over HTTP, validate
against GET /v1/plans/{id}'s response schema in /openapi.json, and a document stored before documents were
typed (schema version 1) still loads."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from sqlalchemy import update

from service.db.engine import Database
from service.db.models import Plan
from solvers.api import solve
from solvers.documents import SCHEMA_VERSION
from tests.service.helpers import store_plan
from tests.service.requests import REQUESTS

pytestmark = pytest.mark.db

MOE = {"kind": "hybrid", "model": {"preset": "mixtral-8x7b", "num_layers": 4},
       "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
       "training": {"global_batch_size": 16, "seq_length": 2048}}
# a mixed cluster with a sizing front: the hetero and front parts of the hybrid document
MIXED = {"kind": "hybrid", "model": {"preset": "llama2-7b", "num_layers": 8},
         "cluster": {"groups": [{"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 4},
                                {"gpu": "A100-40GB", "nodes": 1, "gpus_per_node": 4}]},
         "training": {"global_batch_size": 32, "seq_length": 2048},
         "sizing": {"tokens": 1e10, "deadline_days": 3, "nodes": [1, 2], "price_per_gpu_hour": {"H100-SXM": 2.5}}}
EXACT_SPINDLE = {**REQUESTS["spindle"], "options": {"exact": True, "exact_time_limit_s": 1.0, "exact_workers": 1}}
# every kind, and the optional parts documents have: MoE layers (ep/etp), the exact Spindle model's report
CASES = {"hybrid": REQUESTS["hybrid"], "moe": MOE, "mixed": MIXED, "flexsp": REQUESTS["flexsp"],
         "spindle": EXACT_SPINDLE}


@pytest.fixture(scope="module")
def documents() -> dict[str, dict[str, Any]]:
    return {name: solve(request).to_json() for name, request in CASES.items()}


def _plan_validator(client: Any) -> Draft202012Validator:
    spec = client.get("/openapi.json").json()
    response = spec["paths"]["/v1/plans/{plan_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    # the response schema's $refs ("#/components/schemas/...") resolve against the OpenAPI document's components
    return Draft202012Validator({**response["schema"], "components": spec["components"]})


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_kind_validates_against_the_published_schema(client: Any, db: Database, documents: Any,
                                                           case: str) -> None:
    request = CASES[case]
    plan_id = store_plan(db, request, documents[case], kind=request["kind"])
    body = client.get(f"/v1/plans/{plan_id}").json()
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _plan_validator(client).iter_errors(body)]
    assert errors == []
    assert body["result"] == documents[case]
    assert body["result"]["kind"] == request["kind"] and body["result"]["schema_version"] == SCHEMA_VERSION


def test_the_schema_refuses_what_the_api_does_not_return(client: Any, db: Database, documents: Any) -> None:
    """Negative control: the published schema is strict, so drift in either direction would show."""
    plan_id = store_plan(db, CASES["hybrid"], documents["hybrid"])
    body = client.get(f"/v1/plans/{plan_id}").json()
    validator = _plan_validator(client)
    body["result"]["estimate"]["made_up_s"] = 1.0
    assert any("made_up_s" in e.message for e in validator.iter_errors(body))
    del body["result"]["estimate"]["made_up_s"], body["result"]["strategy"]
    assert any("strategy" in e.message for e in validator.iter_errors(body))


def test_a_version_1_document_still_loads(client: Any, db: Database, documents: Any) -> None:
    """Plans stored before documents named their kind and version read back as version 2, unchanged else."""
    current = documents["flexsp"]
    plan_id = store_plan(db, CASES["flexsp"], current, kind="flexsp")
    version_1 = {k: v for k, v in current.items() if k not in ("kind", "schema_version")}
    with db.writing() as session:
        session.execute(update(Plan).where(Plan.id == plan_id).values(result=version_1))
    body = client.get(f"/v1/plans/{plan_id}").json()
    assert body["result"] == current
    runs = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 2})  # read, checked by its runtime and queued
    assert runs.status_code == 201, runs.text
