"""The terminal summaries show the plan itself: Spindle's schedule (every slice) and FlexSP's groups."""

from __future__ import annotations

import re
from typing import Any

from paraplan_cli.main import app as cli
from solvers.api import solve
from solvers.documents import FlexSPResult, SpindleResult
from solvers.flexsp.summary import MAX_GROUPS_SHOWN, group_lines
from solvers.flexsp.summary import summarise as flexsp_summary
from solvers.spindle.summary import MAX_SLICES_SHOWN, schedule_lines
from solvers.spindle.summary import summarise as spindle_summary
from solvers.text import seconds
from tests.service.requests import REQUESTS
from tests.spindle.test_api import CONTRACT

SLICE_LINE = re.compile(r"\s+devices? (\d+)(?:-(\d+))?\s+(\S+)\s+layers? (\d+)(?:-(\d+))?\s+(.+) -> (.+)$")


def test_spindle_summary_prints_every_slice_of_the_schedule_in_start_order() -> None:
    request = {**CONTRACT, "options": {"exact": False}}
    result = solve(request)
    assert isinstance(result, SpindleResult)
    lines = spindle_summary(request, result)
    rows = [m for x in lines if (m := SLICE_LINE.match(x))]
    assert len(rows) == len(result.slices) <= MAX_SLICES_SHOWN
    ordered = sorted(result.slices, key=lambda s: (s.start_s, min(s.devices)))
    for m, s in zip(rows, ordered, strict=True):
        lo, hi = int(m[1]), int(m[2] or m[1])
        first, last = int(m[4]), int(m[5] or m[4])
        assert (lo, hi, m[3]) == (min(s.devices), max(s.devices), s.metaop)
        assert (first, last) == (s.layer_start, s.layer_start + s.layers - 1)
        assert (m[6], m[7]) == (seconds(s.start_s), seconds(s.end_s))
    # explicit times: nothing to size memory from, said so
    assert "memory not estimated: explicit per-layer times, no module shapes" in lines


def test_a_long_schedule_is_cut_saying_how_many_slices_the_json_has() -> None:
    result = solve({**CONTRACT, "options": {"exact": False}})
    assert isinstance(result, SpindleResult)
    many = [result.slices[0]] * (MAX_SLICES_SHOWN + 7)
    rows = schedule_lines(many)
    assert len(rows) == MAX_SLICES_SHOWN + 1 and rows[-1] == "  ... and 7 more slices (--json)"


def test_flexsp_summary_prints_every_group_with_its_ranks_and_sequences() -> None:
    # a long sequence that needs all 8 GPUs, then short ones in groups of their own
    request: dict[str, Any] = {**REQUESTS["flexsp"], "batch": {"sequence_lengths": [65536, 16384, *[2048] * 24,
                                                                                      *[512] * 40]}}
    result = solve(request)
    assert isinstance(result, FlexSPResult)
    text = "\n".join(flexsp_summary(request, result))
    lengths = request["batch"]["sequence_lengths"]
    for k, mb in enumerate(result.micro_batches):
        assert f"micro-batch {k + 1}: {seconds(mb.time_s)}, {len(mb.groups)} group" in text
        for g in mb.groups:
            tokens = sum(lengths[i] for i in g.sequences)
            n = len(g.sequences)
            assert (f"sp {g.sp} on ranks {g.ranks[0]}-{g.ranks[1]}: {n} sequence{'s' if n != 1 else ''}, "
                    f"{tokens:,} tokens") in text
    shown = sum(len(mb.groups) for mb in result.micro_batches)
    assert text.count("    sp ") == shown and len(result.micro_batches) > 1 and shown > 2
    many = group_lines(result.micro_batches * MAX_GROUPS_SHOWN)
    assert len(many) == MAX_GROUPS_SHOWN + 1 and many[-1].endswith("more lines (--json)")


def test_the_cli_prints_the_schedule(tmp_path: Any) -> None:
    import json

    from typer.testing import CliRunner

    path = tmp_path / "r.json"
    path.write_text(json.dumps({**CONTRACT, "options": {"exact": False}}))
    done = CliRunner().invoke(cli, ["plan", "-f", str(path)])
    assert done.exit_code == 0
    assert "schedule (" in done.stdout and sum(bool(SLICE_LINE.match(x)) for x in done.stdout.splitlines()) > 0
