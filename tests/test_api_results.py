"""solvers.api's results are JSON: a number that overflowed is an error naming where, never `Infinity`, reported on
a field the request has."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ConfigDict

import solvers.api as api
from solvers.documents import ResultDocument
from solvers.errors import SpecError


class _Result(ResultDocument):
    """A document of any fields, standing in for a kind's."""

    model_config = ConfigDict(extra="allow")
    kind: str = "hybrid"


@pytest.mark.parametrize(("result", "where"), [
    ({"estimate": {"step_time_s": 1.0, "breakdown_s": {"compute": math.inf}}}, "estimate.breakdown_s.compute"),
    ({"micro_batches": [{"time_s": 1.0}, {"time_s": math.nan}]}, "micro_batches.1.time_s"),
])
@pytest.mark.parametrize(("request_", "field"), [
    ({"kind": "hybrid", "cluster": {}, "model": {}, "training": {}}, "model"),
    ({"kind": "hybrid", "cluster": {}, "model": {}, "cost_model": {"kind": "analytic"}}, "cost_model"),
    ({"kind": "spindle", "cluster": {}, "workload": {}}, "workload"),
    ({"kind": "flexsp", "cluster": {}}, "cluster"),
])
def test_a_non_finite_result_is_an_error_naming_where(monkeypatch: Any, result: dict[str, Any], where: str,
                                                      request_: dict[str, Any], field: str) -> None:
    doc = _Result.model_validate(result)
    solver = SimpleNamespace(solve=lambda request, progress=None: doc, estimate=lambda request: doc)
    monkeypatch.setattr(api, "solver_kind", lambda kind: solver)
    for call in (api.solve, api.estimate):
        with pytest.raises(SpecError, match="overflowed") as err:
            call(request_)
        assert f"(the result's {where} is not finite)" in str(err.value)
        # (the location was empty: the CLI printed ": the cost model overflowed", the API a loc of [])
        assert [p.loc for p in err.value.problems] == [(field,)] and field in request_


def test_an_absent_diagnostic_is_no_error(monkeypatch: Any) -> None:
    """A search candidate the solver could not price is absent (null), and the plan stands."""
    result = _Result.model_validate({"estimate": {"step_time_s": 2.0}, "search": {"candidates": {"a": 2.0, "b": None}}})
    monkeypatch.setattr(api, "solver_kind", lambda kind: SimpleNamespace(solve=lambda request, progress=None: result))
    assert api.solve({"kind": "hybrid"}) is result


def test_a_finite_result_passes_unchanged(monkeypatch: Any) -> None:
    result = _Result.model_validate({"estimate": {"step_time_s": 1e300, "notes": ["inf is a word here"], "fits": True}})
    monkeypatch.setattr(api, "solver_kind", lambda kind: SimpleNamespace(estimate=lambda request: result))
    assert api.estimate({"kind": "hybrid"}) is result
