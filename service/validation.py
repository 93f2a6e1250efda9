"""Up-front checks on a plan or estimate request, so that bad input is a 422/413 and never a stored job."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from service.errors import Unavailable
from service.limits import check_limits
from service.settings import Settings
from solvers.errors import SpecError
from solvers.request import HybridRequest, parse

KINDS: dict[str, str] = {"hybrid": "solvers.hybrid.api", "flexsp": "solvers.flexsp.api",
                         "spindle": "solvers.spindle.api"}


def kind_of(request: Any) -> str:
    if not isinstance(request, dict):
        raise SpecError.at((), "request must be a JSON object")
    kind = request.get("kind", "hybrid")
    if not isinstance(kind, str) or kind not in KINDS:
        raise SpecError.at(("kind",), f"unknown plan kind {kind!r}; expected one of {sorted(KINDS)}")
    return str(kind)


def solver_module(kind: str) -> Any:
    try:
        return importlib.import_module(KINDS[kind])
    except ModuleNotFoundError as err:
        if err.name and KINDS[kind].startswith(err.name):
            raise SpecError.at(("kind",), f"plan kind {kind!r} is not available on this server") from None
        raise Unavailable(f"solver for {kind!r} failed to load: {err}") from None


def available_kinds() -> list[str]:
    out = []
    for kind in KINDS:
        try:
            solver_module(kind)
            out.append(kind)
        except (SpecError, Unavailable):
            pass
    return out


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
    module = solver_module(kind)
    # The kind's own cheap check when it has one (``validate``, else its request parser), so that a bad
    # request is a 422 now rather than a failed job later.
    check = getattr(module, "validate", None) or getattr(module, "parse_request", None)
    if callable(check):
        check(request)
    elif kind == "hybrid":
        parse(HybridRequest, request)
    return kind
