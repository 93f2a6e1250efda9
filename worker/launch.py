"""Launch paraplan's own training entrypoint with ``torch.distributed.run`` on this node.

Only ``worker.runtime.train`` is ever started, with arguments built here from the plan: a server can send
a plan, never a command. The launcher, not torchrun's ``--max-restarts`` (flaky with gloo), relaunches a
failed attempt.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRAIN_MODULE = "worker.runtime.train"


try:  # loaded here, not in the forked child: dlopen after fork in a threaded parent can deadlock
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL me when the process that launched me dies (Linux), so a killed
    daemon leaves no training behind. The ranks notice their launcher's death themselves (train.py)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Launch:
    """How one node starts its share of a run: its ranks, and for a multi-node run the c10d rendezvous (hosted by
    node 0 at ``rendezvous_endpoint``); checkpoints and data as the run asks."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    rendezvous_endpoint: str | None = None
    rendezvous_id: str = "paraplan"
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    dataset: Path | None = None
    dataset_dtype: str = "uint16"
    document_separator: int | None = None  # FlexSP with a dataset: the token id that ends each document
    lengths: Path | None = None  # FlexSP: the length stream (flexsp_train)
    max_length: int | None = None
    plan_budget_s: float | None = None
    static_sp: int | None = None  # FlexSP: the static-SP baseline instead of the planner's groupings


def torchrun_command(spec: Launch) -> list[str]:
    """torchrun with this node's ranks: standalone on one node, else joining the c10d rendezvous node 0 hosts."""
    if spec.nnodes > 1:
        assert spec.rendezvous_endpoint, "a multi-node launch needs node 0's rendezvous endpoint"
        where = [f"--nnodes={int(spec.nnodes)}", "--rdzv-backend=c10d", f"--rdzv-endpoint={spec.rendezvous_endpoint}",
                 f"--rdzv-id={spec.rendezvous_id}", f"--rdzv-conf=is_host={str(spec.node_rank == 0).lower()}"]
    else:
        where = ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={int(spec.nproc)}"]


def train_command(launch: Launch | int, plan_path: Path, steps: int, out: Path, progress: Path,
                  seed: int = 0) -> list[str]:
    spec = launch if isinstance(launch, Launch) else Launch(int(launch))
    cmd = [*torchrun_command(spec), "-m", TRAIN_MODULE, "--plan", str(plan_path), "--steps", str(int(steps)),
           "--out", str(out), "--progress", str(progress), "--seed", str(int(seed))]
    if spec.checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", str(spec.checkpoint_dir), "--checkpoint-every", str(int(spec.checkpoint_every))]
    if spec.dataset is not None:
        cmd += ["--dataset", str(spec.dataset), "--dataset-dtype", spec.dataset_dtype]
    if spec.document_separator is not None:
        cmd += ["--document-separator", str(int(spec.document_separator))]
    if spec.lengths is not None:
        cmd += ["--lengths", str(spec.lengths)]
    if spec.max_length is not None:
        cmd += ["--max-length", str(int(spec.max_length))]
    if spec.plan_budget_s is not None:
        cmd += ["--plan-budget-s", str(float(spec.plan_budget_s))]
    if spec.static_sp is not None:
        cmd += ["--static-sp", str(int(spec.static_sp))]
    return cmd


@dataclass
class Attempt:
    """One launch of the training: its files and, while it runs, its process."""

    workdir: Path
    nproc: int | Launch
    steps: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def out(self) -> Path:
        return self.workdir / "metrics.json"

    @property
    def progress(self) -> Path:
        return self.workdir / "progress.jsonl"

    @property
    def log(self) -> Path:
        return self.workdir / "train.log"

    def start(self, plan_doc: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        plan_path = self.workdir / "plan.json"
        plan_path.write_text(json.dumps(plan_doc))
        for f in (self.out, self.progress):
            f.unlink(missing_ok=True)
        cmd = train_command(self.nproc, plan_path, self.steps, self.out, self.progress)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                         cwd=self.workdir, preexec_fn=_die_with_parent)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM torchrun (it stops its ranks), SIGKILL after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def result(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.out.read_text())
            return data
        except (OSError, json.JSONDecodeError):
            return None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class ProgressTail:
    """Reads the progress lines rank 0 appends, each once."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new_lines(self) -> list[dict[str, Any]]:
        try:
            with self.path.open() as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind("\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def run_locally(plan_doc: dict[str, Any], nproc: int | Launch, steps: int, workdir: Path, timeout_s: float = 600.0,
                max_launches: int = 2) -> dict[str, Any]:
    """Run a plan on this machine without a server (benchmarks, tests); relaunches a failed attempt."""
    last = ""
    for launch in range(1, max_launches + 1):
        attempt = Attempt(workdir / f"launch-{launch}", nproc, steps)
        attempt.start(plan_doc)
        deadline = time.monotonic() + timeout_s
        while attempt.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        attempt.stop()
        result = attempt.result()
        if result is not None and "error" not in result:  # written after the last step (see daemon)
            result["launches"] = launch
            return result
        if result is not None:  # invalid plan: relaunching cannot help
            raise RuntimeError(result["error"])
        last = attempt.log_tail()
    raise RuntimeError(f"training failed after {max_launches} launches:\n{last}")
