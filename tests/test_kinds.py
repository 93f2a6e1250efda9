"""A plan kind whose solver fails to import is reported with its import error, never hidden (issue 34): before,
``available_kinds`` swallowed the error, so the form lost the kind and the browser tests skipped."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from solvers import kinds
from solvers.api import available_kinds

MISSING = "paraplan_no_such_dependency"


@pytest.fixture
def broken_spindle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The spindle kind's module replaced by one whose dependency is not installed."""
    (tmp_path / "broken_spindle_api.py").write_text(f"import {MISSING}\n")
    (tmp_path / "half_spindle_api.py").write_text("from solvers.errors import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(kinds._MODULES, "spindle", "broken_spindle_api")
    yield "broken_spindle_api"
    for name in ("broken_spindle_api", "half_spindle_api"):
        sys.modules.pop(name, None)


def test_a_whole_install_serves_every_kind() -> None:
    assert available_kinds() == ["hybrid", "flexsp", "spindle"] and kinds.kind_load_errors() == {}


@pytest.mark.usefixtures("broken_spindle")
def test_a_kind_that_fails_to_import_raises_with_its_error() -> None:
    with pytest.raises(kinds.KindUnavailable, match=f"'spindle' failed to load: No module named '{MISSING}'"):
        available_kinds()
    assert list(kinds.kind_load_errors()) == ["spindle"]


def test_an_import_error_other_than_a_missing_module_is_reported_too(broken_spindle: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(kinds._MODULES, "spindle", "half_spindle_api")
    with pytest.raises(kinds.KindUnavailable, match="no_such_name"):
        kinds.solver_kind("spindle")


@pytest.mark.usefixtures("broken_spindle")
def test_an_optional_kind_is_left_out_and_said_so(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(kinds, "OPTIONAL_KINDS", frozenset({"spindle"}))
    with caplog.at_level(logging.WARNING, logger="solvers.kinds"):
        assert available_kinds() == ["hybrid", "flexsp"]
    assert any("optional plan kind spindle left out" in r.message and MISSING in r.message for r in caplog.records)


@pytest.mark.db
@pytest.mark.usefixtures("broken_spindle")
def test_the_form_names_a_broken_solver_instead_of_dropping_its_kind(client: Any) -> None:
    page = client.get("/plans/new")
    assert page.status_code == 503
    assert "spindle" in page.text and MISSING in page.text
