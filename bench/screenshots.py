"""Screenshots of the dashboard's plan pages, and the server time of its pages at size.

    .venv/bin/python bench/screenshots.py [--plans 1000] [--repeats 20] [--out bench/out]

1. Stores ``--plans`` solved hybrid plans (each with a 128-layer result) through the service layer into a
   fresh SQLite database: the worst case for the plans list.
2. Starts ``paraplan serve`` (with its solver dispatcher) on that database, submits a hybrid, a FlexSP and
   a Spindle plan through the dashboard's form, and waits for them.
3. Drives Debian's Chromium (Playwright) to save full-page PNGs of the three plan pages and the list to
   ``bench/out/`` (gitignored).
4. Prints a table of server time (the pages' ``Server-Timing``) and client wall time per page.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service import jobs, plans  # noqa: E402
from service.db.engine import Database  # noqa: E402
from service.migrate import upgrade  # noqa: E402
from solvers.api import available_kinds, solve  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
FORMS: dict[str, dict[str, str]] = {
    "hybrid": {"kind": "hybrid", "model": "llama2-7b", "gpu": "A100-80GB", "nodes": "1", "gpus_per_node": "8",
               "global_batch_size": "64", "seq_length": "2048", "memory_limit_gib": "36"},
    "flexsp": {"kind": "flexsp", "model": "llama2-7b", "gpu": "A100-80GB", "nodes": "2", "gpus_per_node": "8",
               "global_batch_size": "128", "seq_length": "65536"},
    "spindle": {"kind": "spindle", "workload": "clip-imagebind", "spindle_search": "wavefront", "gpu": "A100-80GB",
                "nodes": "2", "gpus_per_node": "8"},
}
BIG_REQUEST: dict[str, Any] = {
    "kind": "hybrid", "model": {"preset": "llama2-70b", "num_layers": 128},
    "cluster": {"gpu": "H100-SXM", "nodes": 8, "gpus_per_node": 8},
    "training": {"global_batch_size": 256, "seq_length": 4096},
}


def big_result() -> tuple[dict[str, Any], str]:
    """A 128-layer hybrid result: solved when the hybrid planner exists, else the test suite's sample."""
    if "hybrid" in available_kinds():
        return solve(BIG_REQUEST).to_json(), "solved by solvers.hybrid"
    from tests.ui import samples

    return samples.hybrid(num_layers=128, pp=8, micro_batches=64)[1], "synthetic (hybrid solver not available)"


def fill(url: str, count: int, result: dict[str, Any]) -> str:
    """``count`` solved plans through the service's own functions; returns the id of the last one."""
    db = Database.connect(url)
    plan_id = ""
    try:
        for i in range(count):
            req = copy.deepcopy(BIG_REQUEST)
            # Distinct requests (no deduplication) that the stored result still answers: only the seed differs.
            req["constraints"] = {"seed": i}
            view, _ = plans.submit_plan(db, req, "hybrid", max_attempts=3)
            claimed = jobs.claim_job(db, "bench", lease_s=60)
            assert claimed is not None and claimed.plan_id == view["id"]
            jobs.complete_job(db, claimed.id, "bench", result)
            plan_id = view["id"]
    finally:
        db.dispose()
    return plan_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(url: str, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "PARAPLAN_DATABASE_URL": url, "PARAPLAN_SEED_DEMO_PLAN": "false", "PYTHONPATH": str(ROOT)}
    log = (workdir / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "paraplan_cli.main", "serve", "--host", "127.0.0.1", "--port",
                             str(port)], env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"server did not start:\n{(workdir / 'server.log').read_text()}")


def submit(base: str, form: dict[str, str], timeout_s: float = 180) -> str:
    resp = httpx.post(f"{base}/plans/new", data=form, timeout=30)
    if resp.status_code != 303:
        raise SystemExit(f"form rejected ({resp.status_code}): {re.findall(r'<li>(.*?)</li>', resp.text)}")
    plan_id = resp.headers["location"].rsplit("/", 1)[1]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = httpx.get(f"{base}/ui/status", params={"ids": plan_id}, timeout=10).json()[plan_id]
        if status in ("succeeded", "failed", "cancelled"):
            if status != "succeeded":
                raise SystemExit(f"{form['kind']} plan {plan_id} {status}")
            return plan_id
        time.sleep(0.5)
    raise SystemExit(f"{form['kind']} plan {plan_id} not solved within {timeout_s} s")


def timing(base: str, path: str, repeats: int) -> dict[str, float]:
    server, wall, size = [], [], 0
    with httpx.Client(base_url=base, timeout=30) as client:
        client.get(path)  # warm-up: template compilation, connection pool
        for _ in range(repeats):
            started = time.perf_counter()
            resp = client.get(path)
            wall.append(time.perf_counter() - started)
            server.append(float(resp.headers["server-timing"].split("dur=")[1]) / 1e3)
            size = len(resp.content)
    q = statistics.quantiles
    return {"server_p50": statistics.median(server), "server_p95": q(server, n=20)[-1],
            "wall_p50": statistics.median(wall), "wall_p95": q(wall, n=20)[-1], "kib": size / 1024}


def screenshots(base: str, pages: dict[str, str], out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    saved = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        for name, path in pages.items():
            page.goto(base + path)
            page.wait_for_function("() => typeof Chart !== 'undefined' && "
                                   "[...document.querySelectorAll('canvas[data-chart]')].every(c => Chart.getChart(c))")
            target = out / f"{name}.png"
            page.screenshot(path=str(target), full_page=True)
            saved.append(target)
        browser.close()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="paraplan-screens-"))
    url = f"sqlite:///{workdir / 'bench.db'}"
    upgrade(database_url=url)

    result, origin = big_result()
    started = time.perf_counter()
    big_id = fill(url, args.plans, result)
    print(f"stored {args.plans} solved plans, 128-layer result {origin}, in {time.perf_counter() - started:.1f} s")

    proc, base = serve(url, workdir)
    try:
        kinds = [k for k in FORMS if k in available_kinds()]
        missing = [k for k in FORMS if k not in kinds]
        if missing:
            print(f"no solver for {', '.join(missing)}: those pages are not shot")
        ids = {}
        for kind in kinds:
            started = time.perf_counter()
            ids[kind] = submit(base, FORMS[kind])
            print(f"{kind}: plan {ids[kind]} solved via the form in {time.perf_counter() - started:.1f} s")
        pages = {f"plan_{k}": f"/plans/{pid}" for k, pid in ids.items()}
        pages["plan_hybrid_128_layers"] = f"/plans/{big_id}"
        pages["plans_list"] = "/"
        for path in screenshots(base, pages, args.out):
            print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

        html = httpx.get(f"{base}/?limit=200", timeout=30).text
        cursor = ""
        while found := re.search(r"cursor=(\w+)", html):
            cursor = found.group(1)
            html = httpx.get(f"{base}/?limit=200&cursor={cursor}", timeout=30).text
        rows = {f"list of {args.plans} plans (newest 50)": "/",
                "list filtered kind=hybrid status=succeeded": "/?kind=hybrid&status=succeeded",
                "list, last page (cursor)": f"/?cursor={cursor}",
                "hybrid plan, 128 layers": f"/plans/{big_id}"}
        for kind, pid in ids.items():
            rows[f"{kind} plan page (form-submitted)"] = f"/plans/{pid}"
        print(f"\n{'page':<46} {'server p50':>10} {'server p95':>10} {'wall p50':>9} {'wall p95':>9} {'KiB':>6}")
        for name, url_path in rows.items():
            t = timing(base, url_path, args.repeats)
            print(f"{name:<46} {t['server_p50'] * 1e3:>8.1f}ms {t['server_p95'] * 1e3:>8.1f}ms "
                  f"{t['wall_p50'] * 1e3:>7.1f}ms {t['wall_p95'] * 1e3:>7.1f}ms {t['kib']:>6.0f}")
        print("\ngoal: <= 300 ms server time per page")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    main()
