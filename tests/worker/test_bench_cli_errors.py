"""The closed-loop benches refuse what they cannot measure with a CLI error naming the option, before launching
anything (step_parts.py broke down a pipeline plan by dying in all four ranks with an AssertionError)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("script", "args", "says"), [
    ("step_parts.py", ["--plans", "dp4,pp4-1f1b"], "--plans: pp4-1f1b: only one-node plans"),
    ("step_parts.py", ["--plans", "2node-dp4-zero3"], "--plans: 2node-dp4-zero3: only one-node plans"),
    ("step_parts.py", ["--plans", "dp4,nope"], "--plans: no plan named nope"),
    ("closed_loop.py", ["--launches", "2"], "--launches K needs K >= 1, and --interleave when K > 1"),
    ("closed_loop.py", ["--interleave", "2", "--launches", "0"], "--launches K needs K >= 1"),
])
def test_a_bench_option_it_cannot_honour_is_a_cli_error(script: str, args: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
