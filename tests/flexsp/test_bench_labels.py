"""bench/flexsp.py prints the reference's Wikipedia figures (totals over its first 40 batches) as a comparison
only over those same 40 batches; over any other count it says they are not comparable (issue 34)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_module import load_bench


def _bench() -> ModuleType:
    return load_bench("flexsp.py")


def test_reference_totals_compare_only_over_the_same_40_batches() -> None:
    bench = _bench()
    assert "over the same 40 batches" in bench.reference_line(40) and "167.3" in bench.reference_line(40)
    for n in (1, 5, 39, 41):
        line = bench.reference_line(n)
        assert "not comparable" in line and f"these {n}" in line and "same" not in line


@pytest.mark.skipif(not _bench().WIKI.exists(), reason="../shared/reference/flexsp is not beside this checkout")
def test_a_short_wikipedia_run_labels_the_reference_and_the_milp(capsys: pytest.CaptureFixture[str]) -> None:
    _bench().wikipedia(1, "cpsat")
    out = capsys.readouterr().out
    assert "not comparable with these 1" in out and "(estimates;" in out
    assert "MILP outcome per batch: " in out
