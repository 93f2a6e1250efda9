"""Training a FlexSP plan: a stream of variable-length batches, each step grouped by the FlexSP planner.

``worker.runtime.train`` hands a plan of ``kind = "flexsp"`` here. Step 0 trains the plan's own batch with the
plan's grouping. Every later step takes the next batch of the length stream: ``--lengths FILE`` (one token length
per line, e.g. ``../shared/reference/flexsp/wikipedia_lengths.txt``; lengths above ``--max-length`` dropped, as the
FlexSP reference drops those above its context limit; consecutive blocks of as many sequences as the plan's
batch), or without a file a bootstrap of the plan's own lengths (a fixed draw per step). The token ids are
synthetic (``flexsp.sequence_tokens``). With a tokenized dataset (``--dataset`` and ``--document-separator``) the
sequences are instead the dataset's documents, in file order, each step the next block of them: their real
tokens and lengths (``data.DocumentFile``).

While step ``k`` trains, rank 0 asks the planner (``solvers.flexsp.api.solve``, the plan's request with the next
batch's lengths) for step ``k + 1``'s grouping in a thread; the answer is broadcast to every rank. A plan not
ready ``budget_s`` after it was asked for is late: the step runs the previous step's grouping rule instead (its
rank blocks per micro-batch, the new sequences dealt longest first to the block with the fewest tokens per rank;
``fallback_grouping``), and no new plan is asked for until the late one returns. Each step's metrics say which it
ran (``"grouping": "plan" | "planned" | "fallback"``, or ``"static-spD"`` in a baseline run of static SP), its
measured time and memory, and the time the FlexSP cost model predicts for the grouping it ran
(``solvers.flexsp.api.estimate``, computed after the run).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from solvers.errors import SpecError
from solvers.flexsp.api import estimate, solve
from solvers.run_flexsp import check_flexsp_runnable, load_flexsp_plan
from worker.runtime.data import DocumentFile
from worker.runtime.flexsp import (
    Group,
    GroupCache,
    Grouping,
    grouping_of,
    grouping_problems,
    grouping_to_dicts,
    sequence_tokens,
    step_gradients,
)
from worker.runtime.metrics import peak_memory_gib
from worker.runtime.model import ModelConfig, build_model

StepCallback = Callable[[int, float, float, int | None], None]  # as train.StepCallback


class FlexSPRun:
    """A FlexSP plan document read for the runtime: its request, result, model and first grouping."""

    def __init__(self, doc: dict[str, Any], world_size: int) -> None:
        layout = check_flexsp_runnable(doc)  # the service's own check: SpecError names what the runtime refuses
        self.request, self.result = load_flexsp_plan(doc)
        self.raw_request: dict[str, Any] = dict(doc["request"])
        if layout.world_size != world_size:
            raise SpecError.at(("request", "cluster"), f"the plan is for {layout.world_size} GPUs; this run starts "
                                                       f"{world_size} processes")
        self.model = ModelConfig.from_spec(self.request.model)
        self.lengths = list(self.request.batch.sequence_lengths)
        self.grouping = grouping_of(self.result.micro_batches)

    def problems(self, grouping: Grouping, sequences: int) -> list[str]:
        return grouping_problems(grouping, sequences, self.world, self.model.num_heads, self.model.num_kv_heads)

    @property
    def world(self) -> int:
        return self.request.cluster.num_gpus

    def sp_sizes(self) -> list[int]:
        """The SP degrees a group of this run may have: those Ulysses can split the heads by, within the world."""
        return [d for d in range(1, self.world + 1) if self.model.num_kv_heads % d == 0
                and self.model.num_heads % d == 0]

    def request_for(self, lengths: Sequence[int]) -> dict[str, Any]:
        """The plan's request for another batch; ``max_sp`` kept within what Ulysses can split the heads by."""
        solver = dict(self.raw_request.get("solver") or {})
        solver["max_sp"] = min(max(self.sp_sizes()), solver.get("max_sp") or self.world)
        return {**self.raw_request, "batch": {"sequence_lengths": list(lengths)}, "solver": solver}


def length_stream(path: Path | None, first: Sequence[int], max_length: int | None, seed: int) -> Iterator[list[int]]:
    """Batches after the plan's own (``first``): blocks of ``len(first)`` lengths from ``path`` (cycled), lengths
    above ``max_length`` dropped; without a file, per step a seeded draw with replacement from ``first``."""
    size = len(first)
    if path is None:
        step = 1
        while True:
            rng = random.Random(seed * 1_000_003 + step)
            yield [rng.choice(list(first)) for _ in range(size)]
            step += 1
    cap = max_length or max(first)
    lengths = [n for n in (int(line) for line in path.read_text().split()) if 0 < n <= cap]
    if len(lengths) < size:
        raise SpecError.at(("lengths",), f"{path}: fewer than {size} lengths of 1..{cap} tokens")
    start = 0
    while True:
        if start + size > len(lengths):
            start = 0
        yield lengths[start:start + size]
        start += size


def fallback_grouping(previous: Grouping, lengths: Sequence[int]) -> Grouping:
    """The previous step's rank blocks per micro-batch, the new sequences dealt longest first, each to the block
    whose tokens per rank would be fewest with it."""
    blocks = [(m, q, g.sp) for m, mb in enumerate(previous) for q, g in enumerate(mb)]
    load = [0.0] * len(blocks)
    dealt: list[list[int]] = [[] for _ in blocks]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        b = min(range(len(blocks)), key=lambda b: ((load[b] + lengths[i]) / blocks[b][2], b))
        load[b] += lengths[i]
        dealt[b].append(i)
    out: list[list[Group]] = [[] for _ in previous]
    for (m, q, _), seqs in zip(blocks, dealt, strict=True):
        g = previous[m][q]
        out[m].append(Group(g.sp, g.first, g.last, tuple(sorted(seqs))))
    return tuple(tuple(mb) for mb in out)


def static_grouping(run: FlexSPRun, lengths: Sequence[int], sp: int) -> Grouping:
    """Static sequence parallelism of degree ``sp`` for a batch: the FlexSP baseline's packing
    (``solvers.flexsp.api.estimate`` with ``strategy: {"sp": sp}``); SpecError where it cannot hold the batch or
    the runtime cannot run it."""
    grouping = grouping_of(estimate({**run.request_for(lengths), "strategy": {"sp": sp}}).micro_batches)
    problems = run.problems(grouping, len(lengths))
    if problems:
        raise SpecError.at(("static_sp",), "; ".join(problems))
    return grouping


def plan_grouping(run: FlexSPRun, lengths: Sequence[int]) -> Grouping:
    """The FlexSP planner's grouping for a batch of ``lengths``; ValueError where the runtime cannot run it (a planner
    bug or a grouping beyond this runtime: a step then falls back)."""
    grouping = grouping_of(solve(run.request_for(lengths)).micro_batches)
    problems = run.problems(grouping, len(lengths))
    if problems:
        raise ValueError("; ".join(problems))
    return grouping


class Planner:
    """Rank 0's planner thread: one solve at a time, for the next step's batch."""

    def __init__(self, run: FlexSPRun) -> None:
        self.run = run
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="flexsp-planner")
        self.pending: tuple[int, float, Future[Grouping]] | None = None  # (step, asked at, answer)

    def _solve(self, lengths: list[int]) -> Grouping:
        return plan_grouping(self.run, lengths)

    def ask(self, step: int, lengths: list[int]) -> None:
        if self.pending is None:
            self.pending = (step, time.perf_counter(), self.pool.submit(self._solve, lengths))

    def answer(self, step: int, budget_s: float) -> tuple[Grouping | None, float, str | None]:
        """Step ``step``'s planned grouping if it is ready within the budget, how long this call waited for it,
        and when there is none, why (late, not asked while an earlier solve ran, or the solve failed)."""
        if self.pending is None or self.pending[0] != step:
            return None, 0.0, "not asked: the previous solve was still running"
        _, asked, future = self.pending
        start = time.perf_counter()
        try:
            grouping = future.result(timeout=max(0.0, asked + budget_s - start))
        except TimeoutError:  # late: it keeps running; the next ask waits until it is done
            self.pending = (-1, asked, future)
            future.add_done_callback(lambda _: self._clear(future))
            return None, time.perf_counter() - start, f"late: not planned within {budget_s:g} s"
        except Exception as err:  # a failed solve counts as a late plan: the step falls back
            self.pending = None
            return None, time.perf_counter() - start, f"the solve failed: {err}"
        self.pending = None
        return grouping, time.perf_counter() - start, None

    def _clear(self, future: Future[Grouping]) -> None:
        if self.pending is not None and self.pending[2] is future:
            self.pending = None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


Batch = tuple[list[int], list[int] | None]  # a step's sequence lengths, and the dataset documents they are (or None)


def document_stream(documents: DocumentFile, size: int) -> Iterator[Batch]:
    """Blocks of ``size`` consecutive documents of the dataset, from its first, cycling."""
    index = 0
    while True:
        docs = documents.batch(index, size)
        yield [int(documents.lengths[d]) for d in docs], docs
        index += 1


def run_flexsp(run: FlexSPRun, steps: int, device: torch.device, seed: int = 0, budget_s: float = 1.0,
               lengths_file: Path | None = None, max_length: int | None = None, warmup: int = 1,
               on_step: StepCallback | None = None, static_sp: int | None = None,
               documents: DocumentFile | None = None) -> dict[str, Any]:
    """Train ``steps`` steps of the length stream (every rank; rank 0's result is the run's metrics). With
    ``static_sp`` every step, the first too, runs static sequence parallelism of that degree instead of the
    planner's grouping (the baseline FlexSP is compared with: ``static_grouping``, before the step is timed).
    With ``documents`` (a tokenized dataset cut at its documents' boundaries) every step, the first too, trains the
    dataset's next block of as many documents as the plan's batch, their real tokens and lengths; step 0's grouping
    is then planned before it starts (the plan's own grouping is for its own lengths)."""
    rank = dist.get_rank()
    model = build_model(run.model, seed, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    groups = GroupCache()
    groups.ensure_aligned(run.world, run.sp_sizes())
    stream: Iterator[Batch] | None = None
    if rank == 0:
        stream = document_stream(documents, len(run.lengths)) if documents is not None else \
            ((lengths, None) for lengths in length_stream(lengths_file, run.lengths, max_length, seed))
    planner = Planner(run) if rank == 0 and static_sp is None else None
    batch, docs, grouping = list(run.lengths), None, run.grouping
    source = "plan"
    if stream is not None and documents is not None:
        batch, docs = next(stream)
        if static_sp is None:
            grouping, source = plan_grouping(run, batch), "planned"
    upcoming = next(stream) if stream is not None else None
    autocast = torch.autocast(device.type, dtype=torch.float16 if run.request.precision == "fp16" else torch.bfloat16,
                              enabled=device.type == "cuda" and run.request.precision in ("bf16", "fp16"))
    records: list[dict[str, Any]] = []
    losses, times, memory, traces = [], [], [], []
    waited, why = 0.0, None
    dist.barrier()
    for step in range(steps):
        if rank == 0 and static_sp is not None:
            if step > 0:
                assert upcoming is not None and stream is not None
                (batch, docs), upcoming = upcoming, next(stream)
            grouping, source = static_grouping(run, batch, static_sp), f"static-sp{static_sp}"
        if planner is not None and step > 0:
            assert upcoming is not None and stream is not None
            (batch, docs), upcoming = upcoming, next(stream)
            planned, waited, why = planner.answer(step, budget_s)
            source = "planned" if planned is not None else "fallback"
            grouping = planned if planned is not None else fallback_grouping(grouping, batch)
        if planner is not None and upcoming is not None and step + 1 < steps:
            planner.ask(step + 1, upcoming[0])  # solved while this step trains
        shared: list[Any] = [(batch, docs, grouping, source, waited, why)]
        dist.broadcast_object_list(shared, src=0)
        batch, docs, grouping, source, waited, why = shared[0]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

        def tokens_of(i: int, batch: list[int] = batch, step: int = step, docs: list[int] | None = docs
                      ) -> torch.Tensor:
            if docs is not None:
                assert documents is not None
                return documents.sequence(docs[i])
            return sequence_tokens(run.model.vocab_size, batch[i], seed, step, i)

        trace: list[int] = []
        start = time.perf_counter()
        with autocast:
            loss = step_gradients(model, grouping, tokens_of, batch, groups, trace)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(loss)
        memory.append(peak_memory_gib(device))
        traces.append(trace)
        records.append({"step": step, "sequences": len(batch), "tokens": sum(batch), "grouping": source,
                        "fallback_reason": why, "plan_wait_s": waited, "micro_batches": grouping_to_dicts(grouping),
                        "lengths": list(batch), **({"documents": list(docs)} if docs is not None else {})})
        if on_step is not None:
            on_step(step, loss, times[-1], None)
    if planner is not None:
        planner.close()
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, memory)
    ran: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ran, traces)
    for s, record in enumerate(records):
        record["step_time_s"] = times[s]
        record["peak_memory_gib_per_rank"] = [m[s] for m in every]
        record["positions_by_rank"] = [t[s] for t in ran]  # per rank, per micro-batch: the positions it ran
        if rank == 0:
            record["predicted_step_time_s"] = estimate({**run.request_for(record["lengths"]),
                                                        "micro_batches": record["micro_batches"]}).step_time_s
    return summarize_flexsp(run, records, losses, [max(m) for m in every], warmup)


def summarize_flexsp(run: FlexSPRun, records: list[dict[str, Any]], losses: list[float],
                     memory_gib_per_rank: list[float], warmup: int) -> dict[str, Any]:
    """The hybrid runtime's metrics fields (``metrics.summarize``) for a run whose batches vary (throughput and MFU
    over all steps' tokens and time; step time the median after ``warmup``), each step's record under
    ``flexsp_steps`` with its predicted time beside the measured one, and the median prediction."""
    times = [r["step_time_s"] for r in records]
    timed = times[min(warmup, max(len(times) - 1, 0)):]
    step = statistics.median(timed)
    tokens = sum(r["tokens"] for r in records)
    flops = sum(run.model.flops_per_token(n) * n for r in records for n in r["lengths"])
    elapsed = sum(times)
    peak = run.request.cluster.gpu.peak_flops(run.request.precision)
    predicted = [r["predicted_step_time_s"] for r in records if "predicted_step_time_s" in r]
    world = run.world
    return {
        "step_time_s": step,
        "step_time_mean_s": statistics.fmean(timed),
        "step_times_s": times,
        "tokens_per_s": tokens / elapsed,
        "throughput_samples_per_s": sum(r["sequences"] for r in records) / elapsed,
        "mfu": flops / (elapsed * world * peak),
        "model_tflops_per_rank": flops / elapsed / world / 1e12,
        "peak_memory_gib_per_rank": memory_gib_per_rank,
        "peak_memory_gib": max(memory_gib_per_rank) if memory_gib_per_rank else 0.0,
        "loss": losses,
        "world_size": world,
        "layout": "flexsp",
        "notes": [],
        "resumed_from_step": None,
        "predicted_step_time_s": statistics.median(predicted) if predicted else None,
        "flexsp_steps": records,
        "groupings": {kind: sum(r["grouping"] == kind for r in records)
                      for kind in dict.fromkeys(["plan", "planned", "fallback", *(r["grouping"] for r in records)])},
    }


