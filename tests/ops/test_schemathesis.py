"""schemathesis against the live OpenAPI schema, in the suite: a fixed-seed sample bounded to about 25 s.
The full >= 2,000-request run is ``bench/schemathesis_run.py`` (same code, larger budget)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.slow


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("schemathesis_run", ROOT / "bench" / "schemathesis_run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_fuzzed_requests_get_no_5xx_and_match_the_schema(tmp_path: Path) -> None:
    pytest.importorskip("schemathesis")
    report = _bench().fuzz(tmp_path, seed=11, max_examples=3, max_time_s=25)
    detail = (tmp_path / "schemathesis.out").read_text()[-4000:]
    assert report.server_errors == [], report.server_errors
    assert report.st_exit_code == 0, detail  # not_a_server_error + response schema, status and content type
    assert report.requests >= 300, report.table()  # the sample really exercised the API
    assert report.by_status[201] + report.by_status[200] > 50  # past auth: mutating endpoints ran
