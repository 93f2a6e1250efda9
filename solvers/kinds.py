"""The plan kinds and the one registry through which the service, the CLI and the dashboard reach them.

Each kind's module (``solvers.<kind>.api``) implements ``SolverKind``: it checks a request before it is
queued, solves it into its typed result document, estimates a given plan and summarises a result for a
terminal. Modules load lazily, so that an install without one kind's dependencies still serves the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol, cast

from solvers.documents import DEFAULT_KIND, PLAN_KINDS, Document, PlanKind, PlanResult
from solvers.errors import SpecError

Progress = Callable[[float, str], None]
"""progress(fraction_done in [0, 1], message) — called by long solves."""


class SolverKind(Protocol):
    """What a plan kind's module provides."""

    def validate(self, request: dict[str, Any]) -> None:
        """Raise SpecError naming each bad field of ``request``: the checks worth making before a solve is queued
        (milliseconds)."""
        ...

    def solve(self, request: dict[str, Any], progress: Progress | None = None) -> PlanResult:
        """The best plan for ``request``: the kind's result document."""
        ...

    def estimate(self, request: dict[str, Any]) -> Document:
        """What a given plan (in the request) costs: the kind's estimate document."""
        ...

    def summarise(self, request: dict[str, Any], result: Any) -> list[str]:
        """The result in a few lines of text: what to run, what it costs, how far from the best."""
        ...


_MODULES: dict[PlanKind, str] = {kind: f"solvers.{kind}.api" for kind in PLAN_KINDS}


def solver_modules() -> list[str]:
    """The kinds' module names (what a process that will solve may import ahead)."""
    return list(_MODULES.values())


class KindUnavailable(Exception):
    """A kind's module failed to load for a reason other than its absence (a broken install)."""


def kind_of(request: Any) -> PlanKind:
    """The request's ``kind`` (default hybrid), or SpecError at ``kind``."""
    if not isinstance(request, dict):
        raise SpecError.at((), "request must be a JSON object")
    kind = request.get("kind", DEFAULT_KIND)
    if not isinstance(kind, str) or kind not in _MODULES:
        raise SpecError.at(("kind",), f"unknown plan kind {kind!r}; expected one of {sorted(_MODULES)}")
    return cast(PlanKind, kind)


def solver_kind(kind: PlanKind) -> SolverKind:
    """The module of ``kind``; SpecError when this install lacks it, KindUnavailable when it fails to load."""
    name = _MODULES[kind]
    try:
        return cast(SolverKind, importlib.import_module(name))
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise SpecError.at(("kind",), f"plan kind {kind!r} is not available here") from None
        raise KindUnavailable(f"solver for {kind!r} failed to load: {err}") from None


def available_kinds() -> list[PlanKind]:
    out = []
    for kind in PLAN_KINDS:
        try:
            solver_kind(kind)
            out.append(kind)
        except (SpecError, KindUnavailable):
            pass
    return out
