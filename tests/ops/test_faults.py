"""Fault tests with real processes: the service SIGKILLed mid-solve, PostgreSQL restarted under an idle service,
and a database that cannot be written (read-only, or its disk full). Nothing is lost, nothing is corrupted, and
the service says what is wrong (503 with a reason) instead of failing with a 500.

Disk full is a real full filesystem: a 4 MiB tmpfs holding the SQLite database, filled up with a ballast file
(needs root to mount; skipped otherwise). Read-only is the database opened through a read-only SQLite URI
(``file:...?mode=ro``), which is what the service sees when its volume is remounted read-only.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import PG_URL, LiveServer, _pg_admin, _with_search_path, start_server
from tests.service.helpers import wait_for
from tests.service.requests import slow_spindle, tiny_spindle

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"



def _plan(server: LiveServer, plan_id: str, wait: float = 0) -> dict[str, Any]:
    r = httpx.get(f"{server.url}/v1/plans/{plan_id}", params={"wait": wait}, timeout=wait + 30)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.db
@pytest.mark.slow
def test_service_sigkilled_mid_solve_job_completes_after_restart(
        live_server_factory: Callable[..., LiveServer]) -> None:
    first = live_server_factory(job_lease_s=1.5)
    sub = httpx.post(f"{first.url}/v1/plans", json=slow_spindle(2.0), timeout=30)
    assert sub.status_code in (200, 201, 202), sub.text
    plan_id = sub.json()["id"]
    wait_for(lambda: _plan(first, plan_id)["status"] == "running"
              and "exact" in str(_plan(first, plan_id)["progress"]["message"] or ""), 60, "the solve to be mid-way")
    os.kill(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{first.url}/healthz", timeout=2)

    second = live_server_factory(job_lease_s=1.5)
    view = wait_for(lambda: (v := _plan(second, plan_id, wait=5))["status"] in ("succeeded", "failed") and v,
                     120, "the job to finish on the restarted service")
    assert view["status"] == "succeeded", view
    assert view["attempts"] == 2  # the killed attempt counted once, then the restarted service finished it
    assert view["result"]["estimate"]["iteration_time_s"] > 0


# --- PostgreSQL restarted ------------------------------------------------------------------------------
def _pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action], check=True,
                   capture_output=True, timeout=60)


def _pg_available(url: str) -> bool:
    try:
        _pg_admin(url, "SELECT 1")
        return True
    except Exception:
        return False


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A migrated schema of its own on the local PostgreSQL (skipped when not root or no server)."""
    from service.migrate import upgrade

    base = PG_URL or DEFAULT_PG
    if os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None or not os.path.isdir("/etc/postgresql"):
        pytest.skip("restarting PostgreSQL needs root and pg_ctlcluster")
    if not _pg_available(base):
        pytest.skip(f"no PostgreSQL answering at {base}")
    schema = f"faults_{uuid.uuid4().hex[:8]}"
    _pg_admin(base, f"CREATE SCHEMA {schema}")
    url = _with_search_path(base, schema)
    try:
        upgrade(database_url=url)
        yield url
    finally:
        if not _pg_available(base):
            _pg_ctl("start")
        _pg_admin(base, f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.slow
def test_postgres_restart_while_idle_service_recovers(pg_schema_url: str, tmp_path: Path) -> None:
    server = start_server(pg_schema_url, tmp_path, dispatcher=True)
    try:
        done = httpx.post(f"{server.url}/v1/plans?wait=30", json=tiny_spindle(0), timeout=60).json()
        assert done["status"] == "succeeded"
        assert httpx.get(f"{server.url}/readyz").json()["status"] == "ok"
        try:
            _pg_ctl("stop")  # downtime kept to a few seconds: other sessions may share this server
            down = wait_for(lambda: (r := httpx.get(f"{server.url}/readyz", timeout=10)).status_code == 503 and r,
                             20, "/readyz to report the outage")
            assert down.json()["status"] == "unavailable" and "database unreachable" in down.json()["reason"]
            during = httpx.get(f"{server.url}/v1/plans", timeout=10)
            assert during.status_code == 503 and "database unreachable" in during.json()["detail"], during.text
            metrics = httpx.get(f"{server.url}/metrics", timeout=10)
            assert metrics.status_code == 200 and "paraplan_database_up 0.0" in metrics.text
        finally:
            _pg_ctl("start")
        # no restart of the service, no manual step: it notices by itself
        wait_for(lambda: httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200, 60, "recovery")
        assert httpx.get(f"{server.url}/v1/plans/{done['id']}").json()["status"] == "succeeded"
        again = httpx.post(f"{server.url}/v1/plans?wait=30", json=tiny_spindle(1), timeout=60)
        assert again.json()["status"] == "succeeded", again.text
        assert "paraplan_database_up 1.0" in httpx.get(f"{server.url}/metrics").text
        assert '"status": 500' not in server.logs()
    finally:
        server.stop()


# --- the database cannot be written --------------------------------------------------------------------
def _rows(db_file: Path) -> dict[str, int]:
    with sqlite3.connect(db_file) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("plans", "plan_requests", "jobs")}


def test_read_only_database_is_503_with_a_reason_and_nothing_written(tmp_path: Path,
                                                                     _sqlite_template: Path) -> None:
    db_file = tmp_path / "paraplan.db"
    shutil.copy(_sqlite_template, db_file)
    writable = start_server(f"sqlite:///{db_file}", tmp_path, dispatcher=True)
    try:
        stored = httpx.post(f"{writable.url}/v1/plans?wait=30", json=tiny_spindle(0), timeout=60).json()
    finally:
        writable.stop()
    before = _rows(db_file)

    ro = start_server(f"sqlite:///file:{db_file}?mode=ro&uri=true", tmp_path, dispatcher=False)
    try:
        for attempt in range(3):
            r = httpx.post(f"{ro.url}/v1/plans", json=tiny_spindle(10 + attempt), timeout=30)
            assert r.status_code == 503 and r.json()["detail"].startswith("database is read-only"), r.text
            assert r.headers["retry-after"] == "1"
        # reads go on: a read-only database still serves plans (and /readyz, which reads only)
        assert httpx.get(f"{ro.url}/v1/plans/{stored['id']}").json()["status"] == "succeeded"
        assert httpx.get(f"{ro.url}/readyz").status_code == 200
        assert '"status": 500' not in ro.logs()
    finally:
        ro.stop()
    assert _rows(db_file) == before


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (root only)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a size-limited tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(path: Path) -> None:
    """Write until the filesystem refuses, down to its last bytes (unbuffered: nothing pending at close)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_disk_full_is_503_with_a_reason_and_no_corrupted_rows(tiny_fs: Path, tmp_path: Path,
                                                              _sqlite_template: Path) -> None:
    db_file = tiny_fs / "paraplan.db"
    shutil.copy(_sqlite_template, db_file)
    server = start_server(f"sqlite:///{db_file}", tmp_path, dispatcher=True)
    try:
        first = httpx.post(f"{server.url}/v1/plans?wait=30", json=tiny_spindle(0), timeout=60).json()
        assert first["status"] == "succeeded"
        _fill(tiny_fs / "ballast")
        statuses = []
        for i in range(1, 6):
            r = httpx.post(f"{server.url}/v1/plans", json=tiny_spindle(100 + i), timeout=30)
            statuses.append(r.status_code)
            assert r.status_code in (200, 201, 202, 503), r.text
            if r.status_code == 503:
                assert r.json()["detail"].startswith("database disk is full"), r.text
        assert 503 in statuses, statuses
        assert httpx.get(f"{server.url}/v1/plans/{first['id']}").json()["status"] == "succeeded"  # reads go on

        (tiny_fs / "ballast").unlink()  # space is back: writes resume without a restart
        after = httpx.post(f"{server.url}/v1/plans?wait=30", json=tiny_spindle(200), timeout=60)
        assert after.status_code in (200, 201) and after.json()["status"] == "succeeded", after.text
        assert '"status": 500' not in server.logs()
    finally:
        server.stop()
    rows = _rows(db_file)  # integrity_check passes, and every plan has its request and its job
    accepted = sum(s in (200, 201, 202) for s in statuses)
    assert rows["plans"] == rows["jobs"] == 2 + accepted and rows["plan_requests"] == rows["plans"]
