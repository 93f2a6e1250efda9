"""Where a plan's training step goes on the worker runtime: the step of each plan timed by part, on 4 gloo ranks in
one launch (plans round-robin, as ``bench/closed_loop.py --interleave`` runs them).

    .venv/bin/python bench/step_parts.py    # a per-layer mix and the uniform plans of its four layouts
    .venv/bin/python bench/step_parts.py --plans mix-tp2dp2-tp4-uly4-dp4z3,tp2-dp2,tp4-sp,uly4,dp4-zero3

Parts (rank 0's wall clock; every rank waits for the others inside the collectives, so a part includes the wait):

- ``emb``: the embedding's forward; ``L<i> f`` / ``L<i> b``: block i's forward (from before its re-layout and
  FSDP all-gather to after its last hook) and backward (from its output's gradient to its input's, the re-layout's
  backward and FSDP's reduce-scatter included); ``head f`` / ``head b``: final norm, LM head and loss, forward and
  backward; ``emb b``: from layer 0's input gradient to the end of ``backward()``;
- ``reduce``: the SP norms' and the ZeRO-0/1 gradient all-reduces; ``optim``: AdamW; ``bcast``: ZeRO-1's
  parameter broadcasts; ``rest``: zero_grad and the loss all-reduce;
- ``relayout wait f`` / ``relayout xchg f`` (``b``: backward): of the re-layouts between layers (inside the layer
  parts above), the wait for the stage's slowest rank (a barrier put before each exchange) and the exchange.

Plans are ``bench/closed_loop.py``'s ``PLANS_4`` by name (one micro-batch, no pipeline), plus the uniform forms of
the mixes' layouts that it lacks (``EXTRA``: ``tp4-sp``, tp4 with Megatron SP; ``tp2-dp2``; ``uly4``). Prints the
median of each part over the measured steps (``--rounds`` x ``--steps`` per plan, after one warm-up round), per
plan. A diagnostic: it prices nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from closed_loop import MODEL, PLANS_4, Plan, launched_plans, request, round_order  # noqa: E402

EXTRA: dict[str, Plan] = {
    "tp4-sp": ({"tp": 4, "sp": "megatron", "micro_batches": 1}, MODEL, 1),
    "tp2-dp2": ({"tp": 2, "dp": 2, "zero": 0, "micro_batches": 1}, MODEL, 1),
    "uly4": ({"tp": 4, "sp": "ulysses", "micro_batches": 1}, MODEL, 1),
}


def rank_main(spec_path: Path, out: Path) -> int:
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import loss_parallel

    from worker.runtime.data import global_batch, local_batch
    from worker.runtime.model import blocks, lm_loss
    from worker.runtime.parallelize import ParallelModel, vocab_parallel_loss
    from worker.runtime.tensor_parallel import reduce_partial_gradients

    spec = json.loads(spec_path.read_text())
    models = launched_plans(spec["plans"])
    marks: list[tuple[str, float]] = []

    def mark(label: str) -> None:
        marks.append((label, time.perf_counter()))

    # every re-layout between layers, forward and backward: the wait for the stage's slowest rank (a barrier)
    # apart from the exchange itself
    from worker.runtime import layouts

    forward_pass = False
    relayout_s = {"relayout wait f": 0.0, "relayout xchg f": 0.0, "relayout wait b": 0.0, "relayout xchg b": 0.0}
    exchange = layouts._exchange

    def timed_exchange(x: torch.Tensor, plan: Any, group: Any) -> torch.Tensor:
        # autograd runs a Function's forward with grad off too: a forward exchange is one under the forward hooks
        side = "f" if forward_pass else "b"
        t0 = time.perf_counter()
        if not plan.local:
            dist.barrier(group=group)
        t1 = time.perf_counter()
        out = exchange(x, plan, group)
        t2 = time.perf_counter()
        relayout_s[f"relayout wait {side}"] += t1 - t0
        relayout_s[f"relayout xchg {side}"] += t2 - t1
        return out

    layouts._exchange = timed_exchange

    def instrument(pm: ParallelModel) -> None:
        model = pm.modules[0]
        for key, block in blocks(model).items():
            i = int(key)

            def pre(_m: Any, args: tuple[Any, ...], i: int = i) -> None:
                mark(f"L{i} f<")

            def post(_m: Any, _a: Any, output: Any, i: int = i) -> None:
                mark(f"L{i} f>")
                if output.requires_grad:
                    output.register_hook(lambda g, i=i: mark(f"L{i} b<"))

            block.register_forward_pre_hook(pre, prepend=True)
            block.register_forward_hook(post)
        emb = model.get_submodule("tok_embeddings")

        def emb_post(_m: Any, _a: Any, output: Any) -> None:
            mark("emb f>")
            if output.requires_grad:
                output.register_hook(lambda g: mark("emb b<"))

        emb.register_forward_hook(emb_post)

    for pm in models.values():
        assert pm.plan.pp == 1 and pm.plan.micro_batches == 1, "one micro-batch, no pipeline: broken down"
        instrument(pm)

    def step(pm: ParallelModel, tokens: torch.Tensor) -> dict[str, float]:
        """``ParallelModel.train_step`` of one micro-batch, its phases marked."""
        assert pm.optimizer is not None
        marks.clear()
        for key in relayout_s:
            relayout_s[key] = 0.0
        emb = pm.plan.embedding
        inputs, labels = local_batch(tokens, pm.dp_rank, pm.plan.dp, pm.sp_rank, emb.ulysses, pm.cp_rank, emb.cp)
        nonlocal forward_pass
        forward_pass = True
        mark("start")
        with loss_parallel() if vocab_parallel_loss(pm.plan) else contextlib.nullcontext():
            logits = pm.modules[0](inputs)
            loss = lm_loss(logits, labels)
            mark("loss")
            forward_pass = False
            loss.backward()
        mark("backward")
        reduce_partial_gradients(pm.parameters())
        for group in pm.replicated:
            group.reduce_gradients()
        mark("reduce")
        pm.optimizer.step()
        mark("optim")
        for group in pm.replicated:
            group.broadcast_owned()
        mark("bcast")
        pm.optimizer.zero_grad(set_to_none=True)
        agg = torch.tensor([float(loss.detach()), 1.0], dtype=torch.float64)
        dist.all_reduce(agg)
        mark("rest")
        t = dict(marks)
        n = pm.plan.model.num_layers
        parts = {"emb": t["emb f>"] - t["start"]}
        for i in range(n):
            parts[f"L{i} f"] = t[f"L{i} f>"] - t[f"L{i} f<"]
        parts["head f"] = t["loss"] - t[f"L{n - 1} f>"]
        parts["head b"] = t[f"L{n - 1} b<"] - t["loss"]
        for i in range(n - 1, 0, -1):
            parts[f"L{i} b"] = t[f"L{i - 1} b<"] - t[f"L{i} b<"]
        parts["L0 b"] = t["emb b<"] - t["L0 b<"]
        parts["emb b"] = t["backward"] - t["emb b<"]
        for a, b in (("backward", "reduce"), ("reduce", "optim"), ("optim", "bcast"), ("bcast", "rest")):
            parts[b] = t[b] - t[a]
        parts["step"] = t["rest"] - t["start"]
        parts |= relayout_s
        return parts

    samples: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    names = list(models)
    k = 0
    for r in range(spec["rounds"] + 1):
        for name in round_order(names, r):
            pm = models[name]
            for _ in range(spec["steps"]):
                tokens = global_batch(pm.plan.model.vocab_size, pm.plan.global_batch_size, pm.plan.seq_length, 0, k)
                k += 1
                dist.barrier()
                parts = step(pm, tokens)
                if r > 0:
                    samples[name].append(parts)
    if dist.get_rank() == 0:
        out.write_text(json.dumps(samples))
    dist.barrier()
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--rank":
        from worker.runtime.groups import shared_process_groups

        with shared_process_groups():  # as bench/closed_loop.py's launches
            code = rank_main(Path(sys.argv[2]), Path(sys.argv[3]))
        os._exit(code)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plans", default="mix-cp2dp2-tp4-cp4-dp4,cp2-dp2,tp4-sp,cp4-zero3,dp4",
                    help="comma-separated plan names (default: a per-layer mix and the uniform plans of its layouts)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    every = {**PLANS_4, **EXTRA}
    names = args.plans.split(",")
    unknown = [n for n in names if n not in every]
    if unknown:
        ap.error(f"--plans: no plan named {', '.join(unknown)} (known: {', '.join(every)})")
    # the parts are a single forward and backward on every rank: a pipeline's schedule has no such split
    piped = [n for n in names if every[n][0].get("pp", 1) > 1 or every[n][0].get("micro_batches", 1) > 1
             or every[n][2] > 1]
    if piped:
        ap.error(f"--plans: {', '.join(piped)}: only one-node plans of one micro-batch and no pipeline are broken "
                 "down")
    docs = {n: {"kind": "hybrid", "request": request(every[n], None, 4)} for n in names}
    work = Path(tempfile.mkdtemp(prefix="step-parts-"))
    spec, out = work / "spec.json", work / "out.json"
    spec.write_text(json.dumps({"plans": docs, "rounds": args.rounds, "steps": args.steps}))
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                    str(Path(__file__).resolve()), "--rank", str(spec), str(out)], check=True, cwd=ROOT,
                   timeout=3600)
    samples = json.loads(out.read_text())
    table = {n: {p: statistics.median(s[p] for s in samples[n]) for p in samples[n][0]} for n in names}
    parts = list(next(iter(table.values())))
    print(f"{'part (ms)':<10}" + "".join(f"{n[:22]:>24}" for n in names))
    for p in parts:
        print(f"{p:<10}" + "".join(f"{1e3 * table[n][p]:>24.1f}" for n in names))
    if args.json:
        args.json.write_text(json.dumps({"samples": samples, "medians": table}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
