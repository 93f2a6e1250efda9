"""Open-loop load test: a fixed request rate of mixed traffic against ``paraplan serve`` (uvicorn, one process,
its dispatcher on) backed by PostgreSQL, in a fresh schema dropped afterwards. Loopback only; bounded count
and time.

Mix (by default): 80 % reads (a plan by id, the plan list, the run list), 17 % cached submits (a request
solved before: answered from the dedupe cache), 3 % new small solves (a new Spindle request: queued, then
solved by the dispatcher). Requests are sent on a fixed schedule whatever the answers' speed, and latency is
measured from the scheduled send time, so a stall shows up in p99 rather than slowing the sender down.

An error is any transport failure, timeout, or status other than the one the route must give (200 for reads
and cached submits, 200/202 for new solves). After the run, the new solves must all succeed (bounded wait).

    .venv/bin/python bench/load.py                     # 200 req/s for 60 s on the local PostgreSQL
    .venv/bin/python bench/load.py --rate 50 --duration 10 --database-url sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.migrate import upgrade  # noqa: E402
from tests.conftest import _pg_admin, _with_search_path, create_token, start_server  # noqa: E402
from tests.service.requests import tiny_spindle  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SEEDED = 20  # distinct plans solved before the clock starts
NEW_SOLVE = "POST /v1/plans (new solve)"


@dataclass
class Sample:
    route: str
    latency_s: float
    ok: bool
    status: int | str


@dataclass
class LoadResult:
    rate: float
    duration_s: float
    samples: list[Sample] = field(default_factory=list)
    sent_s: float = 0.0
    drained: int = 0
    new_solves: int = 0
    drain_s: float = 0.0
    send_lag_s: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    @property
    def errors(self) -> list[Sample]:
        return [s for s in self.samples if not s.ok]

    def table(self) -> str:
        by_route: dict[str, list[Sample]] = defaultdict(list)
        for s in self.samples:
            by_route[s.route].append(s)
        head = f"{'route':<34} {'n':>6} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        lines = [head, "-" * len(head)]
        for route, ss in sorted(by_route.items(), key=lambda kv: -len(kv[1])):
            ms = np.array([s.latency_s for s in ss]) * 1000
            lines.append(f"{route:<34} {len(ss):>6} {sum(not s.ok for s in ss):>6} {np.percentile(ms, 50):>8.1f} "
                         f"{np.percentile(ms, 99):>8.1f} {ms.max():>8.1f}")
        ms = np.array([s.latency_s for s in self.samples]) * 1000
        lines.append(f"{'all':<34} {len(ms):>6} {len(self.errors):>6} {np.percentile(ms, 50):>8.1f} "
                     f"{np.percentile(ms, 99):>8.1f} {ms.max():>8.1f}")
        lines.append(f"offered {self.rate:.0f} req/s for {self.duration_s:.0f} s; achieved "
                     f"{len(self.samples) / self.sent_s:.1f} req/s; new solves succeeded {self.drained}/"
                     f"{self.new_solves} ({self.drain_s:.1f} s after the last request)")
        lag = np.array(self.send_lag_s) * 1000
        lines.append(f"generator send lag p50 {np.percentile(lag, 50):.1f} ms, p99 {np.percentile(lag, 99):.1f} ms; "
                     f"CPU per request: server {1000 * self.server_cpu_s / len(ms):.2f} ms, generator "
                     f"{1000 * self.client_cpu_s / len(ms):.2f} ms; host load average {os.getloadavg()[0]:.1f} "
                     f"on {os.cpu_count()} cores")
        return "\n".join(lines)


def _pick(rng: random.Random, i: int, plan_ids: list[str], new_fraction: float,
          cached_fraction: float) -> tuple[str, str, str, object, tuple[int, ...]]:
    """The i-th request of the mix: (route label, method, path, body, expected statuses)."""
    u = rng.random()
    if u < new_fraction:
        return NEW_SOLVE, "POST", "/v1/plans", tiny_spindle(1000 + i), (200, 202)
    if u < new_fraction + cached_fraction:
        return "POST /v1/plans (cached)", "POST", "/v1/plans", tiny_spindle(rng.randrange(SEEDED)), (200,)
    reads = (u - new_fraction - cached_fraction) / (1 - new_fraction - cached_fraction)
    if reads < 0.5:
        return "GET /v1/plans/{id}", "GET", f"/v1/plans/{rng.choice(plan_ids)}", None, (200,)
    if reads < 0.8:
        return "GET /v1/plans", "GET", "/v1/plans?limit=20", None, (200,)
    return "GET /v1/runs", "GET", "/v1/runs?limit=20", None, (200,)


class Connection:
    """One keep-alive HTTP/1.1 connection with just enough protocol for this load (Content-Length bodies).

    A generic client (httpx) costs ~3 ms of CPU per request; on a 2-core host shared with the server the
    generator then falls behind the schedule and measures itself. This costs a tenth of that."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n".encode() + self.auth
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        self.writer.write(head + b"\r\n" + (body or b""))
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
            status = int(raw[9:12])
            length = 0
            for line in raw.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            payload = await self.reader.readexactly(length)
            if b"connection: close" in raw.lower():
                self.writer.close()
                self.writer = None
            return status, payload
        except BaseException:
            if self.writer is not None:
                self.writer.close()
            self.writer = None  # a half-read response poisons the connection: reconnect on the next request
            raise


async def drive(base: str, token: str, rate: float, duration_s: float, plan_ids: list[str],
                new_fraction: float, cached_fraction: float, concurrency: int = 48, seed: int = 0) -> LoadResult:
    """Open loop with bounded concurrency: request i is due at t0 + i/rate; ``concurrency`` senders (one
    keep-alive connection each) take the next due request in turn. Latency counts from the due time, so a
    slow server shows up as latency even though at most ``concurrency`` requests are in flight."""
    rng = random.Random(seed)
    n = int(rate * duration_s)
    schedule = [_pick(rng, i, plan_ids, new_fraction, cached_fraction) for i in range(n)]
    bodies = [json.dumps(body).encode() if body is not None else None for _, _, _, body, _ in schedule]
    result = LoadResult(rate, duration_s)
    new_ids: list[str] = []
    host, port = base.removeprefix("http://").split(":")
    t0 = time.monotonic() + 0.2
    cpu0 = time.process_time()
    next_index = iter(range(n))

    async def sender() -> None:
        conn = Connection(host, int(port), token)
        for i in next_index:
            route, method, path, _, expect = schedule[i]
            due = t0 + i / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            result.send_lag_s.append(time.monotonic() - due)
            try:
                status_code, payload = await asyncio.wait_for(conn.request(method, path, bodies[i]), 30)
                status: int | str = status_code
                ok = status_code in expect
                if ok and route == NEW_SOLVE:
                    new_ids.append(json.loads(payload)["id"])
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as err:
                status, ok = type(err).__name__, False
            result.samples.append(Sample(route, time.monotonic() - due, ok, status))

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    result.sent_s = time.monotonic() - t0
    result.client_cpu_s = time.process_time() - cpu0
    result.new_solves = len(new_ids)
    async with httpx.AsyncClient(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
        await _drain(client, new_ids, result)
    return result


async def _drain(client: httpx.AsyncClient, new_ids: list[str], result: LoadResult, limit_s: float = 120) -> None:
    """Every new solve must finish: the queue drains within a bounded time."""
    t_end = time.monotonic()
    pending = set(new_ids)
    while pending and time.monotonic() - t_end < limit_s:
        for pid in list(pending):
            status = (await client.get(f"/v1/plans/{pid}")).json()["status"]
            if status == "succeeded":
                result.drained += 1
            if status in ("succeeded", "failed", "cancelled"):
                pending.discard(pid)
                if status != "succeeded":
                    result.samples.append(Sample("solve outcome", 0.0, False, status))
        if pending:
            await asyncio.sleep(0.5)
    result.drain_s = time.monotonic() - t_end
    result.samples.extend(Sample("solve outcome", 0.0, False, f"{pid} not finished") for pid in pending)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(database_url: str, rate: float, duration_s: float, new_fraction: float, cached_fraction: float,
        workdir: Path) -> LoadResult:
    upgrade(database_url=database_url)
    server = start_server(database_url, workdir, dispatcher=True)
    try:
        token = create_token(database_url, "submit")
        with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
            plan_ids = [c.post("/v1/plans?wait=30", json=tiny_spindle(i)).json()["id"] for i in range(SEEDED)]
        cpu0 = _cpu_s(server.proc.pid)
        result = uvloop.run(drive(server.url, token, rate, duration_s, plan_ids, new_fraction, cached_fraction))
        result.server_cpu_s = _cpu_s(server.proc.pid) - cpu0
        return result
    finally:
        server.stop()
        # the server's own view: any 5xx it answered (the client could miss none, but say it from both sides)
        for line in server.logs().splitlines():
            if '"logger": "paraplan.access"' in line and '"status": 5' in line:
                print(f"server 5xx: {line}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0, help="requests per second (open loop)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--new-fraction", type=float, default=0.03, help="share of new small solves")
    ap.add_argument("--cached-fraction", type=float, default=0.17, help="share of cached submits")
    ap.add_argument("--database-url", default=DEFAULT_PG, help="PostgreSQL URL (a fresh schema is made), or 'sqlite'")
    args = ap.parse_args()
    if args.rate * args.duration > 50_000 or args.duration > 600:
        ap.error("bounded: at most 50,000 requests and 600 s")
    with tempfile.TemporaryDirectory(prefix="paraplan-load-") as tmp:
        if args.database_url == "sqlite":
            result = run(f"sqlite:///{tmp}/load.db", args.rate, args.duration, args.new_fraction,
                         args.cached_fraction, Path(tmp))
        else:
            schema = f"load_{uuid.uuid4().hex[:8]}"
            _pg_admin(args.database_url, f"CREATE SCHEMA {schema}")
            try:
                result = run(_with_search_path(args.database_url, schema), args.rate, args.duration,
                             args.new_fraction, args.cached_fraction, Path(tmp))
            finally:
                _pg_admin(args.database_url, f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    print(result.table())
    for s in result.errors[:20]:
        print(f"error: {s.route} -> {s.status}")
    return 1 if result.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
