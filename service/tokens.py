"""API tokens: created once (the plaintext is shown once), stored as HMAC-SHA256(pepper, token).

The lookup is by hash (unique index), then the stored hash is compared with ``hmac.compare_digest`` so that
the comparison itself leaks no timing. Tokens are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import ApiToken
from service.errors import Forbidden, Unauthorized
from solvers.errors import SpecError

Scope = Literal["submit", "worker", "read", "admin"]
SCOPES: tuple[str, ...] = get_args(Scope)
_PREFIX = "pp_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token's id and scope (None when the service is open)."""

    token_id: str | None
    scope: str

    @property
    def is_admin(self) -> bool:
        return self.scope == "admin"


ANONYMOUS_OPEN = Principal(None, "admin")
ANONYMOUS_READ = Principal(None, "read")


def missing_token(open_when_no_tokens: bool) -> str:
    """Why a token is asked for, and how to send one (the API was open until a first token was created)."""
    why = "since API tokens exist" if open_when_no_tokens else "(PARAPLAN_OPEN_WHEN_NO_TOKENS is false)"
    return (f"missing bearer token: this service requires one {why}; send 'Authorization: Bearer TOKEN' "
            "(`paraplan token create --scope submit` makes one, `paraplan token list` shows them)")


def hash_token(token: str, pepper: str) -> str:
    return hmac.new(pepper.encode(), token.encode(), hashlib.sha256).hexdigest()


def create_token(session: Session, scope: str, pepper: str, name: str | None = None) -> str:
    """Store a new token's hash and return the plaintext (the only time it exists)."""
    if scope not in SCOPES:
        raise SpecError.at(("scope",), f"unknown scope {scope!r}; expected one of {list(SCOPES)}")
    token = _PREFIX + secrets.token_urlsafe(32)
    session.add(ApiToken(scope=scope, name=name, token_hash=hash_token(token, pepper)))
    return token


def revoke_token(session: Session, token_id: str) -> bool:
    row = session.get(ApiToken, token_id)
    if row is None:
        return False
    row.revoked = True
    return True


@dataclass(frozen=True)
class TokenInfo:
    """What is known of a stored token (never the token: only its hash is stored)."""

    id: str
    scope: str
    name: str | None
    created_at: datetime
    revoked: bool


def list_tokens(session: Session, include_revoked: bool = False) -> list[TokenInfo]:
    """Tokens, oldest first."""
    query = select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked.is_(False))
    return [TokenInfo(t.id, t.scope, t.name, t.created_at, t.revoked) for t in session.execute(query).scalars()]


def active_tokens(session: Session) -> int:
    """Tokens not revoked: while there are none, an open service (open_when_no_tokens) needs no token."""
    return len(session.execute(select(ApiToken.id).where(ApiToken.revoked.is_(False))).all())


def allows(granted: str, required: str) -> bool:
    """admin covers everything; submit and worker tokens may also read."""
    return granted == "admin" or granted == required or (required == "read" and granted in ("submit", "worker"))


class TokenCache:
    """Short-lived cache of token lookups so that hot read paths do not query the token table each time.

    Revocation takes effect within ``ttl_s``."""

    def __init__(self, ttl_s: float = 5.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._by_hash: dict[str, tuple[float, Principal | None]] = {}
        self._any: tuple[float, bool] | None = None

    def principal(self, session: Session, token_hash: str) -> Principal | None:
        now = time.monotonic()
        with self._lock:
            hit = self._by_hash.get(token_hash)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        row = session.execute(select(ApiToken).where(ApiToken.token_hash == token_hash)).scalar_one_or_none()
        found = None
        if row is not None and not row.revoked and hmac.compare_digest(row.token_hash, token_hash):
            found = Principal(row.id, row.scope)
        with self._lock:
            if len(self._by_hash) > 10_000:
                self._by_hash.clear()
            self._by_hash[token_hash] = (now, found)
        return found

    def any_tokens(self, session: Session) -> bool:
        now = time.monotonic()
        with self._lock:
            hit = self._any
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        exists = session.execute(select(ApiToken.id).where(ApiToken.revoked.is_(False)).limit(1)).first() is not None
        if exists:  # (an open answer is not kept: the first token closes the API at once, not ttl_s later)
            with self._lock:
                self._any = (now, exists)
        return exists


def authenticate(session: Session, cache: TokenCache, authorization: str | None, required: str, pepper: str,
                 open_when_no_tokens: bool, read_is_open: bool) -> Principal:
    """Resolve the caller for an endpoint needing ``required`` scope; raise 401/403 errors."""
    token = None
    if authorization:
        kind, _, value = authorization.partition(" ")
        if kind.lower() != "bearer" or not value.strip():
            raise Unauthorized("Authorization header must be 'Bearer <token>'")
        token = value.strip()
    if token is None:
        if required == "read" and read_is_open:
            return ANONYMOUS_READ
        if open_when_no_tokens and not cache.any_tokens(session):
            return ANONYMOUS_OPEN
        raise Unauthorized(missing_token(open_when_no_tokens))
    principal = cache.principal(session, hash_token(token, pepper))
    if principal is None:
        raise Unauthorized("invalid or revoked token")
    if not allows(principal.scope, required):
        raise Forbidden(f"this endpoint needs a token of scope {required!r} (or admin); yours is {principal.scope!r}")
    return principal
