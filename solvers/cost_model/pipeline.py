"""Pipeline schedules: step time from per-stage times, activations in flight per stage, and the layer splits
Megatron-LM runs.

With per-micro-batch stage times t_i (forward + backward), m micro-batches and v virtual stages per GPU,
GPipe and 1F1B take (m - 1) * max(t) + sum(t) — for equal stages (m + p - 1) * t, a bubble of
(p - 1) / m. Interleaved 1F1B splits each stage into v chunks, so the fill and drain cost only
sum(t) / v beyond the slowest stage: (m - 1) * max(t) + max(t) + (sum(t) - max(t)) / v, i.e.
(m + (p - 1) / v) * t for equal stages (Narayanan et al., SC21). The per-step work of each stage
(exposed gradient sync, optimizer) follows the pipeline; the slowest stage decides.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from solvers.strategy import Schedule


def megatron_splits(layers: int, pp: int, chunks: int = 1,
                    near: Sequence[int] | None = None) -> Iterator[tuple[int, ...]]:
    """Every pipeline split Megatron-LM runs: its middle stages equal (it refuses a remainder there), the first
    and last sizes free (``--decoder-first/last-pipeline-num-layers``), whole model chunks per stage when
    interleaved. With ``near`` (a split to approach), for each middle size only the first stages around the
    one nearest to it (in squared difference per stage), instead of all of them."""
    if pp == 1:
        if layers % chunks == 0:
            yield (layers,)
        return
    for m in (range(chunks, layers, chunks) if pp > 2 else [0]):
        rest = layers - (pp - 2) * m  # first + last
        if rest < 2 * chunks:
            break
        firsts: Iterable[int] = range(chunks, rest - chunks + 1, chunks)
        if near is not None:
            ideal = chunks * int((rest + near[0] - near[-1]) / 2 // chunks)
            firsts = [f for f in (ideal - chunks, ideal, ideal + chunks, ideal + 2 * chunks)
                      if chunks <= f <= rest - chunks]
        for first in firsts:
            if (rest - first) % chunks == 0:
                yield (first,) + (m,) * (pp - 2) + (rest - first,)


@functools.lru_cache(maxsize=4096)
def even_split(layers: int, pp: int, chunks: int = 1) -> tuple[int, ...] | None:
    """The most even of ``megatron_splits``: the largest stage as small as possible, then the edge stages
    (embedding, head) the lighter. None where no split is whole model chunks. For a given middle size the most
    balanced first/last pair is best, so only the splits near equal edges are looked at."""
    return min(megatron_splits(layers, pp, chunks, near=(0,) * pp),
               key=lambda p: (max(p), max(p[0], p[-1]), p[0] + p[-1]), default=None)


def chunks(schedule: Schedule, virtual_stages: int) -> int:
    """Model chunks per GPU the schedule runs: ``virtual_stages`` when interleaved, else 1."""
    return virtual_stages if schedule == "interleaved" else 1


def front_loaded_split(items: int, parts: int) -> tuple[int, ...]:
    """Equal parts, the first ones taking one more item each while a remainder lasts: DeepSpeed's uniform
    pipeline partition (``partition_uniform``), and the model chunks of an interleaved stage."""
    base, extra = divmod(items, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


def virtual_stage_layers(stage_layers: Sequence[int], virtual_stages: int) -> tuple[int, ...]:
    """Layers of every virtual stage (model chunk) in the order the model runs them, for a pipeline whose stage
    ``s`` (the ranks of one pipeline position) runs ``stage_layers[s]`` layers as ``virtual_stages`` chunks.

    Each stage keeps the layer count the plan priced for it (the cost model sums a stage's layers and charges
    each chunk 1/v of them) and splits it as evenly as it divides, the first chunks one layer more
    (``front_loaded_split``); chunk ``j`` of stage ``s`` is virtual stage ``j * pp + s`` (the looped order of
    interleaved 1F1B: Megatron-LM's, torchtitan's and torch's). One function, so the torchtitan export and the
    worker cut the model alike. With one chunk per stage this is ``stage_layers``."""
    pp = len(stage_layers)
    per_stage = [front_loaded_split(n, virtual_stages) for n in stage_layers]
    return tuple(per_stage[k % pp][k // pp] for k in range(pp * virtual_stages))


def model_layer_order(stage_layers: Sequence[int], virtual_stages: int) -> tuple[int, ...]:
    """For every layer in the order the model runs them, the index of its strategy in the plan's ``layers``.

    The plan lists its layers stage by stage (stage 0's chunk by chunk, then stage 1's ...), as the cost model
    prices them: ``layers[sum(stage_layers[:s]):][:stage_layers[s]]`` are stage ``s``'s. With interleaving a
    stage's chunks are not adjacent in the model (``virtual_stage_layers``), so the model's layer ``i`` takes the
    strategy ``layers[model_layer_order(...)[i]]``; without, this is the identity."""
    pp = len(stage_layers)
    next_of = [sum(stage_layers[:s]) for s in range(pp)]  # the stage's next strategy not yet placed
    order: list[int] = []
    for k, n in enumerate(virtual_stage_layers(stage_layers, virtual_stages)):
        s = k % pp
        order.extend(range(next_of[s], next_of[s] + n))
        next_of[s] += n
    return tuple(order)


def pipeline_time_s(stage_time_s: Sequence[float], micro_batches: int, virtual_stages: int = 1,
                    schedule: Schedule = "1f1b") -> float:
    """Time of the pipelined part of a step (all micro-batches through all stages)."""
    if not stage_time_s:
        return 0.0
    v = chunks(schedule, virtual_stages)
    slowest = max(stage_time_s)
    return micro_batches * slowest + (sum(stage_time_s) - slowest) / v


def step_time_s(stage_time_s: Sequence[float], stage_step_time_s: Sequence[float], micro_batches: int,
                virtual_stages: int = 1, schedule: Schedule = "1f1b") -> float:
    return pipeline_time_s(stage_time_s, micro_batches, virtual_stages, schedule) + max(stage_step_time_s,
                                                                                      default=0.0)


def step_time_columns(stage_time_s: np.ndarray, stage_step_time_s: np.ndarray, micro_batches: int,
                      virtual_stages: int = 1, schedule: Schedule = "1f1b") -> np.ndarray:
    """``step_time_s`` for many candidates at once: one column each, one row per stage (the scalar form stays
    plain Python, which the partition search calls far more often on few stages)."""
    slowest = np.max(stage_time_s, axis=0)
    fill = (np.sum(stage_time_s, axis=0) - slowest) / chunks(schedule, virtual_stages)
    return micro_batches * slowest + fill + np.max(stage_step_time_s, axis=0)


def bubble_fraction(pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Idle fraction relative to the useful time for equal stages: (p - 1) / (v * m)."""
    return (pp - 1) / (virtual_stages * micro_batches)


def in_flight_micro_batches(schedule: Schedule, pp: int, stage: int, micro_batches: int,
                            virtual_stages: int = 1) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of the whole stage's layers.

    GPipe keeps all m; 1F1B keeps min(m, p - stage); interleaved 1F1B (Megatron's warm-up of
    2 (p - stage - 1) + (v - 1) p chunks, plus the one in flight) keeps that many chunks of 1/v each.
    """
    if schedule == "gpipe":
        return float(micro_batches)
    if schedule == "interleaved" and virtual_stages > 1:
        chunks = 2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1
        return min(micro_batches * virtual_stages, chunks) / virtual_stages
    return float(min(micro_batches, pp - stage))


def _stage_ops(schedule: Schedule, pp: int, stage: int, micro_batches: int) -> list[tuple[bool, int]]:
    """(forward?, micro-batch) in the order a stage runs them: GPipe all forwards then all backwards; 1F1B as
    torch's ``Schedule1F1B`` does, ``min(m, pp - stage)`` forwards, then one backward and one forward in turn."""
    if schedule == "gpipe":
        return [(True, i) for i in range(micro_batches)] + [(False, i) for i in range(micro_batches)]
    warm = min(micro_batches, pp - stage)
    ops = [(True, i) for i in range(warm)]
    for i in range(micro_batches):
        ops.append((False, i))
        if warm + i < micro_batches:
            ops.append((True, warm + i))
    return ops


# The forward's share of a stage's time per micro-batch (backward = twice the forward, as the analytic model has it)
FORWARD_SHARE = 1.0 / 3.0


@functools.lru_cache(maxsize=4096)
def shared_core_pipeline_s(stage_time_s: tuple[float, ...], micro_batches: int, schedule: Schedule,
                           max_speedup: float) -> float:
    """The pipelined part of a step (GPipe or 1F1B, one chunk per stage) on a host whose ranks share its cores,
    by event simulation under processor sharing. ``stage_time_s`` are the stages' times per micro-batch measured
    with every rank busy; while only ``n`` of the ``pp`` stages compute (the others wait on a pipeline dependency),
    each runs ``min(pp / n, max_speedup)`` times faster: the cores of the idle ranks go to the busy ones, up to a
    rank's speed alone on the host (``max_speedup``, the profile's ``host.slowdown``). A stage's forward takes
    ``FORWARD_SHARE`` of its time; stage ``s`` may run micro-batch ``i``'s forward once stage ``s - 1`` finished it,
    its backward once stage ``s + 1`` finished that (the last stage: once its own forward did)."""
    pp = len(stage_time_s)
    ops = [_stage_ops(schedule, pp, s, micro_batches) for s in range(pp)]
    nxt = [0] * pp
    done_f = [0] * pp  # forwards finished per stage (in micro-batch order)
    done_b = [0] * pp
    left: dict[int, float] = {}
    now = 0.0
    while True:
        for s in range(pp):
            if s in left or nxt[s] == len(ops[s]):
                continue
            fwd, i = ops[s][nxt[s]]
            ready = (s == 0 or done_f[s - 1] > i) if fwd else (done_f[s] > i if s == pp - 1 else done_b[s + 1] > i)
            if ready:
                left[s] = stage_time_s[s] * (FORWARD_SHARE if fwd else 1.0 - FORWARD_SHARE)
        if not left:
            return now
        rate = min(pp / len(left), max_speedup)
        first = min(left.values())
        now += first / rate
        for s in list(left):
            left[s] -= first
            if left[s] <= 1e-12 * max(stage_time_s):
                del left[s]
                if ops[s][nxt[s]][0]:
                    done_f[s] += 1
                else:
                    done_b[s] += 1
                nxt[s] += 1
