"""The worker's side of the run API (``/v1/workers``, ``/v1/runs``, ``/v1/profiles``) with httpx.

Transient failures (connection errors, timeouts, 429, 5xx) are retried with exponential back-off and full
jitter, Buildkite-agent style; 401/403 raise ``Unauthorized`` (the daemon stops: retrying cannot fix a
revoked token); 409 raises ``LeaseLost`` (another worker owns the run now, or it is over).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import httpx

RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


class WorkerApiError(RuntimeError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


class Unauthorized(WorkerApiError):
    """The token is invalid, revoked or lacks the worker scope."""


class LeaseLost(WorkerApiError):
    """The server says this worker no longer holds the run (409)."""


def backoff_delays(base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None
                   ) -> Callable[[int], float]:
    """Delay before retry n (0-based): uniform in [0, min(cap, base * 2^n)] ("full jitter")."""
    r = rng or random.Random()
    return lambda n: r.uniform(0.0, min(cap_s, base_s * 2.0**n))


class WorkerApi:
    def __init__(self, server: str, token: str, timeout_s: float = 10.0, max_retry_s: float = 300.0,
                 sleep: Callable[[float], object] = time.sleep, delays: Callable[[int], float] | None = None,
                 transport: httpx.BaseTransport | None = None, cancelled: Callable[[], bool] = lambda: False
                 ) -> None:
        self.http = httpx.Client(base_url=server.rstrip("/") + "/v1", timeout=timeout_s, transport=transport,
                                 headers={"Authorization": f"Bearer {token}", "User-Agent": "paraplan-worker"})
        self.max_retry_s, self.sleep = max_retry_s, sleep
        self.delays = delays or backoff_delays()
        self.cancelled = cancelled  # stop retrying (the daemon is shutting down)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, json: dict[str, Any] | None = None, timeout_s: float | None = None,
                retry: bool = True) -> httpx.Response:
        """One call, retried while the failure is transient and ``max_retry_s`` is not used up."""
        started, attempt, waited = time.monotonic(), 0, 0.0
        while True:
            try:
                resp = self.http.request(method, path, json=json,
                                         timeout=timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT)
                if resp.status_code not in RETRYABLE_STATUS:
                    return self._check(resp)
                error: Exception = WorkerApiError(resp.status_code, resp.text[:200])
            except httpx.TransportError as err:
                error = err
            delay = self.delays(attempt)
            spent = max(time.monotonic() - started, waited)  # the back-off counts even when sleep is faked
            if not retry or self.cancelled() or spent + delay > self.max_retry_s:
                raise error
            self.sleep(delay)
            waited += delay
            attempt += 1

    @staticmethod
    def _check(resp: httpx.Response) -> httpx.Response:
        if resp.status_code < 400:
            return resp
        try:
            detail = str(resp.json().get("detail", resp.text))
        except ValueError:
            detail = resp.text
        if resp.status_code in (401, 403):
            raise Unauthorized(resp.status_code, detail)
        if resp.status_code == 409:
            raise LeaseLost(resp.status_code, detail)
        raise WorkerApiError(resp.status_code, detail)

    # --- endpoints ---------------------------------------------------------------------------------
    def register(self, info: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.request("POST", "/workers/register", json=info).json()
        return out

    def worker_heartbeat(self, worker_id: str) -> None:
        self.request("POST", f"/workers/{worker_id}/heartbeat", retry=False)

    def claim(self, worker_id: str, wait_s: float, endpoint: str | None = None) -> dict[str, Any] | None:
        body: dict[str, Any] = {"worker_id": worker_id, "wait_s": wait_s}
        if endpoint:
            body["endpoint"] = endpoint
        resp = self.request("POST", "/runs/claim", json=body, timeout_s=wait_s + 15.0)
        if resp.status_code == 204:
            return None
        run: dict[str, Any] = resp.json()["run"]
        return run

    def run_heartbeat(self, run_id: str, worker_id: str) -> None:
        self.request("POST", f"/runs/{run_id}/heartbeat", json={"worker_id": worker_id}, retry=False)

    def report_step(self, run_id: str, worker_id: str, step: dict[str, Any]) -> None:
        self.request("POST", f"/runs/{run_id}/metrics", json={"worker_id": worker_id, **step})

    def complete(self, run_id: str, worker_id: str, metrics: dict[str, Any]) -> None:
        self.request("POST", f"/runs/{run_id}/complete", json={"worker_id": worker_id, "metrics": metrics})

    def fail(self, run_id: str, worker_id: str, error: str, retryable: bool) -> None:
        self.request("POST", f"/runs/{run_id}/fail",
                     json={"worker_id": worker_id, "error": error[-20000:] or "failed", "retryable": retryable})

    def upload_profile(self, name: str, kind: str, host: str, data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.request("POST", "/profiles",
                                           json={"name": name, "kind": kind, "host": host, "data": data}).json()
        return out
