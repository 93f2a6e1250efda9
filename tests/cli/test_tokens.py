"""``paraplan token create | list | revoke`` and the data directory, as a newcomer meets them: the first token says
what it closes; the database is one file whatever the working directory, and a command never creates an empty one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TEST_PEPPER

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

    out = _run(["db", "upgrade"], here, env)
    assert out.returncode == 0 and f"database {db} at head" in out.stderr, out
    # a token made in one directory is listed from another: one database
    out = _run(["token", "create", "--scope", "submit", "--name", "laptop"], there, env)
    assert out.returncode == 0 and out.stdout.startswith("pp_"), out
    assert out.stderr.startswith("paraplan: this is the first API token")  # (what it says: tests/test_first_hour.py)
    listed = _run(["token", "list"], tmp_path, env).stdout.splitlines()
    assert len(listed) == 2 and listed[1].split()[1:2] == ["submit"] and listed[1].endswith("laptop")
    assert not list(here.iterdir()) and not list(there.iterdir())  # (no stray ./paraplan.db)

    token_id = listed[1].split()[0]
    out = _run(["token", "revoke", token_id], here, env)
    assert out.returncode == 0 and out.stderr == (f"revoked {token_id}\nparaplan: no token is left: the API is open "
                                                  "again (anyone who reaches it may submit)\n")
    assert f"{token_id}  submit" in _run(["token", "list", "--all"], here, env).stdout
    bad = _run(["token", "revoke", "nope"], here, env)
    assert bad.returncode == 2 and "no token 'nope'" in bad.stderr


@pytest.mark.parametrize(("content", "why"), [(None, "cannot read"), ("\n", "is empty")])
def test_a_worker_token_file_that_cannot_be_used_is_named(tmp_path: Path, content: str | None, why: str) -> None:
    path = tmp_path / "worker.token"
    if content is not None:
        path.write_text(content)
    out = _run(["worker", "--server", "http://127.0.0.1:9", "--token-file", str(path)], tmp_path, _env(tmp_path))
    assert out.returncode == 2 and out.stderr.startswith("error: --token-file: ") and why in out.stderr
    assert str(path) in out.stderr
