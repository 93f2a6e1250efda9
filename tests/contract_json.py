"""The public entry points as a client of the contract reads them: the JSON object of each typed document.

Tests that assert on the contract's field names go through these; tests of the typed documents themselves
call ``solvers.api`` directly."""

from __future__ import annotations

from typing import Any

from solvers import api
from solvers.hybrid import api as hybrid_api
from solvers.spindle import api as spindle_api


def solve(request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return api.solve(request, **kwargs).to_json()


def estimate(request: dict[str, Any]) -> dict[str, Any]:
    return api.estimate(request).to_json()


def solve_hybrid(request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """``solvers.hybrid.api.solve`` (planner options, no finite check) as JSON."""
    return hybrid_api.solve(request, **kwargs).to_json()


def solve_spindle(request: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return spindle_api.solve(request, **kwargs).to_json()
