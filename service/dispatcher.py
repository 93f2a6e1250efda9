"""The solver dispatcher: claims jobs from the database and runs each in a child process.

Each child has a hard wall-clock limit (killed past it), a memory cap (RLIMIT_AS) and a CPU-time cap. While
it runs, the dispatcher renews the job's lease and records the child's progress; if the lease is lost
(the plan was cancelled or another dispatcher took the job after this one stalled) the child is killed
and nothing is written. Children come from a forkserver with the solvers preloaded: starting one costs
a fork, not an interpreter start, and forking never happens from a multi-threaded server process.
"""

from __future__ import annotations

import ast
import logging
import multiprocessing
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

from service import jobs, runs, solve_child
from service.db.engine import Database
from service.errors import is_retryable_db_error
from service.settings import Settings
from solvers.documents import load_result
from solvers.kinds import solver_modules

log = logging.getLogger("paraplan.dispatcher")
_CTX: ForkServerContext | None = None
_CTX_LOCK = threading.Lock()


def _context() -> ForkServerContext:
    global _CTX
    with _CTX_LOCK:
        if _CTX is None:
            # Solver children share few cores with the server: one BLAS/OpenMP thread each.
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
                os.environ.setdefault(var, "1")
            ctx = multiprocessing.get_context("forkserver")
            # Preload what solves import, so that a child costs a fork; missing modules are skipped.
            ctx.set_forkserver_preload([*_main_imports(), "service.solve_child", "solvers.api", *solver_modules(),
                                        "ortools.sat.python.cp_model", "highspy", "scipy.optimize"])
            _CTX = ctx
        return _CTX


def warm_up() -> None:
    """Start the forkserver and wait for its preloading (one no-op child), before the dispatcher threads exist
    and before any claim: a claimed job must not spend its lease waiting for imports."""
    proc = _context().Process(target=time.sleep, args=(0,), daemon=True)
    proc.start()
    proc.join(300)


def _main_imports() -> list[str]:
    """Modules the parent's main module imports at top level.

    Each forkserver child re-runs the parent's main module (multiprocessing's "safe importing of main");
    unless its imports are already loaded in the forkserver, every child pays for them again (seconds for a
    CLI or a test runner). Python 3.11's ``"__main__"`` preload does not work for this, hence the list."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    names = [spec.name] if spec is not None and spec.name else []
    path = getattr(main, "__file__", None)
    if not path:
        return names
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return names
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def new_owner(name: str = "dispatcher") -> str:
    return f"{name}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class Outcome:
    status: str  # succeeded | failed | lost | released
    error: str | None = None


@dataclass
class DispatcherStats:
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    solve_s_by_kind: dict[str, list[float]] = field(default_factory=dict)


class Dispatcher:
    """Runs ``concurrency`` claim-and-solve loops until ``stop`` is set (or it runs out of work)."""

    def __init__(self, db: Database, settings: Settings, owner: str | None = None) -> None:
        self.db = db
        self.settings = settings
        self.owner = owner or new_owner()
        self.stop = threading.Event()
        self._wake = threading.Event()
        self._next_housekeeping = 0.0
        self.stats = DispatcherStats()
        self._lock = threading.Lock()

    # --- one job ---------------------------------------------------------------------------------
    def execute(self, job: jobs.ClaimedJob) -> Outcome:
        s = self.settings
        ctx = _context()
        parent, child = ctx.Pipe(duplex=False)
        args = (child, job.request, s.job_memory_limit_mib, s.job_time_limit_s)
        proc = ctx.Process(target=solve_child.run, args=args, name=f"paraplan-solve-{job.id[:8]}", daemon=True)
        started = time.monotonic()
        proc.start()
        child.close()
        deadline = started + s.job_time_limit_s
        renew_every = max(0.2, s.job_lease_s / 3)
        last_write = started
        progress: tuple[float, str] | None = None
        progress_dirty = False
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    self._kill(proc)
                    return self._fail(job, f"time limit of {s.job_time_limit_s:g} s exceeded")
                if self.stop.is_set():
                    self._kill(proc)
                    jobs.release_job(self.db, job.id, self.owner)
                    return Outcome("released")
                # Renew on schedule; record fresh progress at most twice a second.
                if now - last_write >= renew_every or (progress_dirty and now - last_write >= 0.5):
                    if not self._renew(job, progress):
                        self._kill(proc)
                        return Outcome("lost", "lease lost (cancelled or re-leased)")
                    last_write, progress_dirty = now, False
                if not parent.poll(min(0.25, max(0.0, deadline - now))):
                    if not proc.is_alive() and not parent.poll(0):
                        return self._fail(job, f"solver process died (exit code {proc.exitcode})")
                    continue
                try:
                    msg = parent.recv()
                except EOFError:
                    proc.join(1.0)
                    code = proc.exitcode
                    reason = "memory or CPU limit" if code is not None and code < 0 else "crash"
                    return self._fail(job, f"solver process ended without a result (exit code {code}, {reason})")
                if msg[0] == "progress":
                    progress, progress_dirty = (msg[1], msg[2]), True
                elif msg[0] == "ok":
                    elapsed = time.monotonic() - started
                    if jobs.complete_job(self.db, job.id, self.owner, load_result(job.kind, msg[1])):
                        self._record(job.kind, elapsed)
                        return Outcome("succeeded")
                    return Outcome("lost", "lease lost before the result was stored")
                elif msg[0] == "spec_error":
                    return self._fail(job, msg[1], msg[2], request_error=True)
                else:
                    return self._fail(job, msg[1])
        finally:
            parent.close()
            self._kill(proc)

    def _renew(self, job: jobs.ClaimedJob, progress: tuple[float, str] | None) -> bool:
        try:
            return jobs.renew_lease(self.db, job.id, self.owner, self.settings.job_lease_s,
                                    *(progress if progress else (None, None)))
        except Exception as err:  # a database hiccup: keep solving, the lease has slack until it expires
            if not is_retryable_db_error(err):
                raise
            log.warning("lease renewal failed for job %s: %s", job.id, err)
            return True

    def _fail(self, job: jobs.ClaimedJob, error: str, detail: list[Any] | None = None,
              request_error: bool = False) -> Outcome:
        if jobs.fail_job(self.db, job.id, self.owner, error, detail, request_error=request_error):
            return Outcome("failed", error)
        return Outcome("lost", "lease lost before the failure was stored")

    @staticmethod
    def _kill(proc: Any) -> None:
        if proc.is_alive():
            proc.kill()
        proc.join(5.0)

    def _record(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.stats.solve_s_by_kind.setdefault(kind, []).append(seconds)

    # --- loops -----------------------------------------------------------------------------------
    def run_once(self) -> Outcome | None:
        """Claim and execute one job; None when nothing was claimable."""
        job = jobs.claim_job(self.db, self.owner, self.settings.job_lease_s)
        if job is None:
            return None
        with self._lock:
            self.stats.claimed += 1
        log.info("job %s (plan %s, %s) claimed, attempt %d", job.id, job.plan_id, job.kind, job.attempt,
                 extra={"job_id": job.id, "plan_id": job.plan_id})
        outcome = self.execute(job)
        with self._lock:
            if outcome.status == "succeeded":
                self.stats.succeeded += 1
            elif outcome.status == "failed":
                self.stats.failed += 1
            elif outcome.status == "lost":
                self.stats.lost += 1
        log.info("job %s %s%s", job.id, outcome.status, f": {outcome.error}" if outcome.error else "",
                 extra={"job_id": job.id, "plan_id": job.plan_id})
        return outcome

    def wake(self) -> None:
        """A job was just queued (by this process): claim now instead of at the next poll."""
        self._wake.set()

    def shutdown(self) -> None:
        """Stop claiming; a job being solved is given back (requeued, its attempt not counted)."""
        self.stop.set()
        self._wake.set()

    def _idle(self) -> None:
        self._wake.wait(self.settings.dispatcher_poll_s)
        self._wake.clear()

    def housekeeping(self) -> None:
        """Every few seconds: fail jobs whose leases ran out on their last attempt, and requeue (or fail) runs
        whose worker stopped renewing, so that their state is right even when nobody claims."""
        now = time.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + 5.0
        with self.db.writing() as session:
            jobs.reap_exhausted(session)
            runs.reap_expired_runs(session)

    def loop(self, max_jobs: int | None = None, exit_when_idle: bool = False) -> None:
        while not self.stop.is_set():
            try:
                outcome = self.run_once()
                if outcome is None:
                    self.housekeeping()
            except Exception as err:
                if not is_retryable_db_error(err):
                    log.exception("dispatcher error")
                else:
                    log.warning("database unavailable: %s", err)
                self._idle()
                continue
            if outcome is None:
                if exit_when_idle:
                    return
                self._idle()
            if max_jobs is not None and self.stats.claimed >= max_jobs:
                return

    def run(self, concurrency: int | None = None, max_jobs: int | None = None, exit_when_idle: bool = False) -> None:
        """Run the loops in threads (each drives one child at a time) and wait for them."""
        n = concurrency or self.settings.dispatcher_concurrency
        warm_up()
        threads = [threading.Thread(target=self.loop, args=(max_jobs, exit_when_idle), daemon=True,
                                    name=f"dispatcher-{i}") for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def start_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, daemon=True, name="dispatcher")
        thread.start()
        return thread
