"""The training entrypoint the worker launches with ``torch.distributed.run`` (one process per rank).

    python -m torch.distributed.run --standalone --nproc-per-node N -m worker.runtime.train \
        --plan plan.json --steps 20 --out metrics.json [--progress progress.jsonl] \
        [--checkpoint-dir DIR --checkpoint-every K] [--dataset tokens.bin --dataset-dtype uint16]

``plan.json`` is a plan document (``{"request": ..., "result": ...}`` as ``GET /v1/plans/{id}`` returns it).
Rank 0 appends one JSON line per step to ``--progress`` and writes the metrics to ``--out``. An invalid plan
(or dataset) writes ``{"error": ..., "problems": [...]}`` and exits with status 2 (not worth retrying).
With ``--checkpoint-dir`` the run first resumes from the newest complete checkpoint there, and with
``--checkpoint-every K`` saves one every K steps (``train_checkpoint``); ``--dataset`` trains on a tokenized
file instead of synthetic tokens (``data.TokenFile``); for a FlexSP plan with ``--document-separator ID`` the
file's documents are its sequences (``data.DocumentFile``). A Spindle plan (request ``kind`` spindle) trains with
``spindle.run_spindle`` instead, a step being one iteration of its slices (no checkpoints, no dataset).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from solvers.documents import HybridResult
from solvers.errors import SpecError
from solvers.request import HybridRequest, PlanRequestBase
from solvers.run_flexsp import is_flexsp_plan
from solvers.run_spindle import is_spindle_plan, load_program
from worker.runtime import train_checkpoint
from worker.runtime.data import DocumentFile, TokenFile, global_batch
from worker.runtime.expert_parallel import alltoall_metrics
from worker.runtime.flexsp_train import FlexSPRun, run_flexsp
from worker.runtime.metrics import peak_memory_gib, summarize
from worker.runtime.parallelize import parallelize
from worker.runtime.plan import RuntimePlan, from_document, load_plan
from worker.runtime.spindle import run_spindle

EXIT_INVALID_PLAN = 2
StepCallback = Callable[[int, float, float, int | None], None]  # step, loss, step time, resumed from step


def pick_device(request: PlanRequestBase | None) -> torch.device:
    """This rank's GPU for a GPU plan on a node that has them; else the CPU (also for a plan that did not load,
    whose ranks only report why)."""
    if request is not None and request.cluster.gpu.name.lower() != "cpu" and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def init_distributed(device: torch.device) -> None:
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def run_plan(plan: RuntimePlan, steps: int, device: torch.device, seed: int = 0, warmup: int = 1,
             on_step: StepCallback | None = None, checkpoint_dir: Path | None = None, checkpoint_every: int = 0,
             dataset: TokenFile | None = None) -> dict[str, object]:
    """Train ``plan`` up to ``steps`` steps in the current process group (from the newest complete checkpoint in
    ``checkpoint_dir`` when there is one, saving one every ``checkpoint_every`` steps); every rank returns the
    metrics, whose ``loss`` is the whole curve (a resumed attempt's starts with the checkpoint's)."""
    pm = parallelize(plan, seed, device)
    assert pm.optimizer is not None
    start, losses, resumed_from = 0, [], None
    if checkpoint_dir is not None:
        resumed = train_checkpoint.resume(checkpoint_dir, pm.modules, pm.optimizer)
        if resumed is not None:
            start, losses, resumed_from = resumed.step, list(resumed.losses), resumed.step
            pm.release_others_state()
    times: list[float] = []
    dist.barrier()
    for step in range(start, steps):
        start_t = time.perf_counter()
        if dataset is not None:  # this data-parallel rank's rows only
            loss = pm.train_step(dataset.rows(step, plan.global_batch_size, pm.dp_rank, plan.dp), rows_are_local=True)
        else:
            loss = pm.train_step(global_batch(plan.model.vocab_size, plan.global_batch_size, plan.seq_length, seed,
                                              step))
        # train_step ends in an all-reduce: every rank has finished the step
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start_t)
        losses.append(loss)
        done = step + 1
        if checkpoint_dir is not None and checkpoint_every and done % checkpoint_every == 0 and done < steps:
            train_checkpoint.save(checkpoint_dir, done, pm.modules, pm.optimizer, losses)
        if on_step is not None:  # after the checkpoint: a reported step is never lost with more than its own work
            on_step(step, loss, times[-1], resumed_from)
    memory = [0.0] * dist.get_world_size()
    dist.all_gather_object(memory, peak_memory_gib(device))
    metrics = summarize(plan, times, min(warmup, max(len(times) - 1, 0)), losses, memory, pm.notes)
    metrics["resumed_from_step"] = resumed_from
    if any(plan.experts):  # the MoE layers' all-to-all traffic (LSH-MoE's compression shows here)
        metrics["moe_alltoall"] = alltoall_metrics(pm.modules, device)
    return metrics


def exit_with_launcher(poll_s: float = 1.0) -> None:
    """Exit this rank when the process that started it (torchrun) is gone, so that a worker killed with
    SIGKILL leaves no orphaned ranks spinning on the node."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _progress_writer(path: Path | None) -> StepCallback | None:
    if path is None:
        return None

    def write(step: int, loss: float, step_time: float, resumed_from: int | None) -> None:
        point: dict[str, object] = {"step": step, "loss": loss, "step_time_s": step_time}
        if resumed_from is not None:
            point["resumed_from_step"] = resumed_from
        with path.open("a") as f:
            f.write(json.dumps(point) + "\n")

    return write


def _open_dataset(path: Path | None, dtype: str, plan: RuntimePlan) -> TokenFile | None:
    if path is None:
        return None
    try:
        return TokenFile(path, dtype, plan.seq_length, plan.model.vocab_size)
    except (OSError, ValueError) as err:
        raise SpecError.at(("dataset", "path"), str(err)) from None


def _write_metrics(out: Path, metrics: dict[str, object], device: torch.device) -> None:
    metrics["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    metrics["torch_version"] = torch.__version__
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(metrics))
    tmp.replace(out)


def _train_spindle(args: argparse.Namespace, doc: dict[str, object]) -> int:
    """A Spindle plan: ``args.steps`` iterations of ``spindle.run_spindle`` on synthetic data; one progress line
    per iteration (its summed task losses as ``loss``, each task's in ``task_loss``). It writes no checkpoints
    (a relaunch starts again from iteration 0) and takes no dataset."""
    request = doc["request"]
    assert isinstance(request, dict)
    gpu = request.get("cluster", {}).get("gpu", "")
    device = torch.device("cpu")
    if str(gpu).lower() != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    init_distributed(device)
    rank = dist.get_rank()
    try:
        if args.dataset is not None:
            raise SpecError.at(("dataset",), "a Spindle run trains on synthetic data: it takes no dataset")
        program = load_program(doc, world_size=dist.get_world_size())
    except SpecError as err:
        if rank == 0:
            args.out.write_text(json.dumps({"error": str(err), "problems": err.as_detail()}))
        dist.destroy_process_group()
        return EXIT_INVALID_PLAN
    progress: Path | None = args.progress

    def write(step: int, loss: float, step_time: float, tasks: dict[str, float]) -> None:
        assert progress is not None
        with progress.open("a") as f:
            f.write(json.dumps({"step": step, "loss": loss, "step_time_s": step_time, "task_loss": tasks}) + "\n")

    metrics = run_spindle(program, args.steps, device, seed=args.seed, warmup=args.warmup,
                          on_step=write if rank == 0 and progress is not None else None)
    metrics["resumed_from_step"] = None
    if rank == 0:
        _write_metrics(args.out, metrics, device)
    dist.barrier()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--progress", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--checkpoint-dir", type=Path)
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--dataset", type=Path)
    ap.add_argument("--dataset-dtype", default="uint16")
    ap.add_argument("--document-separator", type=int,
                    help="FlexSP with --dataset: the token id that ends each document (its sequences are documents)")
    ap.add_argument("--lengths", type=Path, help="FlexSP: the length stream, one sequence length per line")
    ap.add_argument("--max-length", type=int, help="FlexSP: drop longer sequences of the stream")
    ap.add_argument("--plan-budget-s", type=float, default=1.0,
                    help="FlexSP: a step's grouping not planned this long after it was asked for is late")
    ap.add_argument("--static-sp", type=int, help="FlexSP: run static SP of this degree instead (the baseline)")
    args = ap.parse_args(argv)
    exit_with_launcher()
    doc = json.loads(args.plan.read_text())
    if is_spindle_plan(doc):
        return _train_spindle(args, doc)
    if is_flexsp_plan(doc):
        return _main_flexsp(doc, args)
    loaded: tuple[HybridRequest, HybridResult | None] | SpecError
    try:
        loaded = load_plan(doc)
    except SpecError as err:  # reported once the process group is up, by rank 0
        loaded = err
    device = pick_device(None if isinstance(loaded, SpecError) else loaded[0])
    init_distributed(device)
    rank = dist.get_rank()
    try:
        if isinstance(loaded, SpecError):
            raise loaded
        plan = from_document(*loaded, world_size=dist.get_world_size())
        if args.document_separator is not None:
            raise SpecError.at(("dataset", "document_separator"), "a hybrid run reads the dataset in windows of "
                                                                  "its sequence length, not by document")
        dataset = _open_dataset(args.dataset, args.dataset_dtype, plan)
    except SpecError as err:
        if rank == 0:
            args.out.write_text(json.dumps({"error": str(err), "problems": err.as_detail()}))
        dist.destroy_process_group()
        return EXIT_INVALID_PLAN
    metrics = run_plan(plan, args.steps, device, seed=args.seed, warmup=args.warmup,
                       on_step=_progress_writer(args.progress) if rank == 0 else None,
                       checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every, dataset=dataset)
    if rank == 0:
        _write_metrics(args.out, metrics, device)
    dist.barrier()
    return 0


def _open_documents(args: argparse.Namespace, run: FlexSPRun) -> DocumentFile | None:
    """A FlexSP run's dataset cut at its documents' ends (None: the length stream with synthetic tokens); documents
    longer than ``--max-length`` (default: the plan's longest sequence) are dropped."""
    if args.dataset is None:
        return None
    if args.document_separator is None:
        raise SpecError.at(("dataset", "document_separator"), "a FlexSP run trains on whole documents: name the "
                                                              "token id that ends each one")
    try:
        return DocumentFile(args.dataset, args.dataset_dtype, run.model.vocab_size, args.document_separator,
                            args.max_length or max(run.lengths))
    except (OSError, ValueError) as err:
        raise SpecError.at(("dataset", "path"), str(err)) from None


def _main_flexsp(doc: dict[str, object], args: argparse.Namespace) -> int:
    """``main`` for a FlexSP plan (``flexsp_train``)."""
    from solvers.flexsp.request import parse_request

    try:
        request: PlanRequestBase | None = parse_request(doc["request"])[0]
    except SpecError:
        request = None  # reported below, once the process group is up
    device = pick_device(request)
    init_distributed(device)
    rank = dist.get_rank()
    try:
        run = FlexSPRun(doc, dist.get_world_size())
        documents = _open_documents(args, run)
    except SpecError as err:
        if rank == 0:
            args.out.write_text(json.dumps({"error": str(err), "problems": err.as_detail()}))
        dist.destroy_process_group()
        return EXIT_INVALID_PLAN
    metrics = run_flexsp(run, args.steps, device, seed=args.seed, budget_s=args.plan_budget_s,
                         lengths_file=args.lengths, max_length=args.max_length, warmup=args.warmup,
                         on_step=_progress_writer(args.progress) if rank == 0 else None, static_sp=args.static_sp,
                         documents=documents)
    if rank == 0:
        _write_metrics(args.out, metrics, device)
    dist.barrier()
    return 0


if __name__ == "__main__":
    code = main()
    # Skip interpreter teardown: with several gloo subgroups (TP/PP meshes) it can abort ("terminate called
    # without an active exception") after the metrics are written, which would turn a good run into a failure.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
