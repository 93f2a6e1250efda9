"""The frameworks' own parsers as fixtures: ``tools/frameworks/setup.sh`` builds (or finds, cached) the frameworks
venv once a session (started in the background as the session begins, these tests run last:
``tests/frameworks/venv.py``), and ``validators`` runs ``tools/frameworks/validate.py FRAMEWORK --serve`` in one
long-lived subprocess per framework (their imports take seconds).

Without the venv (no network to build it, no Megatron-LM training code in ../shared) the tests skip, except
under CI=true, where they fail: CI must run them."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.venv import MEGATRON_LM, SETUP, TOOLS, VENV, megatron_lm_present

SETUP_TIMEOUT_S = 1200


def unavailable(reason: str) -> None:
    """Skip, or fail under CI (where these tests must run)."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"framework validators unavailable under CI: {reason}", pytrace=False)
    pytest.skip(f"framework validators unavailable: {reason}")


@pytest.fixture(scope="session")
def frameworks_python() -> Path:
    """The frameworks venv's python, the venv built by setup.sh (a no-op when its stamp is current)."""
    if not megatron_lm_present():
        unavailable(f"Megatron-LM's training code is not at {MEGATRON_LM}")
    try:  # waits for the root conftest's background build, if one is still running
        done = subprocess.run(SETUP, capture_output=True, text=True, timeout=SETUP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        unavailable(f"setup.sh took over {SETUP_TIMEOUT_S} s")
    if done.returncode:
        unavailable(f"setup.sh exited {done.returncode}: {(done.stdout + done.stderr)[-3000:]}")
    return VENV / "bin" / "python"


class Validator:
    """One framework's validate.py in --serve mode: a request a line, an answer a line."""

    def __init__(self, python: Path, framework: str) -> None:
        self.framework = framework
        fd, log = tempfile.mkstemp(prefix=f"validate-{framework}-", suffix=".log")
        self.log = Path(log)
        self.log_file = os.fdopen(fd, "w")
        env = {**os.environ, "PARAPLAN_MEGATRON_LM": str(MEGATRON_LM)}
        self.proc = subprocess.Popen([str(python), str(TOOLS / "validate.py"), framework, "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log_file, text=True,
                                     env=env)

    def check(self, path: Path, gpus: int, gpu_arch: int = 9, num_layers: int | None = None) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"file": str(path), "gpus": gpus, "gpu_arch": gpu_arch, "num_layers": num_layers}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text()[-3000:]
            raise RuntimeError(f"validate.py {self.framework} died (exit {self.proc.wait()}): {tail}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log_file.close()
        self.log.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def validators(frameworks_python: Path) -> Iterator[dict[str, Validator]]:
    started: dict[str, Validator] = {}

    class Lazy(dict[str, Validator]):
        def __missing__(self, framework: str) -> Validator:
            started[framework] = self[framework] = Validator(frameworks_python, framework)
            return started[framework]

    yield Lazy()
    for v in started.values():
        v.close()
