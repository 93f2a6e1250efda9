"""Domain errors raised by the service functions, and the ONE table that maps errors to HTTP."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from solvers.errors import FieldProblem, SpecError


class DomainError(Exception):
    """Base of the service's errors; ``detail`` is what the client sees."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(DomainError):
    pass


_Row = TypeVar("_Row")


def get_or_404(session: Session, model: type[_Row], ident: str, what: str) -> _Row:
    """The row with primary key ``ident``, or NotFound naming ``what`` and the id."""
    row = session.get(model, ident)
    if row is None:
        raise NotFound(f"{what} {ident} not found")
    return row


class Conflict(DomainError):
    pass


class NotRunnable(DomainError):
    """A stored plan the worker cannot run exactly; each problem names a field of the plan document."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))
        self.problems = problems


class Unauthorized(DomainError):
    pass


class Forbidden(DomainError):
    pass


class TooLarge(DomainError):
    pass


class Unavailable(DomainError):
    pass


class NotImplementedYet(DomainError):
    pass


# Checked in order; the first class the error is an instance of wins (subclasses before their bases).
HTTP_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (NotFound, 404),
    (NotRunnable, 422),
    (Conflict, 409),
    (sa_exc.IntegrityError, 409),
    (SpecError, 422),
    (Unauthorized, 401),
    (Forbidden, 403),
    (TooLarge, 413),
    (NotImplementedYet, 501),
    (Unavailable, 503),
    # Retryable database trouble: lost connections, pool exhaustion, SQLite "database is locked".
    (sa_exc.OperationalError, 503),
    (sa_exc.DisconnectionError, 503),
    (sa_exc.TimeoutError, 503),
)


def is_retryable_db_error(err: BaseException) -> bool:
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return True
    return isinstance(err, sa_exc.OperationalError | sa_exc.DisconnectionError | sa_exc.TimeoutError)


def http_status(err: BaseException) -> int | None:
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return 503
    for cls, status in HTTP_STATUS:
        if isinstance(err, cls):
            return status
    return None


# Driver messages -> the reason an operator needs (fixed texts: driver messages may carry hosts or SQL).
_DB_REASONS = (
    (("readonly", "read-only", "read only"), "database is read-only"),
    (("disk is full", "no space left", "could not extend file", "disk full"), "database disk is full"),
    (("locked", "busy"), "database is busy (locked)"),
    (("connect", "connection", "server closed", "terminating", "shutting down", "starting up"),
     "database unreachable"),
)


def db_unavailable_reason(err: BaseException) -> str:
    text = str(getattr(err, "orig", None) or err).lower()
    for needles, reason in _DB_REASONS:
        if any(n in text for n in needles):
            return reason
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return "database unreachable"
    return "database temporarily unavailable"


def http_body(err: BaseException, status: int) -> dict[str, Any]:
    if isinstance(err, NotRunnable):  # located in the plan the run would execute, not in the run's body
        return {"detail": [{"loc": ["plan", *p.loc], "msg": p.msg, "type": "value_error"} for p in err.problems]}
    if isinstance(err, SpecError):
        return {"detail": [{"loc": ["body", *p.loc], "msg": p.msg, "type": "value_error"} for p in err.problems]}
    if isinstance(err, DomainError):
        return {"detail": err.detail}
    if status == 409:
        return {"detail": "conflict with stored data"}
    return {"detail": f"{db_unavailable_reason(err)}; retry later"}
