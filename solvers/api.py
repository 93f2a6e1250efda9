"""Entry points used by the service, the CLI and the worker: ``solve`` and ``estimate``.

Each takes a request document (a dict as in the contract) and returns the result document. Solvers are
imported lazily so that a solver-only install of one kind does not load the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from solvers.errors import SpecError

Progress = Callable[[float, str], None]
"""progress(fraction_done in [0, 1], message) — called by long solves."""

_SOLVERS = {
    "hybrid": "solvers.hybrid.api",
    "flexsp": "solvers.flexsp.api",
    "spindle": "solvers.spindle.api",
}
# What-if estimates of a given strategy. Hybrid estimates are the cost model's own business.
_ESTIMATORS = {**_SOLVERS, "hybrid": "solvers.cost_model.api"}


def _module(kind: str, table: dict[str, str] = _SOLVERS) -> Any:
    if not isinstance(kind, str) or kind not in table:
        raise SpecError.at(("kind",), f"unknown plan kind {kind!r}; expected one of {sorted(table)}")
    try:
        return importlib.import_module(table[kind])
    except ModuleNotFoundError as err:  # a kind whose solver is not built yet
        raise SpecError.at(("kind",), f"plan kind {kind!r} is not available: {err}") from None


def solve(request: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
    """Solve a plan request and return the contract's result object."""
    if not isinstance(request, dict):
        raise SpecError.at((), "request must be a JSON object")
    kind = request.get("kind", "hybrid")
    result: dict[str, Any] = _module(kind).solve(request, progress=progress)
    return result


def estimate(request: dict[str, Any]) -> dict[str, Any]:
    """Estimate a given strategy (what-if); returns the contract's ``estimate`` object."""
    if not isinstance(request, dict):
        raise SpecError.at((), "request must be a JSON object")
    kind = request.get("kind", "hybrid")
    result: dict[str, Any] = _module(kind, _ESTIMATORS).estimate(request)
    return result


def available_kinds() -> list[str]:
    out = []
    for kind, mod in _SOLVERS.items():
        try:
            importlib.import_module(mod)
            out.append(kind)
        except ModuleNotFoundError:
            pass
    return out
