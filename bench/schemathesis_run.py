"""schemathesis against the live OpenAPI schema of a real ``paraplan serve`` (uvicorn subprocess, fresh SQLite).

Fixed seed, bounded time, admin token (so mutating endpoints are exercised past auth). The counts are taken
from the server's own JSON access log, not from schemathesis: every request the server answered is counted,
by status class, and any 5xx is listed.

    .venv/bin/python bench/schemathesis_run.py                      # >= 2,000 requests (about 2-4 min)
    .venv/bin/python bench/schemathesis_run.py --max-examples 3 --max-time 60   # the suite's sample
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.migrate import upgrade  # noqa: E402
from tests.conftest import create_token, start_server  # noqa: E402
from tests.service.requests import tiny_spindle  # noqa: E402

CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"


@dataclass
class FuzzReport:
    st_exit_code: int
    st_summary: str
    wall_s: float
    by_status: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(self.by_status.values())

    def table(self) -> str:
        classes = Counter(f"{s // 100}xx" for s in self.by_status.elements())
        rows = [("requests answered (server log)", str(self.requests)),
                *((f"  {c}", str(n)) for c, n in sorted(classes.items())),
                ("5xx responses", str(len(self.server_errors))),
                ("schemathesis exit code (0 = every check passed)", str(self.st_exit_code)),
                ("schemathesis", self.st_summary),
                ("wall time", f"{self.wall_s:.0f} s")]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _access_lines(log: str) -> list[dict[str, object]]:
    out = []
    for raw in log.splitlines():
        if raw.startswith("{"):
            line = json.loads(raw)
            if line.get("logger") == "paraplan.access":
                out.append(line)
    return out


def fuzz(workdir: Path, seed: int = 20261130, max_examples: int = 20, max_time_s: int = 240,
         workers: int = 1) -> FuzzReport:
    """Serve a fresh migrated SQLite database with one stored plan, fuzz it, and count what the server saw."""
    import httpx

    url = f"sqlite:///{workdir / 'fuzz.db'}"
    upgrade(database_url=url)
    server = start_server(url, workdir, dispatcher=True, job_time_limit_s=20)
    try:
        admin = create_token(url, "admin")
        # one solved plan, so that reads, exports and runs reach real data and not only 404s
        httpx.post(f"{server.url}/v1/plans?wait=30", json=tiny_spindle(0), timeout=60,
                   headers={"Authorization": f"Bearer {admin}"}).raise_for_status()
        t0 = time.monotonic()
        st = subprocess.run(
            [str(Path(sys.executable).with_name("st")), "run", f"{server.url}/openapi.json",
             "-H", f"Authorization: Bearer {admin}", "--seed", str(seed), "--max-examples", str(max_examples),
             "--max-time", str(max_time_s), "--workers", str(workers), "--checks", CHECKS,
             "--phases", "examples,coverage,fuzzing", "--request-timeout", "40", "--generation-database", "none",
             "--no-color", "--output-sanitize", "true"],
            cwd=workdir, capture_output=True, text=True, timeout=max_time_s + 120)
        wall = time.monotonic() - t0
    finally:
        server.stop()
    (workdir / "schemathesis.out").write_text(st.stdout + st.stderr)
    summary = next((ln.strip("= ") for ln in reversed(st.stdout.splitlines()) if " in " in ln and "=" in ln), "")
    report = FuzzReport(st.returncode, summary, wall)
    for line in _access_lines(server.logs()):
        status = int(str(line["status"]))
        report.by_status[status] += 1
        if status >= 500:
            report.server_errors.append(f"{line['method']} {line['path']} -> {status}")
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--max-examples", type=int, default=20, help="per operation and phase")
    ap.add_argument("--max-time", type=int, default=240, help="seconds for the whole schemathesis run")
    ap.add_argument("--workers", type=int, default=1,
                    help="schemathesis threads (1: hypothesis lambda introspection is not thread-safe on 3.11)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="paraplan-fuzz-") as tmp:
        report = fuzz(Path(tmp), args.seed, args.max_examples, args.max_time, args.workers)
        print(report.table())
        if report.st_exit_code != 0 or report.server_errors:
            print((Path(tmp) / "schemathesis.out").read_text()[-6000:])
            print("\n".join(report.server_errors[:50]))
    return 0 if report.st_exit_code == 0 and not report.server_errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
