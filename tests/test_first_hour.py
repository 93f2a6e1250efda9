"""A newcomer's first hour, scripted: the README's commands, verbatim, in a fresh clone of this repository's HEAD,
each step's output checked — ``make run``, the 30-second tour, a token, an authenticated POST and a worker run.

What is not verbatim, and why:
- the install: ``.venv`` is a link to the virtual environment running this suite (the same pyproject.toml) and
  ``make`` is told that its install stamp is current (``-o .venv/.installed``): installing torch again would take
  minutes and the network, and would repoint this suite's environment at the clone. ``PYTHONPATH`` puts the clone
  first, ahead of the environment's own editable install.
- ``make test``: only its dry run (``make -n``), which shows the suite it would run: running the suite inside itself
  would recurse.
- a free port instead of 8000 (``make run PORT=...``, as the README says; the commands' URLs follow it), a temporary
  directory instead of ``/tmp/``, and a fresh data directory (``PARAPLAN_DATA_DIR``), so that parallel runs and the
  user's own data stay apart.
- ``make run`` and ``paraplan worker`` do not exit: they are started in the background and stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, free_port

VENV = Path(sys.prefix)
pytestmark = [
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: nothing to clone"),
    pytest.mark.skipif(sys.prefix == sys.base_prefix or not (VENV / ".installed").exists(),
                       reason="the suite does not run in the Makefile's installed virtual environment"),
    pytest.mark.skipif(shutil.which("make") is None or shutil.which("curl") is None, reason="needs make and curl"),
]


def readme_blocks(text: str) -> dict[str, list[str]]:
    """The commands of each README section's indented code blocks: comments and blank lines dropped, a heredoc kept
    with its body as one command."""
    sections: dict[str, list[str]] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            sections[name] = []
        elif line.startswith("    ") and name:
            sections[name].append(line[4:])
    out: dict[str, list[str]] = {}
    for name, lines in sections.items():
        commands: list[str] = []
        heredoc: str | None = None
        for line in lines:
            if heredoc is not None:
                commands[-1] += "\n" + line
                if line.strip() == heredoc:
                    heredoc = None
                continue
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            commands.append(line)
            if m := re.search(r"<<'?(\w+)'?", line):
                heredoc = m.group(1)
        out[name] = commands
    return out


@dataclass
class Shell:
    """Commands run one by one in the clone with bash; variables they set carry over (``set -a`` and a state file)."""

    cwd: Path
    env: dict[str, str]
    state: Path
    subs: dict[str, str]

    def text(self, command: str) -> str:
        for old, new in self.subs.items():
            command = command.replace(old, new)
        return command

    def run(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        script = f"set -a; source {self.state}; set -eo pipefail\n{self.text(command)}\nexport -p > {self.state}\n"
        return subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def start(self, command: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(["bash", "-c", f"set -a; source {self.state}; exec {self.text(command)}"],
                                    cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def var(self, name: str) -> str:
        return self.run(f'printf %s "${name}"').stdout


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group this test started (make and its server, the worker and its ranks)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _wait(check: Callable[[], Any], timeout_s: float, what: str, log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if found := check():
                return found
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} within {timeout_s:.0f} s" + (f":\n{log.read_text()[-3000:]}" if log else ""))


@pytest.fixture
def clone(tmp_path: Path) -> Iterator[Shell]:
    repo = tmp_path / "paraplan"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True, timeout=60)
    (repo / ".venv").symlink_to(VENV, target_is_directory=True)
    state = tmp_path / "shell.env"
    state.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARAPLAN_")}
    env.update({"PYTHONPATH": str(repo), "PARAPLAN_DATA_DIR": str(tmp_path / "data"),
                "PATH": f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"})
    (tmp_path / "tmp").mkdir()
    yield Shell(repo, env, state, {"/tmp/": f"{tmp_path / 'tmp'}/"})


@pytest.mark.timeout(240)
def test_the_readmes_first_hour(clone: Shell, tmp_path: Path) -> None:
    blocks = readme_blocks((clone.cwd / "README.md").read_text())
    two, tour, runs = blocks["Two commands"], blocks["30-second tour"], blocks["Tokens, runs and workers"]
    assert two == ["make run     # install into .venv, migrate the SQLite database, serve http://127.0.0.1:8000/",
                   "make test    # install everything and run ruff, lint-imports and the whole test suite"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    clone.subs["127.0.0.1:8000"] = f"127.0.0.1:{port}"

    dry = clone.run("make -n -o .venv/.installed test")
    assert dry.returncode == 0 and "ruff check" in dry.stdout and "pytest" in dry.stdout, dry
    assert "pip install" not in dry.stdout  # (the installed environment is current: nothing to install)

    server_log = tmp_path / "make-run.log"
    server = clone.start(f"make -o .venv/.installed run PORT={port}", server_log)
    try:
        _wait(lambda: httpx.get(f"{base}/readyz", timeout=2).status_code == 200, 60, "make run serving", server_log)
        log = server_log.read_text()
        db = tmp_path / "data" / "paraplan.db"
        assert f"database {db} at head" in log and f"paraplan: open http://127.0.0.1:{port}/" in log, log
        assert not (clone.cwd / "paraplan.db").exists()  # the database is in the data directory, not here

        # --- the tour: each command and what it prints
        outputs = []
        for command in tour:
            out = clone.run(command)
            assert out.returncode == 0, (command, out.stderr)
            assert "Traceback" not in out.stderr, (command, out.stderr)
            outputs.append(out)
        request = json.loads((tmp_path / "tmp" / "req.json").read_text())
        assert request["strategy"]["tp"] == 2
        by = dict(zip(tour, outputs, strict=True))
        est = json.loads(next(o for c, o in by.items() if "estimate -f" in c).stdout)
        assert est["strategy"]["layers"][0]["tp"] == 2 and est["step_time_s"] > 0
        summary = next(o for c, o in by.items() if c.rstrip().endswith("plan -f /tmp/req.json")).stdout
        assert summary.startswith("plan: pp=") and "\nnote: the request's strategy is not what planning starts " \
            "from" in summary and "(the whole result: --json)" in summary
        plan_json = json.loads(next(o for c, o in by.items() if "plan -f /tmp/req.json --json" in c).stdout)
        assert plan_json["kind"] == "hybrid" and plan_json["estimate"]["step_time_s"] <= est["step_time_s"]
        megatron = next(o for c, o in by.items() if "--export megatron" in c and "--export-of" not in c).stdout
        assert "--tensor-model-parallel-size" in megatron
        posted = json.loads(next(o for c, o in by.items() if c.startswith("curl")).stdout)
        assert posted["status"] == "succeeded" and posted["result"]["estimate"]["step_time_s"] == pytest.approx(
            plan_json["estimate"]["step_time_s"])
        remote = next(o for c, o in by.items() if "--server" in c)
        cpu = re.compile(r"\d+\.\d+ s CPU")  # (the search's CPU time differs run to run)
        assert cpu.sub("", remote.stdout) == cpu.sub("", summary)  # the server's plan reads as the local one
        assert f"note: an identical request was submitted before: this is plan {posted['id']}" in remote.stderr

        # --- a token, an authenticated POST, a worker run
        commands = iter(runs)
        out = clone.run(next(commands))  # export PARAPLAN_TOKEN=$(... token create --scope submit ...)
        token = clone.var("PARAPLAN_TOKEN")
        assert out.returncode == 0 and token.startswith("pp_"), out
        assert out.stderr.startswith("paraplan: this is the first API token: the API was open while none existed")
        anonymous = httpx.post(f"{base}/v1/plans", json={**request, "constraints": {"seed": 7}}, timeout=10)
        assert anonymous.status_code == 401 and "since API tokens exist" in anonymous.text  # closed, as it said
        assert httpx.get(f"{base}/v1/plans/{posted['id']}", timeout=10).status_code == 200  # reads stay open
        for said in ("Authorization: Bearer", "PARAPLAN_TOKEN", "'API token' field", "PARAPLAN_WORKER_TOKEN",
                     "--token-file", "reads (GET /v1/..., the dashboard's pages) stay open"):
            assert said in out.stderr, said
        out = clone.run(next(commands))  # the authenticated POST
        assert out.returncode == 0 and json.loads(out.stdout)["id"] == posted["id"], out
        out = clone.run(next(commands))  # token list
        assert re.search(r"^[0-9a-f]{32}  submit   \S+ \S+  me$", out.stdout, re.M), out.stdout

        for _ in range(2):  # the CPU request, and its plan
            out = clone.run(next(commands))
            assert out.returncode == 0, out
        plan_id = clone.var("PLAN")
        cpu_plan = httpx.get(f"{base}/v1/plans/{plan_id}", timeout=10).json()
        assert cpu_plan["status"] == "succeeded" and cpu_plan["request"]["cluster"]["gpu"] == "cpu"
        out = clone.run(next(commands))  # POST /v1/plans/$PLAN/runs
        run = json.loads(out.stdout)
        assert run["status"] == "queued" and run["plan_id"] == plan_id and run["steps"] == 3, out
        assert clone.run(next(commands)).returncode == 0  # the worker token, into worker.token
        assert (clone.cwd / "worker.token").read_text().startswith("pp_")
        worker_command = next(commands)
        assert "--token-file worker.token" in worker_command and "--token " not in worker_command
        assert next(commands, None) is None
        worker_log = tmp_path / "worker.log"
        worker = clone.start(worker_command.split("#")[0].strip(), worker_log)
        try:
            done = _wait(lambda: (r := httpx.get(f"{base}/v1/runs/{run['id']}", timeout=5).json())["status"]
                         in ("succeeded", "failed") and r, 150, "the worker finishing the run", worker_log)
        finally:
            _stop(worker)
        assert done["status"] == "succeeded", done.get("error")
        assert done["metrics"]["step_time_s"] > 0 and len(done["metrics"]["loss"]) == 3
        pages = {path: httpx.get(f"{base}{path}", timeout=10).text for path in ("/runs", "/workers",
                                                                               f"/runs/{run['id']}")}
        assert f'data-run-id="{run["id"]}"' in pages["/runs"] and "succeeded" in pages["/runs"]
        assert done["worker"] in pages["/workers"]
        assert "nominal speed, without a profile of this host" in pages[f"/runs/{run['id']}"]
    finally:
        _stop(server)
