"""Entry points used by the service, the CLI and the worker: ``solve`` and ``estimate``.

Each takes a request document (a dict as in the contract) and returns the result document. Solvers are
imported lazily so that a solver-only install of one kind does not load the others.
"""

from __future__ import annotations

import importlib
import math
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


def non_finite_at(doc: Any, path: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """Where the first infinite or NaN number of a JSON-like document is (None: it has none)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return path
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        if (found := non_finite_at(value, (*path, key))) is not None:
            return found
    return None


def _finite(result: dict[str, Any]) -> dict[str, Any]:
    """The result, if JSON can carry it: a number that overflowed is the request's fault, said as such."""
    where = non_finite_at(result)
    if where is not None:
        raise SpecError.at((), f"the cost model overflowed ({'.'.join(map(str, where))} is not finite): some number "
                               "of the request, or of a profile it names, is beyond what it can price")
    return result


def solve(request: dict[str, Any], progress: Progress | None = None) -> dict[str, Any]:
    """Solve a plan request and return the contract's result object."""
    if not isinstance(request, dict):
        raise SpecError.at((), "request must be a JSON object")
    kind = request.get("kind", "hybrid")
    result: dict[str, Any] = _module(kind).solve(request, progress=progress)
    return _finite(result)


def estimate(request: dict[str, Any]) -> dict[str, Any]:
    """Estimate a given strategy (what-if); returns the contract's ``estimate`` object."""
    if not isinstance(request, dict):
        raise SpecError.at((), "request must be a JSON object")
    kind = request.get("kind", "hybrid")
    result: dict[str, Any] = _module(kind, _ESTIMATORS).estimate(request)
    return _finite(result)


def available_kinds() -> list[str]:
    out = []
    for kind, mod in _SOLVERS.items():
        try:
            importlib.import_module(mod)
            out.append(kind)
        except ModuleNotFoundError:
            pass
    return out
