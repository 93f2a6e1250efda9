"""Shared fixtures: migrated databases (SQLite always, PostgreSQL when PARAPLAN_TEST_DATABASE_URL is set),
an in-process app client, a live uvicorn server subprocess, standalone solver dispatchers and tokens.

PostgreSQL isolation: each pytest session migrates its own schema (``search_path`` in the URL) so that
concurrent test sessions on one server do not collide; each test starts from empty tables.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# what the tests run never reads or writes the user's data directory (the default database lives there)
os.environ["PARAPLAN_DATA_DIR"] = tempfile.mkdtemp(prefix="paraplan-test-data-")
PG_URL = os.environ.get("PARAPLAN_TEST_DATABASE_URL")
TEST_PEPPER = "paraplan-test-pepper"
PARAPLAN = [sys.executable, "-m", "paraplan_cli.main"]
_TABLES = ("idempotency_keys", "runs", "jobs", "plans", "plan_requests", "workers", "profiles", "api_tokens",
           "calibration_sets")


FRAMEWORKS = ROOT / "tests" / "frameworks"
_background: list[subprocess.Popen[bytes]] = []


def _in_frameworks(item: pytest.Item) -> bool:
    return item.path.is_relative_to(FRAMEWORKS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The frameworks' tests last, so that a cold build of their venv (minutes) runs beside the rest."""
    items.sort(key=_in_frameworks)  # stable: each group keeps its order


def pytest_collection_finish(session: pytest.Session) -> None:
    from tests.frameworks.venv import megatron_lm_present, start_background_build

    if session.config.option.collectonly or not megatron_lm_present():
        return
    if any(_in_frameworks(item) for item in session.items):
        _background.append(start_background_build())


def pytest_sessionfinish() -> None:
    for proc in _background:  # an interrupted session: the unfinished build leaves no stamp, the next one rebuilds
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_search_path(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"


def _pg_admin(url: str, sql: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def _pg_session_url() -> Iterator[str]:
    if not PG_URL:
        pytest.skip("PARAPLAN_TEST_DATABASE_URL not set")
    from service.migrate import upgrade

    schema = f"pytest_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    _pg_admin(PG_URL, f"CREATE SCHEMA {schema}")
    url = _with_search_path(PG_URL, schema)
    try:
        upgrade(database_url=url)
        yield url
    finally:
        _pg_admin(PG_URL, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from service.migrate import upgrade

    path = tmp_path_factory.mktemp("db-template") / "template.db"
    upgrade(database_url=f"sqlite:///{path}")
    return path


def reset_postgres(url: str) -> None:
    _pg_admin(url, f"TRUNCATE {', '.join(_TABLES)} CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.skipif(
    not PG_URL, reason="PARAPLAN_TEST_DATABASE_URL not set"))])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database migrated to head and empty: a temp SQLite file, or this session's PostgreSQL schema."""
    if request.param == "sqlite":
        path = tmp_path / "paraplan.db"
        shutil.copy(request.getfixturevalue("_sqlite_template"), path)
        return f"sqlite:///{path}"
    url: str = request.getfixturevalue("_pg_session_url")
    reset_postgres(url)
    return url


@pytest.fixture
def settings(database_url: str) -> Any:
    from service.settings import Settings

    return Settings(database_url=database_url, run_dispatcher=False, token_pepper=TEST_PEPPER,
                    seed_demo_plan=False)


@pytest.fixture
def db(database_url: str) -> Iterator[Any]:
    from service.db.engine import Database

    database = Database.connect(database_url, pool_size=2)
    yield database
    database.dispose()


@pytest.fixture
def client(settings: Any) -> Iterator[Any]:
    """In-process app (no dispatcher) on the test database."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    with TestClient(create_app(settings)) as c:
        yield c


def create_token(database_url: str, scope: str, pepper: str = TEST_PEPPER) -> str:
    """A new API token of ``scope`` in that database (what ``paraplan token create`` does)."""
    from service.db.engine import Database
    from service.tokens import create_token as create

    database = Database.connect(database_url, pool_size=1)
    try:
        with database.writing() as session:
            return create(session, scope, pepper)
    finally:
        database.dispose()


@pytest.fixture
def make_token(database_url: str) -> Callable[[str], str]:
    return lambda scope: create_token(database_url, scope)


def server_env(database_url: str, **settings: Any) -> dict[str, str]:
    env = {**os.environ, "PARAPLAN_DATABASE_URL": database_url, "PARAPLAN_TOKEN_PEPPER": TEST_PEPPER,
           "PARAPLAN_SEED_DEMO_PLAN": "false", "PYTHONPATH": str(ROOT)}
    env.update({f"PARAPLAN_{k.upper()}": str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in settings.items()})
    return env


@dataclass
class LiveServer:
    """``paraplan serve`` in a subprocess on a free loopback port."""

    url: str
    database_url: str
    proc: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def token(self, scope: str) -> str:
        return create_token(self.database_url, scope)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_server(database_url: str, workdir: Path, dispatcher: bool = True, **settings: Any) -> LiveServer:
    import httpx

    port = free_port()
    log = workdir / f"server-{port}.log"
    env = server_env(database_url, **settings)
    args = [*PARAPLAN, "serve", "--host", "127.0.0.1", "--port", str(port)]
    if not dispatcher:
        args.append("--no-dispatcher")
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = LiveServer(f"http://127.0.0.1:{port}", database_url, proc, log, env)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"server did not become ready:\n{server.logs()}")
        time.sleep(0.1)


@pytest.fixture
def live_server_factory(database_url: str, tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Start servers on the test database: ``live_server_factory(dispatcher=False, job_lease_s=2)``."""
    started: list[LiveServer] = []

    def start(dispatcher: bool = True, **settings: Any) -> LiveServer:
        server = start_server(database_url, tmp_path, dispatcher, **settings)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def live_server(live_server_factory: Callable[..., LiveServer]) -> LiveServer:
    """A running ``paraplan serve`` (with its solver dispatcher) on the test database."""
    return live_server_factory()


def start_solver(database_url: str, workdir: Path, *args: str, **settings: Any) -> subprocess.Popen[bytes]:
    """A standalone ``paraplan solver`` process; its stdout ends with a JSON summary line."""
    log = (workdir / f"solver-{uuid.uuid4().hex[:6]}.log").open("wb")
    return subprocess.Popen([*PARAPLAN, "solver", *args], env=server_env(database_url, **settings), cwd=workdir,
                            stdout=subprocess.PIPE, stderr=log, start_new_session=True)
