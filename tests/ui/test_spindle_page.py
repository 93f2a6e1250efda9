"""The Spindle page: its memory section (a chart of each device's estimate, or why there is none) and the hybrid
layouts its slices run."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.db.engine import Database
from service.ui.spindle_view import EXPLICIT_MEMORY
from solvers.api import solve
from tests.spindle.test_api import CONTRACT, TINY
from tests.spindle.test_layouts import LARGE_64
from tests.ui.conftest import store_plan


def _memory_section(html: str) -> str:
    return html.split('id="memory"', 1)[1].split("</section>", 1)[0]


def test_an_explicit_time_workload_says_why_it_has_no_memory_chart(ui_client: TestClient, ui_db: Database) -> None:
    request = {**CONTRACT, "options": {"exact": False}}
    result = solve(request).to_json()
    assert result["estimate"]["memory_estimated"] is False and result["estimate"]["peak_memory_gib"] is None
    html = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}").text
    section = _memory_section(html)
    assert EXPLICIT_MEMORY.split(":")[0] in section and "<canvas" not in section


def test_a_workload_of_module_shapes_charts_every_devices_memory(ui_client: TestClient, ui_db: Database) -> None:
    request = {**TINY, "workload": {"metaops": [{"name": "v", "batch_size": 8,
                                                 "module": {"preset": "vit-huge", "seq_length": 257}}]}}
    result = solve(request).to_json()
    html = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}").text
    section = _memory_section(html)
    assert "No memory estimate" not in section and "memory-chart" in section
    assert len(result["estimate"]["memory_gib_per_device"]) == 2


def test_the_dashboard_lists_each_slices_layout(ui_client: TestClient, ui_db: Database) -> None:
    out = solve(LARGE_64).to_json()
    html = ui_client.get(f"/plans/{store_plan(ui_db, LARGE_64, out)}").text
    section = html.split('id="layouts"', 1)[1].split("</section>", 1)[0]
    for s in out["slices"]:
        if s["layout"] is not None:
            assert f"<td>{s['metaop']}</td><td>{s['devices'][0]}–{s['devices'][-1]}</td>" in section
    assert "ZeRO-" in section


def test_the_page_names_the_metaops_priced_by_a_given_layer_time(ui_client: TestClient, ui_db: Database) -> None:
    from tests.spindle.test_api import GIVEN, _shaped

    for given, shown in ((GIVEN, True), (None, False)):
        request = _shaped(given)
        result = solve(request).to_json()
        html = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}").text
        assert ('id="given-layer-times"' in html) is shown
        if shown:
            note = html.split('id="given-layer-times"', 1)[1].split("</p>", 1)[0]
            assert "cap/vit" in note and "cap/llm" not in note
