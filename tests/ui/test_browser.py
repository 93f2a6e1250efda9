"""A real Chromium submits plans through the form, waits for them, and checks that the charts rendered.

One ``paraplan serve`` (with its solver dispatcher) and one browser serve all three plan kinds. Skipped
when Debian's Chromium is not installed; a plan kind is skipped, with the reason, when its solver is not
available on this checkout.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.migrate import upgrade
from solvers.api import available_kinds
from solvers.kinds import OPTIONAL_KINDS, kind_load_errors
from tests.conftest import LiveServer, start_server
from tests.service.requests import REQUESTS
from tests.ui.conftest import CHROMIUM

SOLVE_TIMEOUT_MS = 120_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed (apt-get install chromium)"),
]

# What the form gets for each kind: small problems that solve in seconds on 2 shared cores.
FORMS: dict[str, dict[str, str]] = {
    "hybrid": {"model": "gpt3-1.3b", "gpu": "A100-80GB", "nodes": "1", "gpus_per_node": "4",
               "global_batch_size": "16", "seq_length": "2048"},
    "flexsp": {"model": "llama2-7b", "gpu": "A100-80GB", "nodes": "1", "gpus_per_node": "8",
               "global_batch_size": "48", "seq_length": "32768"},
    "spindle": {"workload": "clip-imagebind", "spindle_search": "wavefront", "gpu": "A100-80GB", "nodes": "1",
                "gpus_per_node": "8"},
}
# The section each kind's page draws its main chart in.
MAIN_SECTION = {"hybrid": "#layer-strip svg", "flexsp": "#groups svg", "spindle": "#gantt svg"}


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    workdir = Path(tempfile.mkdtemp(prefix="paraplan-ui-"))
    url = f"sqlite:///{workdir / 'ui.db'}"
    upgrade(database_url=url)
    live = start_server(url, workdir)
    yield live
    live.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def submit_and_open(browser: Any, server: LiveServer, kind: str) -> tuple[Any, dict[str, Any], list[str]]:
    """Fill the form for ``kind``, submit, wait on the plan page until its charts are there."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.goto(f"{server.url}/plans/new")
    page.select_option("select[name=kind]", kind)
    for name, value in FORMS[kind].items():
        field = page.locator(f"[name={name}]")
        if field.evaluate("el => el.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    page.click("#submit")
    page.wait_for_url(f"{server.url}/plans/*")
    plan_id = page.url.rsplit("/", 1)[1]
    # The page polls the status and reloads itself when the plan is done.
    page.wait_for_selector(f"{MAIN_SECTION[kind]}, #failure", timeout=SOLVE_TIMEOUT_MS)
    plan = httpx.get(f"{server.url}/v1/plans/{plan_id}", timeout=10).json()
    assert plan["status"] == "succeeded", plan.get("error")
    page.wait_for_function("() => typeof Chart !== 'undefined' && "
                           "[...document.querySelectorAll('canvas[data-chart]')].every(c => Chart.getChart(c))")
    return page, plan, errors


def rendered_charts(page: Any) -> dict[str, dict[str, Any]]:
    """Chart.js charts on the page: canvas id -> series and reference-line labels, drawn size and HTML legend text
    (whose colours tests/ui/test_browser_pages.py checks against the drawing)."""
    charts: dict[str, dict[str, Any]] = page.evaluate("""() => Object.fromEntries(
        [...document.querySelectorAll('canvas[data-chart]')].map(c => {
            const ch = Chart.getChart(c);
            const html = [...document.querySelectorAll(`[data-legend-for="${c.id}"] li`)].map(li => li.textContent);
            const refs = ((ch.options.plugins.referenceLines || {}).lines || []).map(l => l.label);
            return [c.id, {labels: [...ch.data.datasets.map(d => d.label), ...refs], width: c.width,
                           height: c.height, area: ch.chartArea ? ch.chartArea.width * ch.chartArea.height : 0,
                           html}];
        }))""")
    for cid, chart in charts.items():
        assert chart["width"] > 100 and chart["height"] > 100 and chart["area"] > 0, f"{cid} not drawn"
        assert chart["html"], f"{cid}: no legend"
    return charts


def svg_rects(page: Any, selector: str) -> int:
    return int(page.evaluate(f"() => document.querySelectorAll('{selector} rect').length"))


def require(kind: str) -> None:
    """Skip only for a kind declared optional that this install lacks; a broken solver import fails here."""
    if kind in OPTIONAL_KINDS and kind not in available_kinds():
        pytest.skip(f"the optional {kind} solver does not load here: {kind_load_errors()[kind]}")
    assert kind in available_kinds()  # (raises KindUnavailable with the import error when it does not load)


def test_hybrid_plan_through_the_form(browser: Any, server: LiveServer) -> None:
    require("hybrid")
    page, plan, errors = submit_and_open(browser, server, "hybrid")
    result = plan["result"]
    layers = result["strategy"]["layers"]
    rows = page.locator("#layer-strip .legend-row > b").all_text_contents()
    assert rows[:6] == ["TP", "SP", "CP", "DP", "ZeRO", "Recompute"]
    assert svg_rects(page, "#layer-strip svg") == len(layers) * len(rows)
    tp_legend = page.locator("#layer-strip .legend-row").first.locator("li").all_text_contents()
    assert tp_legend == [f"TP {v}" for v in sorted({layer["tp"] for layer in layers})]
    charts = rendered_charts(page)
    est = result["estimate"]
    mem_parts = list(est["memory_breakdown_gib_per_stage"][0])
    assert set(charts["memory-chart"]["labels"][:-1]) == set(mem_parts)
    assert charts["memory-chart"]["labels"][-1].startswith("limit ")
    # Parts that are zero in the plan and in every baseline are left out of the chart.
    breakdowns = [est["breakdown_s"], *(b["estimate"]["breakdown_s"] for b in result["baselines"].values()
                                       if isinstance(b, dict) and b.get("fits") and "estimate" in b)]
    assert set(charts["time-chart"]["labels"]) == {k for bd in breakdowns for k, v in bd.items() if v}
    strategy = result["strategy"]
    pp, m = strategy["pp"], strategy["micro_batches"]
    interleaved = strategy["schedule"] == "interleaved" and pp > 1 and m % pp == 0
    chunks = strategy.get("virtual_stages", 1) if interleaved else 1
    assert svg_rects(page, "#timeline svg") == 2 * pp * m * chunks
    assert page.locator("#baselines tr").count() >= 2
    assert not errors, errors


def test_flexsp_plan_through_the_form(browser: Any, server: LiveServer) -> None:
    require("flexsp")
    page, plan, errors = submit_and_open(browser, server, "flexsp")
    result = plan["result"]
    groups = [g for mb in result["micro_batches"] for g in mb["groups"]]
    assert svg_rects(page, "#groups svg") == len(groups)
    degrees = sorted({g["sp"] for g in groups})
    assert page.locator("[data-legend-for=groups] li").all_text_contents() == [f"SP{d}" for d in degrees]
    charts = rendered_charts(page)
    assert charts["length-histogram"]["labels"] == [f"SP{d}" for d in degrees]
    assert charts["baseline-chart"]["labels"][0] == "step time (s)"
    assert charts["baseline-chart"]["labels"][1].startswith("lower bound")
    assert not errors, errors


def test_spindle_plan_through_the_form(browser: Any, server: LiveServer) -> None:
    require("spindle")
    page, plan, errors = submit_and_open(browser, server, "spindle")
    slices = plan["result"]["slices"]
    assert svg_rects(page, "#gantt svg") >= len(slices)
    tasks = sorted({s["task"] for s in slices})
    assert page.locator("#gantt .legend-row > b").all_text_contents() == [f"task {t}" for t in tasks]
    modules = sorted({s["module"] for s in slices})
    shown = set(page.locator("[data-legend-for=gantt] li").all_text_contents())
    assert shown == set(modules)
    charts = rendered_charts(page)
    assert charts["baseline-chart"]["labels"][0] == "iteration time (s)"
    assert not errors, errors


def test_plans_list_shows_the_submitted_plans(browser: Any, server: LiveServer) -> None:
    # Two plans of different kinds of its own, so the list has rows and the filter something to remove whatever
    # the module's other tests stored (or skipped) before it.
    for kind in ("hybrid", "spindle"):
        assert httpx.post(f"{server.url}/v1/plans", json=REQUESTS[kind], timeout=10).status_code == 202
    page = browser.new_page()
    page.goto(server.url + "/")
    stored = httpx.get(f"{server.url}/v1/plans", timeout=10).json()["items"]
    ids = page.locator("#plans-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.planId)")
    assert ids == [p["id"] for p in stored]
    kinds = {p["kind"] for p in stored}
    assert {"hybrid", "spindle"} <= kinds
    page.select_option("select[name=kind]", "spindle")
    page.click(".filters button")
    page.wait_for_url("**kind=spindle**")  # the GET form's navigation loaded (read before it, the table can be empty)
    shown = page.locator("#plans-table tbody tr td:nth-child(2)").all_text_contents()
    assert set(shown) == {"spindle"} and len(shown) == sum(p["kind"] == "spindle" for p in stored)


def test_list_updates_a_queued_plan_live(browser: Any, tmp_path: Path) -> None:
    # A server without a dispatcher keeps the plan queued until the test cancels it over the API; the
    # open list page must then show the new status by itself.
    url = f"sqlite:///{tmp_path / 'live.db'}"
    upgrade(database_url=url)
    live = start_server(url, tmp_path, dispatcher=False)
    try:
        request = {"kind": "hybrid", "model": {"preset": "gpt3-1.3b"},
                   "cluster": {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 4},
                   "training": {"global_batch_size": 16, "seq_length": 2048}}
        plan_id = httpx.post(f"{live.url}/v1/plans", json=request, timeout=10).json()["id"]
        page = browser.new_page()
        page.goto(live.url + "/")
        badge = page.locator(f'tr[data-plan-id="{plan_id}"] .status')
        assert badge.text_content() == "queued"
        assert httpx.post(f"{live.url}/v1/plans/{plan_id}/cancel", timeout=10).status_code == 200
        badge.filter(has_text="cancelled").wait_for(timeout=15_000)
        assert page.locator(f'tr[data-plan-id="{plan_id}"] [data-poll-id]').count() == 0  # final: not polled
    finally:
        live.stop()
