"""Pure ASGI middleware (no per-request task overhead): body size limit, and request latency + access log with a
request id (taken from a sane ``X-Request-ID`` header or generated, echoed in the response)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.logs import request_id
from service.metrics import Metrics

access_log = logging.getLogger("paraplan.access")
_CLIENT_REQUEST_ID = re.compile(rb"[A-Za-z0-9._\-]{1,64}")


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body exceeds the limit of {limit} bytes (max_body_bytes)"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """413 before parsing: by Content-Length when given, else by counting the streamed body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _send_413(send, self.max_bytes)
                return
        seen = 0
        started = rejected = False

        async def limited_receive() -> Message:
            # Past the limit: answer 413 ourselves and tell the app the client left (an exception here would
            # be turned into a 400 by the framework's body parsing).
            nonlocal seen, rejected
            if rejected:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    rejected = True
                    if not started:
                        await _send_413(send, self.max_bytes)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if rejected:
                return  # the 413 is the response
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with contextlib.suppress(ClientDisconnect):
            await self.app(scope, limited_receive, guarded_send)


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id" and _CLIENT_REQUEST_ID.fullmatch(value):
            return value.decode()
    return uuid.uuid4().hex


def _route_label(scope: Scope) -> str:
    """The route template (bounded label cardinality). Starlette's own routes (/openapi.json, /docs) record
    only their endpoint: their literal path is the label when they have no path parameters."""
    route: Any = scope.get("route")
    if getattr(route, "path", None):
        return str(route.path)
    if scope.get("endpoint") is not None and not scope.get("path_params"):
        return str(scope["path"])
    return "unmatched"


class RequestMetrics:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        rid = _request_id(scope)
        token = request_id.set(rid)

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            elapsed = time.perf_counter() - start
            path = _route_label(scope)
            self.metrics.request_latency.labels(scope["method"], path, str(status)).observe(elapsed)
            # Path ids (plan, run, worker) become log fields so that a run's history can be grepped by its id.
            ids = {k: v for k, v in (scope.get("path_params") or {}).items() if k.endswith("_id")}
            access_log.info("%s %s %d", scope["method"], path, status,
                            extra={"method": scope["method"], "path": scope["path"], "route": path, "status": status,
                                   "duration_ms": round(elapsed * 1000, 2), **ids})
            request_id.reset(token)
