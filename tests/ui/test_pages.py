"""Pages rendered through the app (no browser): each shows what its plan document says."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from service.db.engine import Database
from tests.ui import samples
from tests.ui.conftest import store_plan


def _svg_rects(html: str, section: str) -> list[str]:
    block = html.split(f'id="{section}"', 1)[1].split("</section>", 1)[0]
    return re.findall(r"<rect [^>]*>", block)


def test_hybrid_page_shows_every_layer_stage_part_and_baseline(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.hybrid(num_layers=12, pp=3, micro_batches=4)
    plan_id = store_plan(ui_db, request, result)
    resp = ui_client.get(f"/plans/{plan_id}")
    assert resp.status_code == 200
    html = resp.text
    # Strip: 12 layers x 6 rows (TP, SP, CP, DP, ZeRO, Recompute), each cell titled with its value.
    cells = _svg_rects(html, "layer-strip")
    assert len(cells) == 12 * 6
    assert "layer 5: TP = 2" in html and "layer 3: TP = 4" in html and "layer 2: Recompute = full" in html
    for label in ("TP 2", "TP 4", "SP megatron", "SP off", "ZeRO 1", "ZeRO 3", "Recompute selective"):
        assert f"</span>{label}</li>" in html
    assert "stage 2 · layers 8–11" in html
    # Memory parts in contract order, and the limit from the request's constraint.
    assert re.search(r"parameters.*gradients.*optimizer.*activations.*buffers", html.split('id="memory"')[1])
    assert "limit 36.0 GiB" in html
    # Timeline: 3 stages x 4 micro-batches x (F, B).
    assert len(_svg_rects(html, "timeline")) == 3 * 4 * 2
    # Baselines: the Megatron one with the plan's gain, the infeasible one says so.
    assert "Best Megatron-style uniform 3D" in html and "1.20×" in html
    assert "ZeRO-3 data parallel" in html and "infeasible" in html
    for fmt_name in ("megatron", "deepspeed", "torchtitan", "galvatron"):
        assert f"/v1/plans/{plan_id}/export?format={fmt_name}" in html


def test_hybrid_page_survives_missing_optional_fields(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.hybrid(num_layers=6, pp=1)
    del result["baselines"], result["estimate"]["memory_breakdown_gib_per_stage"], result["estimate"]["stage_time_s"]
    result["strategy"]["layers"][0] = {"tp": 1}
    resp = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}")
    assert resp.status_code == 200
    assert 'id="layer-strip"' in resp.text
    assert 'id="timeline"' not in resp.text and 'id="memory"' not in resp.text


def test_flexsp_page_places_groups_on_their_ranks(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.flexsp(num_sequences=20, ranks=16)
    html = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}").text
    rects = _svg_rects(html, "groups")
    groups = [g for mb in result["micro_batches"] for g in mb["groups"]]
    assert len(rects) == len(groups)
    assert sorted(int(r.split('data-sp="')[1].split('"')[0]) for r in rects) == sorted(g["sp"] for g in groups)
    first = groups[0]
    lengths = request["batch"]["sequence_lengths"]
    tokens = sum(lengths[s] for s in first["sequences"])
    n = len(first["sequences"])
    assert f"SP{first['sp']} on ranks 0–{first['ranks'][1]}: {n} sequences, {tokens:,} tokens" in html
    assert "static SP16 (best static)" in html and "lower bound" in html


def test_spindle_page_draws_each_slice_on_its_devices(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.spindle()
    html = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}").text
    rects = _svg_rects(html, "gantt")
    assert len(rects) == len(result["slices"])  # every slice is one contiguous device block here
    assert "cap-llm (task cap, module cap-llm): 32 layers on devices 0–7 (8)" in html
    assert "task cap" in html and "task ret" in html
    assert "sequential full cluster" in html


def test_pending_and_failed_plans_render_and_poll(ui_client: TestClient, ui_db: Database) -> None:
    request, _ = samples.hybrid(num_layers=3, pp=1)
    request["training"]["global_batch_size"] = 7  # a distinct request, so a distinct plan
    plan_id = store_plan(ui_db, request, None)
    html = ui_client.get(f"/plans/{plan_id}").text
    assert f'data-poll-id="{plan_id}"' in html and "Solving" in html
    assert ui_client.get(f"/ui/status?ids={plan_id}").json() == {plan_id: "running"}


def test_unknown_plan_is_a_404_page(ui_client: TestClient) -> None:
    resp = ui_client.get("/plans/nope")
    assert resp.status_code == 404 and "not found" in resp.text


def test_static_files_are_served_and_contained(ui_client: TestClient) -> None:
    js = ui_client.get("/ui/static/vendor/chart.umd.min.js")
    assert js.status_code == 200 and "Chart.js v4" in js.text[:200]
    assert ui_client.get("/ui/static/../routes.py").status_code == 404
    assert ui_client.get("/ui/static/vendor/chart.js.LICENSE.md").status_code == 200


def test_list_filters_by_kind_and_shows_headline_numbers(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.spindle()
    request["cluster"]["nodes"] = 2
    store_plan(ui_db, request, result)
    html = ui_client.get("/?kind=spindle").text
    rows = re.findall(r'<tr data-plan-id="', html)
    assert rows and "hybrid</td>" not in html
    assert "120 ms" in html  # the spindle iteration time as the step time


def test_form_rejects_bad_numbers_naming_the_field(ui_client: TestClient) -> None:
    resp = ui_client.post("/plans/new", data={"kind": "hybrid", "nodes": "two", "seq_length": "-1"})
    assert resp.status_code == 422
    assert "<code>nodes</code>: must be a whole number" in resp.text
    assert "<code>seq_length</code>: must be positive" in resp.text
