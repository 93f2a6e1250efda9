"""Run by torchrun from test_moe_equivalence.py (one start-up for every case): train each MoE plan of a JSON file
in one process group, the negative controls with a fault injected into the runtime, and one plan twice across a
checkpoint; rank 0 writes {name: {"loss", "notes", "moe_alltoall"}} (asserting here would leave the other ranks
waiting in a collective)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist

from worker.runtime import parallelize
from worker.runtime.expert_parallel import ExpertShard
from worker.runtime.moe import MoELayer
from worker.runtime.plan import from_document, load_plan
from worker.runtime.train import run_plan

_shard = MoELayer.sharded_from


def _next_ranks_experts(full: MoELayer, group: dist.ProcessGroup | None, etp_group: dist.ProcessGroup | None = None,
                        token_group: dist.ProcessGroup | None = None) -> MoELayer:
    """Fault: each rank holds the experts of the next expert-parallel rank, so the dispatch delivers every token
    to the wrong experts (expert TP 1 only)."""
    layer = _shard(full, group, etp_group, token_group)
    n = layer.experts.count
    lo = (layer.ep_rank + 1) % layer.ep * n
    with torch.no_grad():
        for name in ("w1", "w2", "w3"):
            dst = getattr(layer.experts, name)
            if dst is not None:
                dst.copy_(getattr(full.experts, name)[lo:lo + n])
    return layer


def _no_expert_dp_reduction(shards: list[ExpertShard], zero: int, data_shards: int,
                            param_dtype: torch.dtype | None = None) -> Callable[[], None] | None:
    """Fault: expert gradients are never reduced over expert-dp (each replica keeps its own tokens' gradient)."""
    for shard in shards:
        shard.layer.experts.grad_scale = 1.0 / data_shards
    return None


@contextlib.contextmanager
def fault(name: str) -> Iterator[None]:
    if name == "wrong-expert-rank":
        with mock.patch.object(MoELayer, "sharded_from", _next_ranks_experts):
            yield
    elif name == "no-expert-dp-reduction":
        with mock.patch.object(parallelize, "expert_data_parallel", _no_expert_dp_reduction):
            yield
    else:
        raise ValueError(name)


def _run(doc: dict[str, Any], steps: int, **kwargs: Any) -> dict[str, Any]:
    metrics = run_plan(from_document(*load_plan(doc), world_size=dist.get_world_size()), steps, torch.device("cpu"),
                       **kwargs)
    return {"loss": metrics["loss"], "notes": metrics["notes"], "moe_alltoall": metrics.get("moe_alltoall"),
            "resumed_from_step": metrics["resumed_from_step"]}


def main() -> None:
    spec, steps, out = json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    results: dict[str, object] = {}
    for name, doc in spec["plans"].items():
        results[name] = _run(doc, steps)
    for name, (doc, fault_name) in spec["controls"].items():
        with fault(fault_name):
            results[name] = _run(doc, steps)
    if "checkpoint" in spec:  # interrupted after steps // 2 (a checkpoint), then resumed by a fresh model
        ckpt = out.parent / "checkpoints"
        results["checkpoint-first"] = _run(spec["checkpoint"], steps, checkpoint_dir=ckpt,
                                           checkpoint_every=steps // 2)
        results["checkpoint-resumed"] = _run(spec["checkpoint"], steps, checkpoint_dir=ckpt)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
