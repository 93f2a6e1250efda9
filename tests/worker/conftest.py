"""Worker tests run their live servers on SQLite only: what is under test is the worker, the runs API is
tested on PostgreSQL by the service's own tests, and these multi-process tests are the suite's slowest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture
def database_url(tmp_path: Path, _sqlite_template: Path) -> str:
    path = tmp_path / "paraplan.db"
    shutil.copy(_sqlite_template, path)
    return f"sqlite:///{path}"
