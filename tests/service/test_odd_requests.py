"""Odd requests found by fuzzing the estimate and plan endpoints: each gets its result or a 422 naming the
field, never a 500."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.requests import REQUESTS

pytestmark = pytest.mark.db
HYBRID = REQUESTS["hybrid"]


def test_estimate_shorthand_with_null_fields(client: Any) -> None:
    """A null field is an absent one (it crashed the shorthand's parser)."""
    given = {"tp": 2, "pp": 2, "micro_batch_size": 2}
    for key in ("tp", "dp", "zero", "virtual_stages", "micro_batches", "ep"):
        absent = {k: v for k, v in given.items() if k != key}
        expected = client.post("/v1/estimate", json={**HYBRID, "strategy": absent})
        r = client.post("/v1/estimate", json={**HYBRID, "strategy": {**given, key: None}})
        assert r.status_code == expected.status_code == 200, (key, r.text)
        assert r.json()["step_time_s"] == expected.json()["step_time_s"]
