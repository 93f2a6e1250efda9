"""Service latency under load: GET /v1/plans/{id} and a cached POST /v1/plans at a fixed request rate.

    .venv/bin/python bench/service.py [--rate 200] [--duration 30] [--db sqlite,postgresql]

For each database it migrates a fresh one (SQLite: a temp file; PostgreSQL: a throwaway schema in
PARAPLAN_BENCH_DATABASE_URL or PARAPLAN_TEST_DATABASE_URL), starts ``paraplan serve`` (uvicorn, one process,
its dispatcher on, as ``make run``), has the plan solved once, then drives each endpoint open-loop from an
async httpx client on loopback: request i is due at start + i/rate, and its latency counts from that due
time (queueing behind a slow response is not hidden). "send lag" is how late the generator itself got to
send: when it is as large as the latency, the host starved the generator too, not just the server.
CPU per request (server process and generator) shows the headroom independent of other load on the host.
Goal (issue 7): p99 <= 20 ms for GET and <= 50 ms for
the cached POST at 200 req/s for 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REQUEST = {"kind": "hybrid", "model": {"preset": "llama2-7b"},
           "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
           "training": {"global_batch_size": 64, "seq_length": 2048}}
GOALS_MS = {"GET /v1/plans/{id}": 20.0, "POST /v1/plans (cached)": 50.0}


@dataclass
class Result:
    db: str
    scenario: str
    sent: int
    ok: int
    errors: int
    seconds: float
    latencies_ms: np.ndarray
    server_cpu_ms: float  # server process CPU per request
    client_cpu_ms: float  # load generator CPU per request
    send_lag_ms: np.ndarray  # how late the generator itself sent each request (its own CPU starvation)

    def row(self) -> list[str]:
        lat = self.latencies_ms
        p50, p90, p99 = (np.percentile(lat, q) if len(lat) else float("nan") for q in (50, 90, 99))
        goal = GOALS_MS[self.scenario]
        verdict = "ok" if p99 <= goal and self.errors == 0 else "MISS"
        return [self.db, self.scenario, f"{self.sent / self.seconds:.0f}", str(self.ok), str(self.errors),
                f"{p50:.1f}", f"{p90:.1f}", f"{p99:.1f}", f"{lat.max() if len(lat) else float('nan'):.1f}",
                f"{goal:.0f}", f"{self.server_cpu_ms:.2f}", f"{self.client_cpu_ms:.2f}",
                f"{np.percentile(self.send_lag_ms, 99) if len(self.send_lag_ms) else float('nan'):.1f}", verdict]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_token(url: str, scope: str, pepper: str) -> str:
    from service.db.engine import Database
    from service.tokens import create_token as create

    db = Database.connect(url, pool_size=1)
    try:
        with db.writing() as session:
            return create(session, scope, pepper)
    finally:
        db.dispose()


class Server:
    def __init__(self, url: str, workdir: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.pepper = uuid.uuid4().hex
        env = {**os.environ, "PARAPLAN_DATABASE_URL": url, "PARAPLAN_TOKEN_PEPPER": self.pepper,
               "PARAPLAN_SEED_DEMO_PLAN": "false", "PYTHONPATH": str(ROOT)}
        self.log = (workdir / "server.log").open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "paraplan_cli.main", "serve", "--host", "127.0.0.1",
                                      "--port", str(self.port)], env=env, cwd=workdir, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"server did not start; see {workdir / 'server.log'}")

    def cpu_s(self) -> float:
        """CPU seconds used so far by the server process (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


async def drive(client: httpx.AsyncClient, method: str, path: str, body: Any, rate: float,
                duration: float, expect: int, concurrency: int = 32,
                max_lag_s: float = 5.0) -> tuple[int, int, float, list[float], list[float]]:
    """Open loop with bounded concurrency: request i is due at t0 + i/rate and its latency counts from that
    due time, so queueing behind slow responses is measured, not hidden. At most ``concurrency`` requests
    are in flight; a request more than ``max_lag_s`` behind schedule is dropped and counted as an error
    (the run stays bounded in time even when the server cannot keep up)."""
    n = int(rate * duration)
    latencies: list[float] = []
    send_lags: list[float] = []
    errors = 0
    next_i = 0
    # One prepared request, sent again and again: the generator's own CPU per request stays small (it shares
    # the cores with the server).
    request = client.build_request(method, path, json=body, timeout=10.0)
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05

    async def worker() -> None:
        nonlocal errors, next_i
        while next_i < n:
            i, next_i = next_i, next_i + 1
            due = t0 + i / rate
            now = loop.time()
            if now - due > max_lag_s:
                errors += 1
                continue
            if due > now:
                await asyncio.sleep(due - now)
            send_lags.append((loop.time() - due) * 1000)
            try:
                r = await client.send(request)
                if r.status_code == expect:
                    latencies.append((loop.time() - due) * 1000)
                else:
                    errors += 1
            except httpx.HTTPError:
                errors += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n, errors, loop.time() - t0, latencies, send_lags


async def bench_server(server: Server, db_name: str, url: str, rate: float, duration: float) -> list[Result]:
    token = create_token(url, "submit", server.pepper)
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=server.base, headers=headers, limits=limits) as client:
        r = await client.post("/v1/plans", params={"wait": 120}, json=REQUEST, timeout=150)
        if r.status_code != 200 or r.json()["status"] != "succeeded":
            raise RuntimeError(f"the plan was not solved: {r.status_code} {r.text[:300]}")
        plan_id = r.json()["id"]
        for _ in range(50):  # warm the connection pool and code paths
            await client.get(f"/v1/plans/{plan_id}")
            await client.post("/v1/plans", json=REQUEST)
        results = []
        for scenario, method, path, body in (("GET /v1/plans/{id}", "GET", f"/v1/plans/{plan_id}", None),
                                             ("POST /v1/plans (cached)", "POST", "/v1/plans", REQUEST)):
            server_cpu, client_cpu = server.cpu_s(), time.process_time()
            n, errors, seconds, lat, lags = await drive(client, method, path, body, rate, duration, 200)
            server_cpu, client_cpu = server.cpu_s() - server_cpu, time.process_time() - client_cpu
            results.append(Result(db_name, scenario, n, len(lat), errors, seconds, np.array(lat),
                                  1000 * server_cpu / n, 1000 * client_cpu / n, np.array(lags)))
            print("  ".join(results[-1].row()), file=sys.stderr, flush=True)
    return results


def run_one(db_name: str, rate: float, duration: float) -> list[Result]:
    from service.migrate import upgrade

    workdir = Path(tempfile.mkdtemp(prefix=f"paraplan-bench-{db_name}-"))
    schema_url, cleanup = None, None
    try:
        if db_name == "sqlite":
            url = f"sqlite:///{workdir / 'bench.db'}"
        else:
            base = os.environ.get("PARAPLAN_BENCH_DATABASE_URL") or os.environ.get("PARAPLAN_TEST_DATABASE_URL")
            if not base:
                print("postgresql: skipped (set PARAPLAN_BENCH_DATABASE_URL)", file=sys.stderr)
                return []
            import sqlalchemy as sa

            schema = f"bench_{uuid.uuid4().hex[:8]}"
            admin = sa.create_engine(base, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
            with admin.connect() as conn:
                conn.exec_driver_sql(f"CREATE SCHEMA {schema}")

            def cleanup() -> None:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                admin.dispose()

            url = schema_url = f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"
        upgrade(database_url=url)
        server = Server(url, workdir)
        try:
            return asyncio.run(bench_server(server, db_name, schema_url or url, rate, duration))
        finally:
            server.stop()
    finally:
        if cleanup is not None:
            cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per scenario")
    parser.add_argument("--db", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    args = parser.parse_args()
    results: list[Result] = []
    load_before = os.getloadavg()[0]
    for db_name in args.db.split(","):
        results += run_one(db_name.strip(), args.rate, args.duration)
    header = ["db", "scenario", "req/s", "ok", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms", "goal p99",
              "server cpu ms/req", "client cpu ms/req", "send lag p99 ms", "verdict"]
    rows = [header, *(r.row() for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print(f"service latency, open loop at {args.rate:g} req/s for {args.duration:g} s per scenario "
          f"({os.cpu_count()} CPUs; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after)")
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
