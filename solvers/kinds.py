"""The plan kinds and the one registry through which the service, the CLI and the dashboard reach them.

Each kind's module (``solvers.<kind>.api``) implements ``SolverKind``: it checks a request before it is
queued, solves it into its typed result document, estimates a given plan and summarises a result for a
terminal. Modules load lazily (a process imports only the kinds it uses). A kind whose module fails to load is
a broken install and says so with its import error, unless the kind is declared optional (``OPTIONAL_KINDS``).
"""

from __future__ import annotations

import importlib
import logging
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

OPTIONAL_KINDS: frozenset[PlanKind] = frozenset()
"""Kinds an install may lack without being broken: left out of ``available_kinds`` (logged, and listed by
``kind_load_errors``) instead of raising. None today: every kind's dependencies (numpy, pulp, ortools, highspy)
are core dependencies, so a kind that fails to load is a broken install."""

log = logging.getLogger(__name__)


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
        raise KindUnavailable(f"solver for {kind!r} failed to load: {err}") from err
    except ImportError as err:
        raise KindUnavailable(f"solver for {kind!r} failed to load: {err}") from err


def kind_load_errors() -> dict[PlanKind, str]:
    """Each kind whose module does not load here, with the error (empty on a whole install)."""
    out: dict[PlanKind, str] = {}
    for kind in PLAN_KINDS:
        try:
            solver_kind(kind)
        except (SpecError, KindUnavailable) as err:
            out[kind] = str(err)
    return out


def available_kinds() -> list[PlanKind]:
    """The kinds this install serves. A kind that fails to load raises KindUnavailable with its import error; only a
    kind in ``OPTIONAL_KINDS`` is left out instead, with a warning naming the error."""
    errors = kind_load_errors()
    broken = {kind: why for kind, why in errors.items() if kind not in OPTIONAL_KINDS}
    if broken:
        raise KindUnavailable("; ".join(broken.values()))
    for kind, why in errors.items():
        log.warning("optional plan kind %s left out: %s", kind, why)
    return [kind for kind in PLAN_KINDS if kind not in errors]
