"""Pages rendered through the app (no browser): each shows what its plan document says."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from service import jobs, plans, runs
from service.db.engine import Database
from service.db.models import Plan, PlanRequest
from service.runs import create_run
from service.tokens import Principal
from service.workers import register_worker
from solvers import api
from solvers.api import estimate
from solvers.documents.hybrid import HybridEstimate
from solvers.run_layout import runtime_request
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
    # the certificate: the step no plan beats, the plan's gap, and the most any plan gains on a baseline
    cert = html.split('id="certificate"', 1)[1].split("</p>", 1)[0]
    table = html.split('id="baselines"', 1)[1]
    assert "2.0%" in cert and "+20.0%" in table and "≤ +22.4%" in table
    assert "ZeRO-3 data parallel" in html and "infeasible" in html
    for fmt_name in ("megatron", "deepspeed", "torchtitan", "galvatron"):
        assert f"/v1/plans/{plan_id}/export?format={fmt_name}" in html
    assert f"/v1/plans/{plan_id}/export?format=megatron&amp;of=megatron" in html  # the best uniform plan


def test_a_baseline_outside_the_constraints_is_marked_in_its_row(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.hybrid()
    result["baselines"]["megatron"]["outside_constraints"] = ["constraints.zero = 0: it uses ZeRO 1"]
    html = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}").text
    row = html.split('id="baselines"', 1)[1].split("Best Megatron-style uniform 3D", 1)[1].split("</tr>", 1)[0]
    assert "outside this request&#39;s constraints: constraints.zero = 0: it uses ZeRO 1" in row


def test_hybrid_page_survives_missing_optional_fields(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.hybrid(num_layers=6, pp=1)
    del result["baselines"], result["estimate"]["memory_breakdown_gib_per_stage"], result["estimate"]["stage_time_s"]
    result["strategy"]["layers"][0] = {"tp": 1}
    resp = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}")
    assert resp.status_code == 200
    assert 'id="layer-strip"' in resp.text
    assert 'id="timeline"' not in resp.text and 'id="memory"' not in resp.text


def test_hybrid_page_of_a_request_that_no_longer_parses_shows_the_plan(ui_client: TestClient, ui_db: Database) -> None:
    """A stored request the current rules refuse (here: a GPU preset unknown today) still shows its plan, without
    the memory-limit line, not a server error."""
    request, result = samples.hybrid(num_layers=5, pp=1)
    plan_id = store_plan(ui_db, request, result)
    with ui_db.writing() as session:
        stored = session.execute(select(PlanRequest).join(Plan, Plan.request_id == PlanRequest.id)
                                 .where(Plan.id == plan_id)).scalar_one()
        stored.request = {**request, "cluster": {**request["cluster"], "gpu": "retired-gpu"}}
    resp = ui_client.get(f"/plans/{plan_id}")
    assert resp.status_code == 200 and 'id="layer-strip"' in resp.text
    assert "limit —" in resp.text

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
    assert "2×8 A100-80GB" in html and "3 metaops, 2 tasks" in html  # labels from the stored request


def test_form_rejects_bad_numbers_naming_the_field(ui_client: TestClient) -> None:
    resp = ui_client.post("/plans/new", data={"kind": "hybrid", "nodes": "two", "seq_length": "-1"})
    assert resp.status_code == 422
    assert "<code>nodes</code>: must be a whole number" in resp.text
    assert "<code>seq_length</code>: must be positive" in resp.text


def _run_through_worker(db: Database, plan_id: str, metrics: dict[str, Any] | None,
                        progress: list[dict[str, Any]]) -> str:
    """A run executed through the service's worker functions: created, claimed, progress, completed."""
    admin = Principal(None, "admin")
    with db.writing() as session:
        worker = register_worker(session, {"name": "w", "host": "h", "gpus": 8}, admin)
        worker_id = worker.id
        run_id = str(create_run(session, plan_id, steps=len(progress), max_attempts=1)["id"])
    assert runs.claim_run(db, worker_id, admin, lease_s=60) is not None
    for point in progress:
        runs.report_metrics(db, run_id, worker_id, admin, 60, point)
    if metrics is not None:
        runs.complete_run(db, run_id, worker_id, admin, metrics)
    return run_id


def _runnable(result: dict[str, Any]) -> dict[str, Any]:
    """The sample plan on one layout (a run is queued only for a plan the worker runs exactly)."""
    layout = {"tp": 2, "dp": 4, "sp": "megatron", "cp": 1, "zero": 3}
    strategy = result["strategy"]
    strategy["layers"] = [{**x, **layout} for x in strategy["layers"]]
    strategy["embedding"] = {"tp": 2, "dp": 4, "zero": 3}
    return result


def test_run_page_compares_prediction_with_measurement(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.hybrid(num_layers=4, pp=1)
    request["training"]["global_batch_size"] = 32
    plan_id = store_plan(ui_db, request, _runnable(result))
    # a run is predicted on the runtime's stack (service.runs.runtime_predicted), no calibration set stored
    runtime = estimate({**runtime_request(request), "strategy": result["strategy"]})
    assert isinstance(runtime, HybridEstimate)
    predicted = runtime.step_time_s
    metrics = {"step_time_s": predicted * 1.25, "tokens_per_s": 1000.0, "mfu": 0.3,
               "peak_memory_gib_per_rank": [10.0, 11.0, 12.0, 13.0], "loss": [4.0, 3.5, 3.2, 3.0, 2.9]}
    run_id = _run_through_worker(ui_db, plan_id, metrics, [{"step": 1, "loss": 4.0, "step_time_s": 1.0}])
    resp = ui_client.get(f"/runs/{run_id}")
    assert resp.status_code == 200
    html = resp.text
    assert "-20.0%" in html  # predicted / measured - 1 = 1 / 1.25 - 1
    assert html.count("rank ") >= 4 and '"data": [10.0, 11.0, 12.0, 13.0]' in html
    assert '"label": "loss"' in html and '"data": [4.0, 3.5, 3.2, 3.0, 2.9]' in html
    assert 'http-equiv="refresh"' not in html  # finished: no refreshing
    assert f"/runs/{run_id}" in ui_client.get(f"/plans/{plan_id}").text  # the plan lists its runs


def test_a_flexsp_run_page_compares_each_step_with_its_own_prediction(ui_client: TestClient,
                                                                       ui_db: Database) -> None:
    """A FlexSP run trains another batch every step: the page charts each step's prediction beside its measured
    time, compares their medians, and says which groupings the steps ran."""
    request = {"kind": "flexsp", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 4}, "precision": "fp32",
               "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                         "vocab_size": 128}, "batch": {"sequence_lengths": [96, 40, 24, 16, 8]}}
    plan_id = store_plan(ui_db, request, api.solve(request).model_dump(mode="json"))
    steps = [{"predicted_step_time_s": p, "step_time_s": m} for p, m in ((0.2, 0.25), (0.4, 0.5), (0.3, 0.3))]
    metrics = {"step_time_s": 0.3, "predicted_step_time_s": 0.3, "step_times_s": [0.25, 0.5, 0.3],
               "flexsp_steps": steps, "groupings": {"plan": 1, "planned": 1, "fallback": 1}, "loss": [4.8, 4.5, 4.3]}
    html = ui_client.get(f"/runs/{_run_through_worker(ui_db, plan_id, metrics, [])}").text
    assert "measured vs each step&#39;s prediction" in html  # (the chart's title, escaped)
    assert '"data": [0.2, 0.4, 0.3]' in html and '"data": [0.25, 0.5, 0.3]' in html
    assert "step time, each step&#39;s own prediction (median)" in html
    assert "1 plan, 1 planned, 1 fallback" in html


def test_running_run_shows_its_progress_and_refreshes(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.hybrid(num_layers=4, pp=1)
    request["training"]["global_batch_size"] = 96
    plan_id = store_plan(ui_db, request, _runnable(result))
    points = [{"step": i, "loss": 5.0 - i / 10, "step_time_s": 0.5} for i in range(1, 4)]
    html = ui_client.get(f"/runs/{_run_through_worker(ui_db, plan_id, None, points)}").text
    assert 'http-equiv="refresh"' in html
    assert '"data": [4.9, 4.8, 4.7]' in html


def test_failed_plan_shows_the_reason_naming_the_field(ui_client: TestClient, ui_db: Database) -> None:
    request, _ = samples.hybrid(num_layers=3, pp=1)
    request["training"]["global_batch_size"] = 9
    view, _ = plans.submit_plan(ui_db, request, "hybrid", max_attempts=1)
    claimed = jobs.claim_job(ui_db, "ui-test", lease_s=60)
    assert claimed is not None and claimed.plan_id == view["id"]
    detail = [{"loc": ["constraints", "memory_limit_gib"], "msg": "no plan fits in 36.0 GiB per GPU"}]
    jobs.fail_job(ui_db, claimed.id, "ui-test", "no plan fits", detail=detail, request_error=True)
    html = ui_client.get(f"/plans/{view['id']}").text
    assert 'id="failure"' in html and "data-poll-id" not in html
    assert "<code>constraints.memory_limit_gib</code>: no plan fits in 36.0 GiB per GPU" in html


def test_user_text_is_escaped_everywhere(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.spindle()
    evil = "<script>alert(1)</script>"
    request["workload"]["metaops"][0]["task"] = evil
    result["slices"][0]["task"] = evil
    plan_id = store_plan(ui_db, request, result)
    for html in (ui_client.get(f"/plans/{plan_id}").text, ui_client.get("/").text):
        assert evil not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in ui_client.get(f"/plans/{plan_id}").text


def test_interleaved_plan_draws_every_chunk(ui_client: TestClient, ui_db: Database) -> None:
    request, result = samples.hybrid(num_layers=12, pp=3, micro_batches=6)
    request["training"]["global_batch_size"] = 48
    result["strategy"].update(schedule="interleaved", virtual_stages=2)
    html = ui_client.get(f"/plans/{store_plan(ui_db, request, result)}").text
    assert len(_svg_rects(html, "timeline")) == 2 * 3 * 6 * 2
    assert "chunk 1, virtual stage 5" in html  # chunk 1 of stage 2 is the sixth virtual stage
    assert "</span>backward chunk odd</li>" in html and "2 chunks per stage" in html


def test_form_keeps_the_users_values_and_names_solver_errors(ui_client: TestClient) -> None:
    form = {"kind": "hybrid", "model": "llama2-13b", "gpu": "H100-SXM", "nodes": "3", "gpus_per_node": "8",
            "global_batch_size": "64", "seq_length": "4096", "memory_limit_gib": "lots"}
    html = ui_client.post("/plans/new", data=form).text
    assert "<code>memory_limit_gib</code>: must be a number of GiB" in html
    assert '<option value="llama2-13b" selected>' in html and 'name="nodes" min="1" value="3"' in html
    # A value only the request parser can judge comes back as a request field path.
    resp = ui_client.post("/plans/new", data={**form, "memory_limit_gib": "-4"})
    assert resp.status_code == 422 and "<code>constraints.memory_limit_gib</code>" in resp.text


def test_form_takes_a_pasted_hugging_face_config(ui_client: TestClient) -> None:
    form = {"kind": "hybrid", "gpu": "A100-80GB", "nodes": "1", "gpus_per_node": "8",
            "global_batch_size": "16", "seq_length": "2048"}
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
           "intermediate_size": 2816, "vocab_size": 32000, "hidden_act": "silu"}
    resp = ui_client.post("/plans/new", data={**form, "hf_config": json.dumps(cfg)}, follow_redirects=False)
    assert resp.status_code == 303
    plan = ui_client.get(resp.headers["location"]).text
    assert "llama (HF config)" in plan
    bad = ui_client.post("/plans/new", data={**form, "hf_config": "{not json"})
    assert bad.status_code == 422 and "<code>hf_config</code>: not JSON" in bad.text and "{not json" in bad.text
    latent = ui_client.post("/plans/new", data={**form, "hf_config": json.dumps({**cfg, "kv_lora_rank": 64})})
    assert latent.status_code == 422 and "kv_lora_rank" in latent.text




def test_form_asks_for_the_attention_kernel_and_the_plan_states_its_stack(ui_client: TestClient,
                                                                          ui_db: Database) -> None:
    """Fused attention is the default (today's frameworks); unfused (the Megatron-LM of 2021) is a choice, and
    the plan's page says which stack it was estimated for."""
    blank = ui_client.get("/plans/new").text
    assert '<option value="fused" selected>' in blank and '<option value="unfused">' in blank
    form = {"kind": "hybrid", "model": "gpt3-1.3b", "gpu": "A100-80GB", "nodes": "1", "gpus_per_node": "8",
            "global_batch_size": "16", "seq_length": "2048", "attention": "unfused"}
    resp = ui_client.post("/plans/new", data=form, follow_redirects=False)
    assert resp.status_code == 303
    plan_id = resp.headers["location"].rsplit("/", 1)[-1]
    claimed = jobs.claim_job(ui_db, "ui-test", lease_s=60)  # the job a worker would run, as it stored it
    while claimed is not None and claimed.plan_id != plan_id:  # (earlier tests' plans of this database)
        claimed = jobs.claim_job(ui_db, "ui-test", lease_s=60)
    assert claimed is not None and claimed.request["training"]["stack"] == {"attention": "unfused"}
    assert jobs.complete_job(ui_db, claimed.id, "ui-test", api.solve(claimed.request))
    plan = ui_client.get(resp.headers["location"]).text
    assert "Estimated for the stack: unfused attention, megatron-core" in plan
    assert "fused elementwise ops (training.stack)" in plan
    assert ("GEMM speed (measured): A100-80GB: GEMMs priced at 86.9 % of the bf16 peak (measured: "
            "cluster.gpu.matmul_tflops)") in plan
    bad = ui_client.post("/plans/new", data={**form, "attention": "flash"})
    assert bad.status_code == 422 and "<code>attention</code>: must be one of fused, unfused" in bad.text


def test_a_mixed_cluster_page_places_each_stage_and_charts_the_sizing_front(ui_client: TestClient,
                                                                           ui_db: Database) -> None:
    """A cluster of groups: each stage's GPUs, layers, own limit and peak, the two mixed-fleet comparisons, no one
    limit line on the memory chart; a sizing request: the front as a table and a chart of days against cost."""
    request = {"kind": "hybrid", "model": {"preset": "llama2-7b", "num_layers": 8},
               "cluster": {"groups": [{"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 4},
                                      {"gpu": "A100-40GB", "nodes": 1, "gpus_per_node": 4}]},
               "training": {"global_batch_size": 32, "seq_length": 2048},
               "sizing": {"tokens": 1e10, "deadline_days": 3, "nodes": [1, 2],
                          "price_per_gpu_hour": {"H100-SXM": 2.5, "A100-80GB": 1.2}}}
    result = api.solve(request)
    assert result.hetero is not None and result.front
    plan_id = store_plan(ui_db, request, result.to_json())
    html = ui_client.get(f"/plans/{plan_id}").text
    placed = html.split('id="placement"', 1)[1].split("</section>", 1)[0]
    for p in result.hetero.placement:
        assert f"<td>{p.stage}</td><td>{' + '.join(p.gpus)}" in placed
    assert "fastest group alone" in placed and "blind to the GPU types" in placed
    assert "referenceLines" not in html.split('id="memory"', 1)[1].split("</section>", 1)[0]
    gemms = html.split('id="matmul"', 1)[1].split("</p>", 1)[0]  # each GPU type's measured GEMM share
    assert "H100-SXM: GEMMs priced at 80.3 % of the bf16 peak (measured" in gemms
    assert "A100-40GB: GEMMs priced at 86.9 % of the bf16 peak (measured" in gemms
    sizing = html.split('id="sizing"', 1)[1].split("</section>", 1)[0]
    assert sizing.count("<tr>") + sizing.count('<tr class="total">') == len(result.front) + 1  # and the header
    found = re.search(r'<script type="application/json" id="front-chart-config">(.*?)</script>', sizing, re.S)
    assert found is not None
    chart = json.loads(found.group(1))
    drawn = sorted((pt["x"], pt["y"]) for d in chart["data"]["datasets"] for pt in d["data"])
    assert drawn == sorted((round(p.days, 6), round(p.cost, 6)) for p in result.front)
