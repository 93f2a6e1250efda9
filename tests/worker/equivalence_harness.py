"""Run by torchrun from test_equivalence.py: train every plan of a JSON list in one process group (one
start-up for many plans) and write {name: losses} from rank 0.

An optional fourth argument names a JSON file {name: [plan, fault]}: negative controls, each plan trained with
one part of context parallelism broken on purpose (``cp_faults``), in the same launch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.worker.cp_faults import fault
from worker.runtime.plan import from_document, load_plan
from worker.runtime.train import run_plan


def main() -> None:
    plans, steps, out = json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), Path(sys.argv[3])
    controls = json.loads(Path(sys.argv[4]).read_text()) if len(sys.argv) > 4 else {}
    runs = [(name, doc, None) for name, doc in plans.items()] + [(n, d, f) for n, (d, f) in controls.items()]
    dist.init_process_group("gloo")
    results: dict[str, object] = {}
    for name, doc, broken in runs:
        # No per-plan try/except: an exception on some ranks only would leave the others waiting in a
        # collective. A crash ends the whole launch (torchrun stops every rank) and the test shows stderr.
        with fault(broken):
            metrics = run_plan(from_document(*load_plan(doc), world_size=dist.get_world_size()), steps,
                               torch.device("cpu"))
        results[name] = {"loss": metrics["loss"], "notes": metrics["notes"]}
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
