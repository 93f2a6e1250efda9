"""The project's two front doors: the CLI reports bad input cleanly, the server answers /healthz."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PARAPLAN = [sys.executable, "-m", "paraplan_cli.main"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_invalid_json_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = subprocess.run([*PARAPLAN, "estimate", "-f", str(bad), "--json"], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("error:") and "line 1" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_invalid_field_names_it(tmp_path: Path) -> None:
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"kind": "nonsense"}))
    out = subprocess.run([*PARAPLAN, "plan", "-f", str(req), "--json"], capture_output=True, text=True)
    assert out.returncode == 2 and "kind" in out.stderr and "Traceback" not in out.stderr


def test_serve_answers_healthz(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PARAPLAN_DATABASE_URL": f"sqlite:///{tmp_path}/t.db", "PARAPLAN_RUN_DISPATCHER": "false"}
    up = subprocess.run([*PARAPLAN, "db", "upgrade"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    proc = subprocess.Popen([*PARAPLAN, "serve", "--port", str(port)], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert r.status_code == 200 and r.json()["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(10)
