"""A real Chromium on the pages and chart fixes of the first hour (#36): the runs and workers pages with "Run this
plan", a 4-layer strategy strip drawn at its own size, the memory-limit line across the whole plot (one stage and
several), and legends in the colours the charts draw.

Plans are stored through the service layer (no solver runs), so the module takes seconds. With
``PARAPLAN_SCREENSHOTS=DIR`` each test also saves a full-page PNG there.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service import runs
from service.db.engine import Database
from service.migrate import upgrade
from service.tokens import Principal
from service.workers import register_worker
from tests.conftest import LiveServer, start_server
from tests.ui import samples
from tests.ui.conftest import CHROMIUM, store_plan

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is not installed (apt-get install chromium)"),
]
SHOTS = os.environ.get("PARAPLAN_SCREENSHOTS")


@pytest.fixture(scope="module")
def stored() -> Iterator[tuple[LiveServer, Database]]:
    workdir = Path(tempfile.mkdtemp(prefix="paraplan-ui-pages-"))
    url = f"sqlite:///{workdir / 'ui.db'}"
    upgrade(database_url=url)
    db = Database.connect(url)
    live = start_server(url, workdir, dispatcher=False)
    yield live, db
    live.stop()
    db.dispose()


def _open(browser: Any, url: str, name: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(url)
    page.wait_for_function("() => typeof Chart !== 'undefined' && "
                           "[...document.querySelectorAll('canvas[data-chart]')].every(c => Chart.getChart(c))")
    page.errors = errors
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)
    return page


def _plan(db: Database, num_layers: int, pp: int, batch: int, runnable: bool = False) -> str:
    request, result = samples.hybrid(num_layers=num_layers, pp=pp, micro_batches=2 * pp, runnable=runnable)
    request["training"]["global_batch_size"] = batch  # a distinct request, so a distinct plan
    return store_plan(db, request, result)


# Pixels of a canvas along the line y = value on the chart's value axis, at the plot area's two ends: the dashed
# reference line must be drawn there (a dataset line ran from the first bar's centre to the last's; one bar drew
# none).
_LINE_ENDS = """([id, value]) => {
    const canvas = document.getElementById(id), ch = Chart.getChart(canvas), a = ch.chartArea;
    const r = ch.currentDevicePixelRatio, y = ch.scales.y.getPixelForValue(value);
    const ctx = canvas.getContext('2d');
    const red = (x) => { const [R, G, B] = ctx.getImageData(Math.round(x * r), Math.round(y * r), 1, 1).data;
                          return R > 150 && G < 80 && B < 80; };
    const near = (from, to) => { for (let x = from; x <= to; x++) if (red(x)) return true; return false; };
    return {left: near(a.left, a.left + 12), right: near(a.right - 12, a.right), top: ch.scales.y.max,
            width: a.width};
}"""

# Each chart's drawn colours (every bar's fill, every line dataset's stroke, every reference line) against its
# HTML legend's swatches.
_COLOURS = """() => Object.fromEntries([...document.querySelectorAll('canvas[data-chart]')].map(c => {
    const ch = Chart.getChart(c);
    const drawn = new Set();
    ch.data.datasets.forEach((d, i) => ch.getDatasetMeta(i).data.forEach(el => {
        drawn.add(String(d.type === 'line' || ch.config.type === 'line' ? el.options.borderColor
                                                                         : el.options.backgroundColor).toLowerCase());
    }));
    ((ch.options.plugins.referenceLines || {}).lines || []).forEach(l => drawn.add(l.color.toLowerCase()));
    const legend = [...document.querySelectorAll(`[data-legend-for="${c.id}"] li`)].map(li => ({
        label: li.textContent, colour: li.dataset.colour.toLowerCase(),
        swatch: getComputedStyle(li.querySelector('.swatch')).backgroundColor}));
    return [c.id, {drawn: [...drawn].sort(), legend}];
}))"""


def _legend_matches(page: Any) -> dict[str, Any]:
    found: dict[str, Any] = page.evaluate(_COLOURS)
    assert found, "no chart on the page"
    for cid, chart in found.items():
        assert sorted({item["colour"] for item in chart["legend"]}) == chart["drawn"], (cid, chart)
    return found


def test_a_four_layer_strip_is_drawn_at_its_own_size(browser: Any, stored: tuple[LiveServer, Database]) -> None:
    live, db = stored
    page = _open(browser, f"{live.url}/plans/{_plan(db, 4, 1, 101)}", "strip-4-layers")
    box = page.locator("#layer-strip svg").bounding_box()
    cell = page.locator("#layer-strip svg rect").first.bounding_box()
    # 4 columns of 28 px and the row labels: ~200 px (it had filled the 1400-px page: cells of ~250 px)
    assert box["width"] < 260 and 20 <= cell["width"] <= 30, (box, cell)
    assert box["height"] < 200
    wide = _open(browser, f"{live.url}/plans/{_plan(db, 96, 4, 102)}", "strip-96-layers")
    frame = wide.locator("#layer-strip .svg-wrap").bounding_box()
    strip = wide.locator("#layer-strip svg").bounding_box()
    assert strip["width"] <= frame["width"] and strip["width"] > 900  # a deep model still uses the width
    assert not page.errors and not wide.errors


@pytest.mark.parametrize("pp", [1, 3])
def test_the_memory_limit_line_crosses_the_whole_plot(browser: Any, stored: tuple[LiveServer, Database],
                                                      pp: int) -> None:
    live, db = stored
    page = _open(browser, f"{live.url}/plans/{_plan(db, 12, pp, 110 + pp)}", f"memory-limit-{pp}-stage")
    limit = 36.0  # the samples' constraints.memory_limit_gib
    ends = page.evaluate(_LINE_ENDS, ["memory-chart", limit])
    assert ends["left"] and ends["right"] and ends["top"] >= limit, ends
    legend = page.locator('[data-legend-for="memory-chart"] li').all_text_contents()
    assert legend[-1] == "limit 36.0 GiB"
    assert not page.errors


def test_run_this_plan_then_the_runs_and_workers_pages(browser: Any, stored: tuple[LiveServer, Database]) -> None:
    """(Before any worker of this module's server registers.)"""
    live, db = stored
    plan_id = _plan(db, 4, 1, 136, runnable=True)
    page = _open(browser, f"{live.url}/plans/{plan_id}", "plan-run-form")
    assert "no worker is online" in page.locator("#run-plan").inner_text()
    page.fill("#run-plan input[name=steps]", "12")
    page.click("#run-plan button")
    page.wait_for_url(re.compile(r".*/runs/[0-9a-f]+$"))
    run_id = page.url.rsplit("/", 1)[1]
    assert "12 steps" in page.locator(".subtitle").inner_text()
    assert httpx.get(f"{live.url}/v1/runs/{run_id}", timeout=10).json()["status"] == "queued"

    page.click("header nav >> text=Runs")
    page.wait_for_url(f"{live.url}/runs")
    row = page.locator(f'#runs-table tr[data-run-id="{run_id}"]')
    assert "queued" in row.inner_text() and row.locator(f'a[href="/plans/{plan_id}"]').count() == 1
    assert "No worker is online" in page.locator(".hint").first.inner_text()

    page.click("header nav >> text=Workers")
    page.wait_for_url(f"{live.url}/workers")
    assert "No worker has registered yet" in page.locator("#workers-table").inner_text()
    reg = httpx.post(f"{live.url}/v1/workers/register", json={"name": "node-7", "host": "gpu-host", "gpus": 8,
                                                              "gpu_name": "NVIDIA H100"}, timeout=10)
    assert reg.status_code == 201, reg.text
    page.reload()
    row = page.locator(f'#workers-table tr[data-worker-id="{reg.json()["id"]}"]')
    assert re.search(r"node-7\s+gpu-host\s+8 × NVIDIA H100", row.inner_text()) and "online" in row.inner_text()
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / "workers.png"), full_page=True)
        page.goto(f"{live.url}/runs")
        page.screenshot(path=str(Path(SHOTS) / "runs.png"), full_page=True)
    assert not page.errors
    assert httpx.post(f"{live.url}/v1/runs/{run_id}/cancel", timeout=10).status_code == 200  # (no worker will come)


def test_legends_are_in_the_colours_the_charts_draw(browser: Any, stored: tuple[LiveServer, Database]) -> None:
    live, db = stored
    plan_id = _plan(db, 8, 2, 120, runnable=True)
    found = _legend_matches(_open(browser, f"{live.url}/plans/{plan_id}", "legend-hybrid"))
    # the throughput chart: the plan's bar blue, the baselines' grey, each named in the legend
    assert [(i["label"], i["colour"]) for i in found["baseline-chart"]["legend"]] == [
        ("this plan", "#0072b2"), ("baselines", "#9aa5b1")]
    admin = Principal(None, "admin")
    with db.writing() as session:
        worker_id = register_worker(session, {"name": "w", "host": "h", "gpus": 8}, admin).id
        run_id = str(runs.create_run(session, plan_id, steps=3, max_attempts=1)["id"])
    assert runs.claim_run(db, worker_id, admin, lease_s=60) is not None
    runs.complete_run(db, run_id, worker_id, admin, {"step_time_s": 1.4, "peak_memory_gib_per_rank": [20.0, 21.5],
                                                      "loss": [5.0, 4.5, 4.2], "step_times_s": [1.5, 1.4, 1.4]})
    run_charts = _legend_matches(_open(browser, f"{live.url}/runs/{run_id}", "legend-run"))
    assert set(run_charts) == {"step-chart", "memory-chart", "loss-chart"}
