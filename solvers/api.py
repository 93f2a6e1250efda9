"""Entry points used by the service, the CLI and the worker: ``solve`` and ``estimate``.

Each takes a request document (a dict as in the contract) and returns the kind's typed document
(``solvers.documents``); ``.to_json()`` gives the contract's JSON object.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from solvers.documents import Document, PlanResult
from solvers.errors import SpecError
from solvers.kinds import Progress, available_kinds, kind_of, solver_kind

D = TypeVar("D", bound=Document)

__all__ = ["Progress", "available_kinds", "estimate", "non_finite_at", "solve", "validate"]


def non_finite_at(doc: Any, path: tuple[str | int, ...] = ()) -> tuple[str | int, ...] | None:
    """Where the first infinite or NaN number of a JSON-like document is (None: it has none)."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return path
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        if (found := non_finite_at(value, (*path, key))) is not None:
            return found
    return None


# The request's sections whose numbers the cost models price, the likeliest culprit first: what an overflow is
# reported on (the first one the request has; ``cluster`` every kind has).
_PRICED_SECTIONS = ("cost_model", "model", "workload", "batch", "training", "cluster")


def _priced_section(request: Any) -> tuple[str]:
    present = request if isinstance(request, dict) else {}
    return next(((key,) for key in _PRICED_SECTIONS if key in present), ("cluster",))


def _finite(request: Any, result: D) -> D:
    """The result, if JSON can carry it: a number that overflowed is the request's fault, said as such.

    Only plan figures can be non-finite here: the kinds report a diagnostic they could not price (a search
    candidate over memory) as absent, so a valid plan is never refused for one."""
    where = non_finite_at(result.model_dump())  # (JSON mode would write inf as null)
    if where is not None:
        raise SpecError.at(_priced_section(request),
                           f"the cost model overflowed (the result's {'.'.join(map(str, where))} is not finite): "
                           "some number of the request, or of a profile it names, is beyond what it can price")
    return result


def validate(request: dict[str, Any]) -> None:
    """The request's cheap checks (SpecError naming each bad field), before a solve is queued."""
    solver_kind(kind_of(request)).validate(request)


def solve(request: dict[str, Any], progress: Progress | None = None) -> PlanResult:
    """Solve a plan request: the kind's result document."""
    return _finite(request, solver_kind(kind_of(request)).solve(request, progress=progress))


def estimate(request: dict[str, Any]) -> Document:
    """Estimate a given strategy (what-if): the kind's estimate document."""
    return _finite(request, solver_kind(kind_of(request)).estimate(request))
