"""JSON bodies hold finite numbers only.

JSON has no NaN or Infinity, but Python's parser reads them (and 1e999 as infinity). Such a number used to end
as an HTTP 500 (FastAPI's validation error echoes the value and cannot encode it; a plan's canonical JSON
refuses it) or be stored and come back as ``null``. Every API route parses its body once more here and answers
422 naming the field; the validation-error handler also writes a non-finite value it echoes (a query
parameter's) as text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from solvers.api import non_finite_at

MESSAGE = "must be a finite number (JSON has no NaN or Infinity)"


def _json_safe(value: Any) -> Any:
    """``value`` with every non-finite number written as text (``"nan"``, ``"inf"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


class FiniteJSONRoute(APIRoute):
    """An API route whose JSON body may hold no NaN or infinite number (a 422 naming the first)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method in ("POST", "PUT", "PATCH") and "json" in request.headers.get("content-type", ""):
                try:
                    doc = json.loads(await request.body())
                except (ValueError, RecursionError):
                    doc = None  # (not JSON: the route's own parsing answers, as before)
                at = non_finite_at(doc)
                if at is not None:
                    return JSONResponse({"detail": [{"loc": ["body", *at], "msg": MESSAGE, "type": "finite_number"}]},
                                        status_code=422)
            return await handle(request)

        return checked


async def validation_error(_: Request, err: Exception) -> JSONResponse:
    """FastAPI's 422, with the values it echoes made JSON (a NaN query parameter was an HTTP 500)."""
    assert isinstance(err, RequestValidationError)
    return JSONResponse({"detail": _json_safe(jsonable_encoder(err.errors()))}, status_code=422)
