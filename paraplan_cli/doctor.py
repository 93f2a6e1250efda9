"""``paraplan doctor``: check what this installation can do and say what is missing."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def _database() -> list[Check]:
    try:
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory
        from sqlalchemy import create_engine

        from service.db.engine import DatabaseMissing, require_database, shown_url
        from service.migrate import alembic_config
        from service.settings import get_settings
    except ModuleNotFoundError as err:
        return [Check("database", False, f"server extra not installed ({err.name}): pip install 'paraplan[server]'")]
    url = get_settings().database_url
    shown = shown_url(url)  # never print credentials
    try:
        require_database(url)  # (connecting to a missing SQLite file would create an empty one)
    except DatabaseMissing as err:
        return [Check("database", False, str(err))]
    try:
        engine = create_engine(url)
        with engine.connect() as conn:
            current = set(MigrationContext.configure(conn).get_current_heads())
        engine.dispose()
    except Exception as err:  # any driver error means "not reachable"; report it, do not crash
        return [Check("database", False, f"{shown}: cannot connect: {type(err).__name__}: {err}".splitlines()[0])]
    heads = set(ScriptDirectory.from_config(alembic_config(url)).get_heads())
    migrated = current == heads
    return [
        Check("database", True, f"{shown}: reachable"),
        Check("migrations", migrated, "at head" if migrated else
              f"at {sorted(current) or 'nothing'}, head is {sorted(heads)}: run `paraplan db upgrade`"),
    ]


def _cbc() -> Check:
    import pulp

    ok = bool(pulp.PULP_CBC_CMD(msg=False).available())
    return Check("solver CBC (PuLP)", ok, "available" if ok else "CBC binary missing from PuLP", required=False)


def _highs() -> Check:
    try:
        import highspy  # noqa: F401
    except ModuleNotFoundError:
        return Check("solver HiGHS", False, "pip install highspy", required=False)
    return Check("solver HiGHS", True, "highspy importable", required=False)


def _cpsat() -> Check:
    try:
        from ortools.sat.python import cp_model
    except ModuleNotFoundError:
        return Check("solver CP-SAT", False, "pip install ortools")
    model = cp_model.CpModel()
    x = model.new_int_var(0, 3, "x")
    model.maximize(x)
    solver = cp_model.CpSolver()
    status = solver.solve(model)
    ok = status == cp_model.OPTIMAL and solver.value(x) == 3
    return Check("solver CP-SAT", ok, "solves a toy model" if ok else f"status {solver.status_name(status)}")


def _torch() -> list[Check]:
    try:
        torch = importlib.import_module("torch")
    except ModuleNotFoundError:
        return [Check("torch", False, "not installed (needed by the worker): pip install torch", required=False)]
    cuda = bool(torch.cuda.is_available())
    detail = (f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}"
              if cuda else "no CUDA device: the worker runs plans on CPU with gloo")
    nccl = cuda and bool(torch.distributed.is_nccl_available())
    return [
        Check("torch", True, f"{torch.__version__}", required=False),
        Check("CUDA", cuda, detail, required=False),
        Check("NCCL", nccl, "available" if nccl else "not available", required=False),
    ]


CHECKS: list[Callable[[], Check | list[Check]]] = [_database, _cpsat, _highs, _cbc, _torch]


def run_checks() -> list[Check]:
    out: list[Check] = []
    for fn in CHECKS:
        res = fn()
        out.extend(res if isinstance(res, list) else [res])
    return out


def report(checks: list[Check]) -> tuple[str, int]:
    lines = []
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
        lines.append(f"[{mark}] {c.name:<20} {c.detail}")
    failed = [c for c in checks if c.required and not c.ok]
    lines.append("all required checks passed" if not failed else f"{len(failed)} required check(s) failed")
    return "\n".join(lines), 1 if failed else 0
