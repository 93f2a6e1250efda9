"""Run by torchrun from test_equivalence.py: train every plan of a JSON list in one process group (one
start-up for many plans) and write {name: {"loss", "notes", "layers"}} from rank 0 (``layers``: per rank, the
model layers of each pipeline stage it trains, as ``apply_plan`` cuts them; null without a pipeline)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from worker.runtime.model import blocks
from worker.runtime.parallelize import parallelize
from worker.runtime.plan import from_document, load_plan
from worker.runtime.train import run_plan


def main() -> None:
    plans, steps, out = json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    results: dict[str, object] = {}
    for name, doc in plans.items():
        # No per-plan try/except: an exception on some ranks only would leave the others waiting in a
        # collective. A crash ends the whole launch (torchrun stops every rank) and the test shows stderr.
        plan = from_document(*load_plan(doc), world_size=dist.get_world_size())
        metrics = run_plan(plan, steps, torch.device("cpu"))
        layers: list[object] = [None] * dist.get_world_size()
        if plan.pp > 1:  # the stages as apply_plan cuts them (DDP would hide a whole model's blocks)
            held = [sorted(int(k) for k in blocks(m)) for m in parallelize(plan, 0, torch.device("cpu")).modules]
            dist.all_gather_object(layers, held)
        results[name] = {"loss": metrics["loss"], "notes": metrics["notes"], "layers": layers}
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
