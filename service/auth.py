"""Route dependencies that resolve the caller's token to a Principal of the required scope."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, Header

from service.context import ServiceContext, get_context
from service.tokens import Principal, authenticate


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    """Dependency: a caller allowed to use ``scope`` (401 without a valid token, 403 with too small a scope)."""

    # Runs on the event loop: a token cache hit touches no database (the session never connects), which
    # keeps hot paths free of thread hops; a miss (once per token per cache TTL) queries by a unique index.
    async def dependency(ctx: ServiceContext = Depends(get_context),
                         authorization: str | None = Header(None, include_in_schema=False)) -> Principal:
        s = ctx.settings
        with ctx.db.reading() as session:
            return authenticate(session, ctx.tokens, authorization, scope, s.token_pepper, s.open_when_no_tokens,
                                read_is_open=not s.require_read_token)

    return dependency


ReadAccess = Depends(require("read"))
SubmitAccess = Depends(require("submit"))
WorkerAccess = Depends(require("worker"))
AdminAccess = Depends(require("admin"))
