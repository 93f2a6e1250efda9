"""Up-front checks on a plan or estimate request, so that bad input is a 422/413 and never a stored job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.errors import Unavailable
from service.limits import check_limits
from service.settings import Settings
from solvers import kinds
from solvers.documents import PlanKind
from solvers.errors import SpecError
from solvers.kinds import SolverKind, kind_of

__all__ = ["available_kinds", "check_file_references", "kind_of", "solver_module", "validate_plan_request"]


def available_kinds() -> list[PlanKind]:
    """The kinds served here; a kind that fails to load is a 503 naming its import error (never a hidden kind)."""
    try:
        return kinds.available_kinds()
    except kinds.KindUnavailable as err:
        raise Unavailable(str(err)) from None


def solver_module(kind: PlanKind) -> SolverKind:
    try:
        return kinds.solver_kind(kind)
    except kinds.KindUnavailable as err:
        raise Unavailable(str(err)) from None


_FILE_FIELDS = (("strategy", "path"), ("cost_model", "profiles_dir"), ("cost_model", "hardware_dir"),
                ("cost_model", "profile_path"))


def _named_paths(request: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """(field, path) of every file or directory the request names; a field may hold a list of them (Galvatron's
    hardware_dir is searched in order)."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    for section, key in _FILE_FIELDS:
        part = request.get(section)
        value = part.get(key) if isinstance(part, dict) else None
        if isinstance(value, str):
            out.append(((section, key), value))
        elif isinstance(value, list):
            out += [((section, key, i), v) for i, v in enumerate(value) if isinstance(v, str)]
    return [(loc, v) for loc, v in out if v]


def check_file_references(request: dict[str, Any], settings: Settings) -> None:
    """Paths a request names must lie under one of ``settings.data_roots`` (422 naming the field)."""
    roots = [Path(r).resolve() for r in settings.data_roots]
    profiles_dir = (request.get("cost_model") or {}).get("profiles_dir") if isinstance(
        request.get("cost_model"), dict) else None
    for loc, value in _named_paths(request):
        path = Path(value)
        if loc == ("strategy", "path"):
            from solvers.cost_model.api import galvatron_plan_file

            # the file the cost model will read: a relative path missing under profiles_dir falls back to the
            # working directory, which checking profiles_dir/path alone let through
            path = galvatron_plan_file(value, profiles_dir)
        resolved = path.resolve()
        if not any(resolved.is_relative_to(root) for root in roots):
            allowed = ", ".join(str(r) for r in roots) or "none configured"
            raise SpecError.at(loc, f"this server reads files only under its data roots ({allowed}; "
                                    "PARAPLAN_DATA_ROOTS)")


def validate_plan_request(request: Any, settings: Settings) -> str:
    """Return the request's kind; raise SpecError (422) or TooLarge (413) for what can be checked now."""
    kind = kind_of(request)
    check_limits(request, settings)
    check_file_references(request, settings)
    # the kind's own cheap check, so that a bad request is a 422 now rather than a failed job later
    solver_module(kind).validate(request)
    return kind
