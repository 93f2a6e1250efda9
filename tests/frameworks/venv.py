"""Where the frameworks venv lives and the command that builds it (``tools/frameworks/setup.sh``), shared by
this directory's fixtures and the root conftest, which starts a cold build in the background when the session
begins (the frameworks' tests run last) instead of making the first of those tests wait for it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TOOLS = ROOT / "tools" / "frameworks"
VENV = Path(os.environ.get("PARAPLAN_FRAMEWORKS_VENV", ROOT / ".venv-frameworks"))
MEGATRON_LM = Path(os.environ.get("PARAPLAN_MEGATRON_LM", ROOT.parent / "shared" / "reference" / "megatron-lm"))
SETUP = ["bash", str(TOOLS / "setup.sh"), str(VENV)]


def megatron_lm_present() -> bool:
    return (MEGATRON_LM / "megatron" / "training" / "arguments.py").is_file()


def start_background_build() -> subprocess.Popen[bytes]:
    """setup.sh in the background, its output dropped. It holds the venv's lock while it builds, so
    the ``frameworks_python`` fixture's own (synchronous) setup.sh waits for it and then finds the venv current;
    a failed background build is built again there, which reports the error."""
    return subprocess.Popen(SETUP, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
