"""The worker daemon: ``paraplan worker --server URL --token T``.

Loop: register -> long-poll ``/runs/claim`` (with jitter) -> run the plan with ``torch.distributed.run``
on this node -> report progress, complete or fail -> poll again. A worker-liveness heartbeat runs in its
own thread for the daemon's life; a run-lease heartbeat runs in another while a run executes. The daemon
stops on 401/403 (a revoked token cannot be fixed by retrying), on SIGTERM/SIGINT (the current run is
handed back as a retryable failure), and aborts a run when the server answers 409 (lease lost: the run
was reassigned or cancelled).

It only ever starts ``worker.runtime.train`` with arguments derived from the plan (see ``worker.launch``);
nothing the server sends is executed as a command. A failed launch is relaunched by the daemon itself
(``max_launches``) before the run is failed as retryable (the server may give it to another worker).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import random
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import httpx

from solvers.errors import SpecError
from solvers.strategy import Schedule
from worker.api import LeaseLost, Unauthorized, WorkerApi, WorkerApiError
from worker.launch import Attempt, Launch, ProgressTail

log = logging.getLogger("paraplan.worker")
EXIT_UNAUTHORIZED = 3
EXIT_SERVER_UNAVAILABLE = 4


class NodeTooSmall(RuntimeError):
    """The plan needs more devices than this node has."""


@dataclass
class DaemonConfig:
    server: str
    token: str
    name: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "paraplan-worker")
    claim_wait_s: float = 10.0
    poll_jitter_s: float = 1.0
    max_launches: int = 2
    max_runs: int | None = None  # stop after this many runs (tests, one-shot nodes)
    idle_exit_s: float | None = None  # stop after this long without work (tests)
    gpus: int | None = None  # ranks this host offers (default: its CUDA devices; on CPU max(4, cores))
    # where runs keep their checkpoints: storage every node of a run sees (PARAPLAN_CHECKPOINT_DIR)
    checkpoint_root: Path | None = field(default_factory=lambda: Path(os.environ["PARAPLAN_CHECKPOINT_DIR"])
                                         if os.environ.get("PARAPLAN_CHECKPOINT_DIR") else None)
    # the address other nodes reach this one at, as node 0 of a multi-node run (PARAPLAN_WORKER_ADDRESS)
    address: str = field(default_factory=lambda: os.environ.get("PARAPLAN_WORKER_ADDRESS") or socket.gethostname())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


def host_info(name: str, gpus_declared: int | None = None) -> dict[str, Any]:
    """What the server records about this node at registration (``gpus``: the ranks it offers a run)."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        props = torch.cuda.get_device_properties(0)
        gpus, gpu_name, memory = torch.cuda.device_count(), props.name, props.total_memory / 2**30
    else:
        gpus, gpu_name = max(4, os.cpu_count() or 1), "cpu"  # CPU hosts run gloo ranks, oversubscribed if need be
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "name": name, "host": socket.gethostname(), "gpus": gpus_declared or gpus, "gpu_name": gpu_name,
        "memory_gib": round(memory, 2), "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
        "capabilities": {
            "backend": "nccl" if cuda else "gloo", "platform": platform.platform(),
            "parallelisms": ["ddp", "fsdp2", "tp", "megatron-sp", "ulysses", "pp", "recompute"],
            "schedules": list(get_args(Schedule)),
        },
    }


class Daemon:
    def __init__(self, config: DaemonConfig, api: WorkerApi | None = None) -> None:
        self.config = config
        self.stop = threading.Event()
        self.api = api or WorkerApi(config.server, config.token, sleep=self.stop.wait, cancelled=self.stop.is_set)
        self.unauthorized = threading.Event()
        self.worker_id = ""
        self.heartbeat_s = 5.0
        self.lease_s = 20.0  # the server's run lease (registration says)
        self.part_done: set[str] = set()  # multi-node runs whose ranks on this node have finished
        self.runs_done = 0

    # --- life cycle --------------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until stopped; returns the process exit code."""
        try:
            info = host_info(self.config.name, self.config.gpus)
            reg = self.api.register(info)
            self.worker_id, self.heartbeat_s = reg["id"], float(reg.get("heartbeat_interval_s", 5.0))
            self.lease_s = float(reg.get("lease_s", 4 * self.heartbeat_s))
            log.info("registered as %s (%s x %s)", self.worker_id, info["gpus"], info["gpu_name"])
            threading.Thread(target=self._liveness, name="worker-heartbeat", daemon=True).start()
            self._serve()
        except Unauthorized as err:
            log.error("stopping: the server refused the token (%s)", err)
            return EXIT_UNAUTHORIZED
        except (WorkerApiError, httpx.TransportError) as err:
            if self.stop.is_set():
                return 0
            log.error("stopping: the server is unreachable or failing after retries (%s)", err)
            return EXIT_SERVER_UNAVAILABLE
        finally:
            self.stop.set()
            self.api.close()
        return EXIT_UNAUTHORIZED if self.unauthorized.is_set() else 0

    def _serve(self) -> None:
        idle_since = time.monotonic()
        while not self.stop.is_set():
            if self.unauthorized.is_set():
                raise Unauthorized(401, "refused during heartbeat")
            try:
                run = self.api.claim(self.worker_id, self.config.claim_wait_s,
                                     endpoint=f"{self.config.address}:{free_port()}")
            except (WorkerApiError, httpx.TransportError) as err:  # already retried with back-off
                log.warning("claim failed (%s); backing off", err)
                self.stop.wait(random.uniform(1.0, 5.0))
                continue
            if run is None:
                if self.config.idle_exit_s and time.monotonic() - idle_since > self.config.idle_exit_s:
                    return
                # Jitter spreads the next long-polls of many idle workers.
                self.stop.wait(random.uniform(0.0, self.config.poll_jitter_s))
                continue
            self.execute(run)
            self.runs_done += 1
            idle_since = time.monotonic()
            if self.config.max_runs is not None and self.runs_done >= self.config.max_runs:
                return

    def _liveness(self) -> None:
        while not self.stop.wait(self.heartbeat_s):
            try:
                self.api.worker_heartbeat(self.worker_id)
            except Unauthorized:
                self.unauthorized.set()
                self.stop.set()
            except (WorkerApiError, OSError) as err:
                log.debug("worker heartbeat failed: %s", err)
            except Exception as err:  # the liveness thread must outlive any transport surprise
                log.debug("worker heartbeat failed: %s", err)

    # --- one run -----------------------------------------------------------------------------------
    def execute(self, run: dict[str, Any]) -> None:
        run_id, plan_doc = run["id"], run["plan"]
        nnodes = int(run.get("nnodes") or 1)
        log.info("claimed run %s (plan %s, attempt %s, %s steps, node %s of %s)", run_id, run["plan_id"],
                 run.get("attempt"), run["steps"], run.get("node_rank", 0), nnodes)
        try:
            world = self._world_size(plan_doc, nnodes)
        except NodeTooSmall as err:  # another worker may be big enough
            self._fail(run_id, str(err), retryable=True)
            return
        except SpecError as err:
            self._fail(run_id, f"invalid plan: {err}", retryable=False)
            return
        lost = threading.Event()
        lease = threading.Thread(target=self._hold_lease, args=(run_id, lost), name="run-lease", daemon=True)
        lease.start()
        try:
            self._launch_until_done(run, plan_doc, self._launch(run, world // nnodes, nnodes), lost)
        finally:
            lost.set()  # ends the lease thread
            lease.join(timeout=2 * self.heartbeat_s)

    def _launch(self, run: dict[str, Any], nproc: int, nnodes: int) -> Launch:
        """This node's share of the run, with the run's checkpoints (one directory per run under the shared
        checkpoint root, so that any attempt on any node resumes from it) and dataset."""
        every = run.get("checkpoint_every_steps")
        root = self.config.checkpoint_root or self.config.workdir / "checkpoints"
        dataset = run.get("dataset") or {}
        return Launch(nproc=nproc, nnodes=nnodes, node_rank=int(run.get("node_rank") or 0),
                      rendezvous_endpoint=run.get("rendezvous_endpoint"),
                      rendezvous_id=f"{run['id']}-{run.get('attempt', 0)}",
                      checkpoint_dir=root / f"run-{run['id']}" if every else None, checkpoint_every=int(every or 0),
                      dataset=Path(dataset["path"]) if dataset.get("path") else None,
                      dataset_dtype=str(dataset.get("dtype", "uint16")),
                      document_separator=dataset.get("document_separator"))

    def _world_size(self, plan_doc: dict[str, Any], nnodes: int = 1) -> int:
        """The plan's ranks on all its nodes; NodeTooSmall where this node's GPUs cannot hold its share (count,
        memory)."""
        import torch

        from solvers.run_flexsp import check_flexsp_runnable, is_flexsp_plan
        from solvers.run_spindle import is_spindle_plan, load_program
        from worker.runtime.plan import from_document, load_plan

        # SpecError names the bad field, or the kind the runtime cannot run; nothing is launched then
        if is_spindle_plan(plan_doc):
            program = load_program(plan_doc)
            gpu, world, need = (str(plan_doc["request"].get("cluster", {}).get("gpu", "A100-80GB")),
                                program.world_size, program.predicted_peak_memory_gib)
        elif is_flexsp_plan(plan_doc):
            layout = check_flexsp_runnable(plan_doc)
            gpu, world, need = layout.gpu_name, layout.world_size, layout.peak_memory_gib
        else:
            request, result = load_plan(plan_doc)
            plan = from_document(request, result)
            gpu, world = plan.gpu_name, plan.world_size
            need = result.estimate.peak_memory_gib if result is not None else None
        if gpu.lower() == "cpu":
            return world
        if not torch.cuda.is_available():  # CPU ranks would compute what the plan prices on GPUs in another precision
            raise NodeTooSmall(f"the plan is for {gpu} GPUs; this node has no CUDA device")
        per_node = world // nnodes
        if per_node > torch.cuda.device_count():
            raise NodeTooSmall(f"the plan needs {per_node} GPUs on one node; this node has "
                               f"{torch.cuda.device_count()}")
        # a plan sized for a larger device would only run out of memory after the launch and warm-up
        have = torch.cuda.get_device_properties(0).total_memory / 2**30
        if need is not None and need > have:
            raise NodeTooSmall(f"the plan's estimate needs {need:.2f} GiB per GPU; this node's GPUs give CUDA "
                               f"{have:.2f} GiB")
        return world

    def _hold_lease(self, run_id: str, lost: threading.Event) -> None:
        while not lost.wait(self.heartbeat_s):
            try:
                self.api.run_heartbeat(run_id, self.worker_id)
            except LeaseLost:
                if run_id in self.part_done:
                    log.info("run %s: left this attempt (completed by the node with rank 0, or re-queued)", run_id)
                else:
                    log.warning("run %s: lease lost; aborting it", run_id)
                lost.set()
            except Unauthorized:
                self.unauthorized.set()
                self.stop.set()
            except Exception as err:  # transient: the next beat retries; an expired lease answers 409 then
                log.debug("run %s: heartbeat failed: %s", run_id, err)

    def _launch_until_done(self, run: dict[str, Any], plan_doc: dict[str, Any], launch: Launch,
                           lost: threading.Event) -> None:
        run_id = run["id"]
        base = self.config.workdir / f"run-{run_id}-attempt-{run.get('attempt', 0)}"
        last_error = ""
        # One node cannot rejoin a rendezvous the others have left: a multi-node run is retried whole, by the server.
        launches = self.config.max_launches if launch.nnodes == 1 else 1
        for number in range(1, launches + 1):
            attempt = Attempt(base / f"launch-{number}", launch, int(run["steps"]))
            attempt.start(plan_doc)
            tail = ProgressTail(attempt.progress)
            while attempt.poll() is None and not lost.is_set() and not self.stop.is_set():
                self._relay_progress(run_id, tail, lost)
                time.sleep(0.2)
            if lost.is_set() or self.stop.is_set():
                attempt.stop()
                if not lost.is_set():
                    self._fail(run_id, "worker shut down during the run", retryable=True)
                return
            self._relay_progress(run_id, tail, lost)
            result = attempt.result()
            if result is not None and "error" not in result:
                # The metrics file is written atomically after the last step: a crash in teardown after it
                # does not undo the training, so the run counts (the exit code is recorded).
                result.update({"launches": number, "worker_id": self.worker_id, "host": socket.gethostname(),
                               "exit_code": attempt.poll(), "nnodes": launch.nnodes})
                try:
                    self.api.complete(run_id, self.worker_id, result)
                    log.info("run %s succeeded: %.4g s/step", run_id, result.get("step_time_s", float("nan")))
                except LeaseLost:
                    log.warning("run %s finished after its lease was lost; result dropped", run_id)
                return
            if result is not None and "error" in result:
                self._fail(run_id, f"invalid plan: {result['error']}", retryable=False)
                return
            if launch.nnodes > 1 and attempt.poll() == 0:
                # this node's ranks finished; global rank 0 (on another node) writes and reports the metrics
                log.info("run %s: node %d done", run_id, launch.node_rank)
                self._await_report(run_id, lost)
                return
            last_error = f"launch {number} exited with {attempt.poll()}:\n{attempt.log_tail()}"
            log.warning("run %s: launch %d failed (exit %s)", run_id, number, attempt.poll())
        self._fail(run_id, last_error, retryable=True)

    def _await_report(self, run_id: str, lost: threading.Event) -> None:
        """Hold this node's lease (the lease thread beats on) until the node with global rank 0 has reported the run:
        the heartbeat's 409 once the run is completed (or re-queued, cancelled); at most one lease. A finished node
        that let its lease lapse while rank 0's node was still writing its metrics would send a run about to
        complete back to the queue."""
        self.part_done.add(run_id)
        try:
            lost.wait(self.lease_s)
        finally:
            self.part_done.discard(run_id)

    def _relay_progress(self, run_id: str, tail: ProgressTail, lost: threading.Event) -> None:
        for step in tail.new_lines():
            try:
                self.api.report_step(run_id, self.worker_id, step)
            except LeaseLost:
                lost.set()
                return
            except WorkerApiError as err:
                log.debug("run %s: progress report failed: %s", run_id, err)

    def _fail(self, run_id: str, error: str, retryable: bool) -> None:
        with contextlib.suppress(LeaseLost):
            self.api.fail(run_id, self.worker_id, error, retryable)
        log.warning("run %s failed (%s): %s", run_id, "retryable" if retryable else "final", error[:300])


def main(server: str, token: str, **options: Any) -> int:
    """Entry point of ``paraplan worker``; SIGTERM / SIGINT stop it gracefully."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    daemon = Daemon(DaemonConfig(server=server, token=token, **options))

    def request_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        daemon.stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    code = daemon.run()
    if code:
        raise SystemExit(code)
    return code


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="paraplan worker daemon")
    ap.add_argument("--server", required=True)
    ap.add_argument("--token", default=os.environ.get("PARAPLAN_WORKER_TOKEN"))
    ap.add_argument("--name")
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--max-runs", type=int)
    ap.add_argument("--idle-exit-s", type=float)
    ap.add_argument("--claim-wait-s", type=float, default=10.0)
    ap.add_argument("--gpus", type=int, help="ranks this host offers a run (default: its GPUs; on CPU max(4, cores))")
    a = ap.parse_args()
    opts = {k: v for k, v in {"name": a.name, "workdir": a.workdir, "max_runs": a.max_runs,
                              "idle_exit_s": a.idle_exit_s, "claim_wait_s": a.claim_wait_s,
                              "gpus": a.gpus}.items() if v is not None}
    main(a.server, a.token, **opts)
