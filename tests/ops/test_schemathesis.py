"""schemathesis against the live OpenAPI schema, in the suite: a fixed-seed sample bounded to about 25 s.
The full >= 2,000-request run is ``bench/schemathesis_run.py`` (same code, larger budget)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.bench_module import load_bench
from tests.cpu_budget import machine_factor

pytestmark = pytest.mark.slow


def _bench() -> ModuleType:
    return load_bench("schemathesis_run.py", "schemathesis_run")


def test_fuzzed_requests_get_no_5xx_and_match_the_schema(tmp_path: Path) -> None:
    pytest.importorskip("schemathesis")
    # the sample is cut by time: on a host slower than the reference VM it gets the time the reference's 25 s buy
    # (286 requests in 25 s on a 2-3x slower host fell short of the 300 asked below)
    report = _bench().fuzz(tmp_path, seed=11, max_examples=3, max_time_s=round(25 * min(machine_factor(), 4.0)))
    detail = (tmp_path / "schemathesis.out").read_text()[-4000:]
    assert report.server_errors == [], report.server_errors
    assert report.st_exit_code == 0, detail  # not_a_server_error + response schema, status and content type
    assert report.requests >= 300, report.table()  # the sample really exercised the API
    assert report.by_status[201] + report.by_status[200] > 50  # past auth: mutating endpoints ran
