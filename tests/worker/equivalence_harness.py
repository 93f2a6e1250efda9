"""Run by torchrun from test_equivalence.py: train every plan of a JSON list in one process group (one
start-up for many plans) and write {name: {"loss", "notes", "layers"[, "grads"]}} from rank 0 (``layers``: per
rank, the model layers of each pipeline stage it trains, as ``apply_plan`` cuts them; null without a pipeline).

An optional fourth argument names a JSON file {name: [plan, fault]}: negative controls, each plan trained with
one part of the runtime broken on purpose (``faults``), in the same launch. An optional fifth names a JSON file
with
- ``"gradients": [plan names]`` whose first-step gradients to record too (every control's are): per parameter
  name, the norm of its whole gradient after the step's gradient reduction, before the optimizer uses it, on
  every rank;
- ``"resumed": [plan names]`` to train again as ``resumed:<name>``: 2 steps with a checkpoint after each, then a
  second run resuming from it to the end (its whole loss curve, and per rank how many parameters the optimizer
  holds state for against how many it lists).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tests.worker.faults import fault
from worker.runtime import train
from worker.runtime.model import blocks
from worker.runtime.parallelize import ParallelModel
from worker.runtime.plan import from_document, load_plan
from worker.runtime.train import run_plan


def _gradient_norms(pm: ParallelModel) -> dict[str, float]:
    """Norm of each parameter's whole gradient (collective over each DTensor's mesh: every rank of a stage walks
    the same parameters in the same order); under ZeRO-1 only the parameters this rank steps have one."""
    out = {}
    for module in pm.modules:
        for name, p in module.named_parameters():
            g = p.grad
            if g is None:
                continue
            whole = g.full_tensor() if isinstance(g, DTensor) else g
            out[name.replace("inner.", "")] = float(whole.norm())  # full recompute wraps a block in ``inner``
    return out


@contextlib.contextmanager
def _built(into: list[ParallelModel], gradients: dict[str, float] | None = None) -> Iterator[None]:
    """While active, what ``train.parallelize`` builds is appended to ``into``; with ``gradients``, the first
    optimizer step of the first one records its gradients there."""
    build = train.parallelize

    def parallelize(*args: Any, **kwargs: Any) -> ParallelModel:
        pm = build(*args, **kwargs)
        into.append(pm)
        assert pm.optimizer is not None
        step = pm.optimizer.step

        def recorded(*a: Any, **k: Any) -> Any:
            if gradients is not None and not gradients:
                gradients.update(_gradient_norms(pm))
            return step(*a, **k)

        pm.optimizer.step = recorded  # type: ignore[method-assign]
        return pm

    with mock.patch.object(train, "parallelize", parallelize):
        yield


def _resumed(doc: dict[str, Any], steps: int, checkpoints: Path) -> dict[str, Any]:
    plan = from_document(*load_plan(doc), world_size=dist.get_world_size())
    run_plan(plan, 2, torch.device("cpu"), checkpoint_dir=checkpoints, checkpoint_every=1)  # saves after step 1
    built: list[ParallelModel] = []
    with _built(built):
        metrics = run_plan(plan, steps, torch.device("cpu"), checkpoint_dir=checkpoints, checkpoint_every=1)
    optimizer = built[0].optimizer
    assert optimizer is not None
    held = [len(optimizer.state), sum(len(g["params"]) for g in optimizer.param_groups)]
    every: list[list[int]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, held)
    return {"loss": metrics["loss"], "notes": metrics["notes"], "resumed_from_step": metrics["resumed_from_step"],
            "optimizer_state_of": every}


def main() -> None:
    plans, steps, out = json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), Path(sys.argv[3])
    controls = json.loads(Path(sys.argv[4]).read_text()) if len(sys.argv) > 4 else {}
    extra = json.loads(Path(sys.argv[5]).read_text()) if len(sys.argv) > 5 else {}
    gradients = set(extra.get("gradients", []))
    runs = [(name, doc, None) for name, doc in plans.items()] + [(n, d, f) for n, (d, f) in controls.items()]
    dist.init_process_group("gloo")
    results: dict[str, dict[str, Any]] = {}
    for name, doc, broken in runs:
        # No per-plan try/except: an exception on some ranks only would leave the others waiting in a
        # collective. A crash ends the whole launch (torchrun stops every rank) and the test shows stderr.
        grads: dict[str, float] = {}
        record = name in gradients or broken is not None
        built: list[ParallelModel] = []
        with fault(broken), _built(built, grads if record else None):
            plan = from_document(*load_plan(doc), world_size=dist.get_world_size())
            metrics = run_plan(plan, steps, torch.device("cpu"))
        layers: list[object] = [None] * dist.get_world_size()
        if plan.pp > 1:  # the stages as apply_plan cut them
            dist.all_gather_object(layers, [sorted(int(k) for k in blocks(m)) for m in built[0].modules])
        results[name] = {"loss": metrics["loss"], "notes": metrics["notes"], "layers": layers}
        if record:  # every rank's: each holds the gradients of its own pipeline stage
            every: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
            dist.all_gather_object(every, grads)
            results[name]["grads"] = every
    for name in extra.get("resumed", []):
        results[f"resumed:{name}"] = _resumed(plans[name], steps, out.parent / f"checkpoints-{name}")
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
