"""`paraplan doctor` tells a migrated database from an unmigrated or unreachable one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from paraplan_cli.doctor import report, run_checks
from service.migrate import upgrade
from service.settings import get_settings


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _by_name(url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    monkeypatch.setenv("PARAPLAN_DATABASE_URL", url)
    get_settings.cache_clear()
    return {c.name: c for c in run_checks()}


def test_migrated_sqlite_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: None) -> None:
    url = f"sqlite:///{tmp_path}/ok.db"
    upgrade("head", url)
    checks = _by_name(url, monkeypatch)
    assert checks["migrations"].ok and checks["database"].ok  # type: ignore[attr-defined]
    assert checks["solver CP-SAT"].ok  # type: ignore[attr-defined]
    text, code = report(list(checks.values()))  # type: ignore[arg-type]
    assert code == 0 and "all required checks passed" in text


def test_unmigrated_database_fails_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               database: None) -> None:
    checks = _by_name(f"sqlite:///{tmp_path}/empty.db", monkeypatch)
    text, code = report(list(checks.values()))  # type: ignore[arg-type]
    assert code == 1 and "paraplan db upgrade" in text


def test_unreachable_database_is_reported_without_credentials(monkeypatch: pytest.MonkeyPatch,
                                                              database: None) -> None:
    checks = _by_name("postgresql+psycopg://user:secret@127.0.0.1:1/nope?connect_timeout=2", monkeypatch)
    db = checks["database"]
    assert not db.ok and "cannot connect" in db.detail and "secret" not in db.detail  # type: ignore[attr-defined]
