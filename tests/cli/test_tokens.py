"""``paraplan token create | list | revoke`` and the data directory, as a newcomer meets them: the first token says
what it closes; the database is one file whatever the working directory, and a command never creates an empty one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, TEST_PEPPER, start_server
from tests.service.requests import REQUESTS

PARAPLAN = [sys.executable, "-m", "paraplan_cli.main"]


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARAPLAN_")}
    return {**env, "PYTHONPATH": str(ROOT), "PARAPLAN_DATA_DIR": str(data_dir), "PARAPLAN_TOKEN_PEPPER": TEST_PEPPER,
            **extra}


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PARAPLAN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_database_lives_in_the_data_directory_whatever_the_working_directory(tmp_path: Path) -> None:
    data, here, there = tmp_path / "data", tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    env = _env(data)
    # before `db upgrade`: an error naming the database and the fix, and no empty database created anywhere
    out = _run(["token", "create", "--scope", "submit"], here, env)
    db = data / "paraplan.db"
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.strip() == (f"error: no database at {db}: `paraplan db upgrade` creates it "
                                  "(PARAPLAN_DATA_DIR or PARAPLAN_DATABASE_URL choose another)")
    assert "Traceback" not in out.stderr and not data.exists() and not list(here.iterdir())
    assert "no database at" in _run(["doctor"], here, env).stdout and not data.exists()

    out = _run(["db", "upgrade"], here, env)
    assert out.returncode == 0 and f"database {db} at head" in out.stderr, out
    # a token made in one directory is listed from another: one database
    out = _run(["token", "create", "--scope", "submit", "--name", "laptop"], there, env)
    assert out.returncode == 0, out
    listed = _run(["token", "list"], tmp_path, env).stdout.splitlines()
    assert len(listed) == 2 and listed[1].split()[1:2] == ["submit"] and listed[1].endswith("laptop")
    assert not list(here.iterdir()) and not list(there.iterdir())  # (no stray ./paraplan.db)


def test_the_first_token_says_what_it_closes_and_a_revoked_one_stops_working(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = _env(data)
    assert _run(["db", "upgrade"], tmp_path, env).returncode == 0
    assert _run(["token", "list"], tmp_path, env).stdout.startswith("no tokens: the API is open")
    server = start_server(f"sqlite:///{data / 'paraplan.db'}", tmp_path, dispatcher=False)
    try:
        body: dict[str, Any] = REQUESTS["spindle"]
        assert httpx.post(f"{server.url}/v1/plans", json=body).status_code == 202  # open: no token yet

        first = _run(["token", "create", "--scope", "submit"], tmp_path, env)
        token = first.stdout.strip()
        assert first.returncode == 0 and first.stdout == token + "\n" and token.startswith("pp_")  # alone on stdout
        note = first.stderr
        assert note.startswith("paraplan: this is the first API token: the API was open while none existed")
        for said in ("Authorization: Bearer", "PARAPLAN_TOKEN", "'API token' field", "PARAPLAN_WORKER_TOKEN",
                     "--token-file", "reads (GET /v1/..., the dashboard's pages) stay open",
                     "PARAPLAN_REQUIRE_READ_TOKEN=true", "paraplan token revoke ID"):
            assert said in note, said
        second = _run(["token", "create", "--scope", "worker"], tmp_path, env)
        assert second.returncode == 0 and second.stderr == ""  # only the first token changes anything

        r = httpx.post(f"{server.url}/v1/plans", json={**body, "options": {"polish_time_s": 0.1}})
        assert r.status_code == 401
        assert "since API tokens exist" in r.json()["detail"] and "Authorization: Bearer" in r.json()["detail"]
        assert httpx.get(f"{server.url}/v1/plans").status_code == 200  # reads stay open, as the note said
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.post(f"{server.url}/v1/plans", json={**body, "options": {"polish_time_s": 0.2}},
                          headers=auth).status_code == 202

        rows = _run(["token", "list"], tmp_path, env).stdout.splitlines()[1:]
        submit_id = next(r.split()[0] for r in rows if r.split()[1] == "submit")
        out = _run(["token", "revoke", submit_id], tmp_path, env)
        assert out.returncode == 0 and out.stderr == f"revoked {submit_id}\n"
        assert submit_id not in _run(["token", "list"], tmp_path, env).stdout
        assert f"{submit_id}  submit" in _run(["token", "list", "--all"], tmp_path, env).stdout
        bad = _run(["token", "revoke", "nope"], tmp_path, env)
        assert bad.returncode == 2 and "no token 'nope'" in bad.stderr
    finally:
        server.stop()


@pytest.mark.parametrize(("content", "why"), [(None, "cannot read"), ("\n", "is empty")])
def test_a_worker_token_file_that_cannot_be_used_is_named(tmp_path: Path, content: str | None, why: str) -> None:
    path = tmp_path / "worker.token"
    if content is not None:
        path.write_text(content)
    out = _run(["worker", "--server", "http://127.0.0.1:9", "--token-file", str(path)], tmp_path, _env(tmp_path))
    assert out.returncode == 2 and out.stderr.startswith("error: --token-file: ") and why in out.stderr
    assert str(path) in out.stderr
