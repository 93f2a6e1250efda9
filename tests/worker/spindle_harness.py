"""Run by torchrun from test_spindle_runtime.py: train every Spindle plan of a JSON file {name: [plan, fault]}
in one process group (one start-up for every case) and write, from rank 0, {name: {"task_loss": per iteration
{task: loss}, "grads": per rank {parameter: norm of its synchronised first-iteration gradient}}}.

A fault breaks one part of the real runtime for its case (``SPINDLE_FAULTS``), the negative controls."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist

from solvers.run_spindle import SpindleProgram, load_program
from worker.runtime import spindle


def _edge_zeroed(sends: list, recvs: list, backward: bool) -> None:
    """The activations a slice receives from another device arrive as zeros."""
    _real_exchange(sends, recvs, backward)
    if not backward:
        for _, buf in recvs:
            buf.zero_()


def _gradients_kept(sends: list, recvs: list, backward: bool) -> None:
    """The backward sends no gradient back across devices (the producer sees zeros)."""
    if backward:
        for _, buf in recvs:
            buf.zero_()
        return
    _real_exchange(sends, recvs, backward)


def _shared_unsynced(program: SpindleProgram) -> dict:
    """Modules used by several tasks keep each rank's own gradients (no sum across tasks or devices)."""
    tasks: dict[str, set[str]] = {}
    for op in program.metaops.values():
        tasks.setdefault(op.module, set()).add(op.task)
    return {k: v for k, v in _real_sync_groups(program).items() if len(tasks[k[0]]) == 1}


_real_exchange = spindle._exchange
_real_sync_groups = spindle.sync_groups
SPINDLE_FAULTS = {
    "edge-zeroed": ("worker.runtime.spindle._exchange", _edge_zeroed),
    "gradients-kept": ("worker.runtime.spindle._exchange", _gradients_kept),
    "shared-unsynced": ("worker.runtime.spindle.sync_groups", _shared_unsynced),
}


@contextlib.contextmanager
def fault(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    target, replacement = SPINDLE_FAULTS[name]
    with mock.patch(target, replacement):
        yield


def main() -> None:
    cases, steps, out = json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    results: dict[str, Any] = {}
    for name, (doc, broken) in cases.items():
        with fault(broken):
            runner = spindle.SpindleRunner(load_program(doc, dist.get_world_size()), torch.device("cpu"))
            grads: dict[str, float] = {}
            record = functools.partial(lambda r, into: into.update(r.gradients()), runner, grads)
            losses = [runner.iteration(step, record if step == 0 else None) for step in range(steps)]
        every: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(every, grads)
        results[name] = {"task_loss": losses, "grads": every}
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
