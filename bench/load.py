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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.migrate import upgrade  # noqa: E402
from tests.conftest import _pg_admin, _with_search_path, create_token, start_server  # noqa: E402
from tests.service.requests import tiny_spindle  # noqa: E402

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SEEDED = 20  # distinct plans solved before the clock starts


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
        return "\n".join(lines)


async def _one(client: httpx.AsyncClient, at: float, route: str, method: str, url: str, json: object,
               expect: tuple[int, ...], out: list[Sample], new_ids: list[str]) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    try:
        r = await client.request(method, url, json=json)
        status: int | str = r.status_code
        ok = r.status_code in expect
        if ok and route == "POST /v1/plans (new solve)":
            new_ids.append(r.json()["id"])
    except httpx.HTTPError as err:
        status, ok = type(err).__name__, False
    out.append(Sample(route, time.monotonic() - at, ok, status))


async def drive(base: str, token: str, rate: float, duration_s: float, plan_ids: list[str],
                new_fraction: float, cached_fraction: float, seed: int = 0) -> LoadResult:
    rng = random.Random(seed)
    result = LoadResult(rate, duration_s)
    new_ids: list[str] = []
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits,
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        t0 = time.monotonic() + 0.2
        tasks = []
        for i in range(int(rate * duration_s)):
            u = rng.random()
            if u < new_fraction:
                spec = ("POST /v1/plans (new solve)", "POST", "/v1/plans", tiny_spindle(1000 + i), (200, 202))
            elif u < new_fraction + cached_fraction:
                spec = ("POST /v1/plans (cached)", "POST", "/v1/plans", tiny_spindle(rng.randrange(SEEDED)), (200,))
            elif u < 0.55:
                spec = ("GET /v1/plans/{id}", "GET", f"/v1/plans/{rng.choice(plan_ids)}", None, (200,))
            elif u < 0.8:
                spec = ("GET /v1/plans", "GET", "/v1/plans?limit=20", None, (200,))
            else:
                spec = ("GET /v1/runs", "GET", "/v1/runs?limit=20", None, (200,))
            tasks.append(asyncio.create_task(_one(client, t0 + i / rate, *spec, result.samples, new_ids)))
        await asyncio.gather(*tasks)
        result.sent_s = time.monotonic() - t0
        result.new_solves = len(new_ids)
        # every new solve must finish: the queue drains within a bounded time
        t_end = time.monotonic()
        pending = set(new_ids)
        while pending and time.monotonic() - t_end < 120:
            for pid in list(pending):
                r = await client.get(f"/v1/plans/{pid}")
                if r.json()["status"] == "succeeded":
                    pending.discard(pid)
                elif r.json()["status"] in ("failed", "cancelled"):
                    result.samples.append(Sample("solve outcome", 0.0, False, r.json()["status"]))
                    pending.discard(pid)
            if pending:
                await asyncio.sleep(0.5)
        result.drained = len(new_ids) - len(pending) - sum(s.route == "solve outcome" for s in result.samples)
        result.drain_s = time.monotonic() - t_end
        result.samples.extend(Sample("solve outcome", 0.0, False, f"{pid} not finished") for pid in pending)
    return result


def run(database_url: str, rate: float, duration_s: float, new_fraction: float, cached_fraction: float,
        workdir: Path) -> LoadResult:
    upgrade(database_url=database_url)
    server = start_server(database_url, workdir, dispatcher=True)
    try:
        token = create_token(database_url, "submit")
        with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
            plan_ids = [c.post("/v1/plans?wait=30", json=tiny_spindle(i)).json()["id"] for i in range(SEEDED)]
        return asyncio.run(drive(server.url, token, rate, duration_s, plan_ids, new_fraction, cached_fraction))
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
