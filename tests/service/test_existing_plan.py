"""An identical request returns the plan made before: the API says so in a header, the dashboard on the page."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.requests import REQUESTS

pytestmark = pytest.mark.db


def test_an_identical_request_is_answered_with_the_earlier_plan_and_says_so(client: Any) -> None:
    body = REQUESTS["spindle"]
    first = client.post("/v1/plans", json=body)
    assert first.status_code == 202 and first.headers["Paraplan-Existing-Plan"] == "false"
    again = client.post("/v1/plans", json=body)
    assert again.headers["Paraplan-Existing-Plan"] == "true" and again.json()["id"] == first.json()["id"]
    other = client.post("/v1/plans", json={**body, "constraints": {"seed": 1}})
    assert other.headers["Paraplan-Existing-Plan"] == "false" and other.json()["id"] != first.json()["id"]


def test_the_form_shows_an_identical_requests_plan_as_made_before(client: Any) -> None:
    form = {"kind": "hybrid", "model": "gpt3-1.3b", "gpu": "A100-80GB", "nodes": "1", "gpus_per_node": "4",
            "global_batch_size": "16", "seq_length": "2048"}
    first = client.post("/plans/new", data=form, follow_redirects=False)
    assert first.status_code == 303 and "existing" not in first.headers["location"]
    again = client.post("/plans/new", data=form, follow_redirects=False)
    assert again.headers["location"] == first.headers["location"] + "?existing=1"
    page = client.get(again.headers["location"]).text
    assert 'id="existing-plan"' in page and "An identical request was submitted before" in page
    assert 'id="existing-plan"' not in client.get(first.headers["location"]).text
