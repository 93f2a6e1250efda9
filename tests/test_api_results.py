"""solvers.api's results are JSON: a number that overflowed is an error naming where, never `Infinity`."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

import solvers.api as api
from solvers.errors import SpecError


@pytest.mark.parametrize(("result", "where"), [
    ({"estimate": {"step_time_s": 1.0, "breakdown_s": {"compute": math.inf}}}, "estimate.breakdown_s.compute"),
    ({"micro_batches": [{"time_s": 1.0}, {"time_s": math.nan}]}, "micro_batches.1.time_s"),
])
def test_a_non_finite_result_is_an_error_naming_where(monkeypatch: Any, result: dict[str, Any], where: str) -> None:
    solver = SimpleNamespace(solve=lambda request, progress=None: result, estimate=lambda request: result)
    monkeypatch.setattr(api, "_module", lambda kind, table=None: solver)
    for call in (api.solve, api.estimate):
        with pytest.raises(SpecError, match="overflowed") as err:
            call({"kind": "hybrid"})
        assert f"({where} is not finite)" in str(err.value)


def test_a_finite_result_passes_unchanged(monkeypatch: Any) -> None:
    result = {"estimate": {"step_time_s": 1e300, "notes": ["inf is a word here"], "fits": True}}
    monkeypatch.setattr(api, "_module", lambda kind, table=None: SimpleNamespace(estimate=lambda request: result))
    assert api.estimate({"kind": "hybrid"}) is result
