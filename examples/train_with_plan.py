"""Ask paraplan for a parallel plan for *your* model, apply it, and train - the whole loop in one script.

    # on a CPU host (gloo), against a running server:
    python -m torch.distributed.run --standalone --nproc-per-node 4 examples/train_with_plan.py \
        --server http://127.0.0.1:8000 --token $PARAPLAN_TOKEN --steps 10
    # or with a plan document saved earlier (GET /v1/plans/{id}):
    python -m torch.distributed.run --standalone --nproc-per-node 4 examples/train_with_plan.py --plan plan.json

Rank 0 requests the plan and broadcasts it, so the server sees one request per job. The model is this
script's own (a Decoder of its chosen size, built identically on every rank from one seed); the plan decides
how it is split: ``apply_plan`` applies data / tensor / sequence / pipeline parallelism and recompute with
PyTorch's own APIs. The script prints one line per step and, at the end, one JSON line with the losses.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.client import PlanClient, apply_plan
from worker.runtime.model import Decoder, ModelConfig

# This job's model and batch, described in the contract's terms so the planner can cost them.
MODEL = {"name": "my-llama", "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "num_kv_heads": 4,
         "ffn_hidden_size": 256, "vocab_size": 256, "mlp": "swiglu"}
BATCH, SEQ = 8, 64


def plan_request(world: int, on_gpu: bool) -> dict:
    return {"kind": "hybrid", "model": MODEL,
            "cluster": {"gpu": "H100-SXM" if on_gpu else "cpu", "nodes": 1, "gpus_per_node": world},
            "training": {"global_batch_size": BATCH, "seq_length": SEQ, "precision": "bf16" if on_gpu else "fp32"},
            # plan only what paraplan's runtime (torchtitan-style) runs as planned: apply_plan refuses anything else
            "constraints": {"target": "torchtitan"}}


def my_data(step: int, vocab: int) -> torch.Tensor:
    """Stand-in for a real data loader: the same global batch on every rank (the plan slices it)."""
    return torch.randint(0, vocab, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(step))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server")
    ap.add_argument("--token", default=os.environ.get("PARAPLAN_TOKEN"))
    ap.add_argument("--plan", type=Path, help="a plan document instead of asking a server")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    box: list[object] = [None]
    if rank == 0:
        if args.plan:
            box[0] = json.loads(args.plan.read_text())
        else:
            with PlanClient(args.server, args.token) as client:
                box[0] = client.plan(plan_request(world, on_gpu), wait_s=120)
    dist.broadcast_object_list(box, src=0)
    plan_doc = box[0]
    assert isinstance(plan_doc, dict)

    torch.manual_seed(1234)  # identical initial weights on every rank; the plan shards them
    cfg = ModelConfig(num_layers=4, hidden_size=128, num_heads=4, num_kv_heads=4, head_dim=32,
                      ffn_hidden_size=256, vocab_size=256)
    model = Decoder(cfg).to(device)
    pm = apply_plan(plan_doc, model, device)
    if rank == 0:
        print(f"plan {plan_doc.get('id', '-')}: {pm.plan.describe()} notes={pm.notes}",
              flush=True)
    losses = []
    for step in range(args.steps):
        start = time.perf_counter()
        losses.append(pm.train_step(my_data(step, cfg.vocab_size)))
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.4f} ({time.perf_counter() - start:.3f} s)", flush=True)
    if rank == 0:
        print(json.dumps({"layout": pm.plan.describe(), "loss": losses}), flush=True)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip gloo teardown (see worker/runtime/train.py)
