"""Hybrid layouts inside a metaop: the best tensor / context / expert parallel and ZeRO-3 layout for each width.

Plain data parallelism replicates a module's weights on every device of its block, so a module of ~20 B
parameters or more cannot be placed at all (a 70B LLM needs ~390 GiB per device). Here a training metaop on
``n`` devices may instead run any layout ``tp x cp x dp = n`` (TP with Megatron sequence parallelism inside a
node, ring-attention CP for long sequences, EP for MoE layers inside dp, ZeRO 0-3, no, selective or full
recomputation), priced by the hybrid planner's analytic cost model (``solvers.cost_model.analytic``) with the
whole local batch as one micro-batch (Spindle keeps a slice's activations until its backward turn).

The table keeps the Spindle cost model's calibration: a layout's per-layer time is the metaop's data-parallel
time at that width (``MetaOp.layer_ms``, affine in the local batch) times the analytic model's ratio of the
layout's time to plain data parallelism's at the same width; memory per device is the analytic model's.
A width keeps plain data parallelism (``None``) unless a layout is faster there, or data parallelism cannot
hold the metaop's layers on the block and a layout can (memory-checked on the whole metaop; where no layout
holds them all, the one needing least memory). Pipeline parallelism is not offered: a metaop's layers already
split into consecutive slices on different blocks. Forward-only and decode metaops keep data parallelism.

The search is vectorised (one cost-model call per metaop) and cached per (module, batch, cluster, limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import StageContext
from solvers.specs import ClusterSpec, Precision, TrainingSpec
from solvers.spindle.schedule import RESERVE_BYTES
from solvers.spindle.workload import ModuleShape
from solvers.strategy import LayerStrategy, Recompute

TP_DEGREES = (1, 2, 4, 8)
CP_DEGREES = (1, 2, 4)
CP_MIN_TOKENS = 8192
ZERO_STAGES = (0, 1, 2, 3)  # shorter sequences gain nothing from ring attention's split


@dataclass(frozen=True)
class Layout:
    """How a metaop runs on one width: the layer strategy, its time relative to plain data parallelism at the
    same width, and its memory per device (per hosted layer: states and held activations; once: working set)."""

    strategy: LayerStrategy
    time_factor: float
    state_bytes_per_layer: float
    act_bytes_per_layer: float
    work_bytes: float


@dataclass(frozen=True)
class LayoutQuery:
    """What a metaop's layout table depends on (hashable: the cache key)."""

    module: ModuleShape
    layer: int  # a representative layer index of the module (dense or MoE)
    layers: int  # the metaop's layers: what must fit on the block
    batch: int
    recompute: bool
    cluster: ClusterSpec
    precision: Precision
    memory_limit_bytes: float
    widths: int  # 1 .. widths


def _candidates(q: LayoutQuery) -> tuple[list[int], list[LayerStrategy]]:
    model = q.module.model_spec()
    per_node = q.cluster.gpus_per_node
    heads, kv = model.num_attention_heads, model.kv_heads
    experts = model.moe.num_experts if model.moe is not None else 1
    # (a metaop asking for recomputation keeps it: its activations were sized for it)
    rcs: tuple[Recompute, ...] = ("full",) if q.recompute else ("none", "selective", "full")
    cps = CP_DEGREES if q.module.seq_length >= CP_MIN_TOKENS else (1,)
    widths, out = [], []
    for n in range(1, q.widths + 1):
        for tp in TP_DEGREES:
            if tp > per_node or heads % tp or (kv % tp and tp > kv):
                continue
            for cp in cps:
                if n % (tp * cp) or q.module.seq_length % (2 * cp):
                    continue
                dp = n // (tp * cp)
                if dp > q.batch:
                    continue
                eps = [e for e in (1, 2, 4, 8) if e <= experts and dp % e == 0 and experts % e == 0]
                for ep in eps:
                    for zero in ZERO_STAGES:
                        for rc in rcs:
                            widths.append(n)
                            out.append(LayerStrategy(tp=tp, dp=dp, cp=cp, sp="megatron" if tp > 1 else None,
                                                     zero=zero, recompute=rc, ep=ep))
    return widths, out


@lru_cache(maxsize=256)
def layout_table(q: LayoutQuery, dp_fits: tuple[bool, ...]) -> tuple[Layout | None, ...]:
    """Per width 1..q.widths: the layout to run (None: plain data parallelism). ``dp_fits[n-1]``: whether data
    parallelism holds the metaop's layers on n devices under the Spindle memory model."""
    model = q.module.model_spec()
    training = TrainingSpec(global_batch_size=q.batch, seq_length=q.module.seq_length, precision=q.precision)
    cost = AnalyticCostModel(model, q.cluster, training)
    widths, cands = _candidates(q)
    if not cands:
        return (None,) * q.widths
    rc_dp: Recompute = "full" if q.recompute else "none"
    refs = [LayerStrategy(dp=min(n, q.batch), zero=1, recompute=rc_dp) for n in range(1, q.widths + 1)]
    ctx = StageContext(pp=1, stage=0, micro_batches=1, micro_batch_samples=float(q.batch))
    lc = cost.layer_costs(q.layer, [*cands, *refs], ctx)
    total = lc.time_s + lc.step_time_s
    ref_time = total[len(cands):]
    t = total[:len(cands)]
    state = lc.state_bytes[:len(cands)]
    act = lc.activation_bytes[:len(cands)]
    work = lc.peak_extra_bytes[:len(cands)]
    need = q.layers * (state + act) + work + RESERVE_BYTES
    fits = need <= q.memory_limit_bytes
    width_of = np.asarray(widths)
    out: list[Layout | None] = []
    for n in range(1, q.widths + 1):
        here = np.flatnonzero(width_of == n)
        ok = here[fits[here]]
        if len(ok):
            k = int(ok[np.argmin(t[ok])])
        elif not dp_fits[n - 1] and len(here):
            k = int(here[np.argmin(need[here])])  # nothing holds all its layers: the leanest (layers may split)
        else:
            out.append(None)
            continue
        factor = float(t[k] / ref_time[n - 1])
        if dp_fits[n - 1] and factor >= 1.0 - 1e-9:
            out.append(None)  # data parallelism holds it and nothing is faster
            continue
        out.append(Layout(cands[k], factor, float(state[k]), float(act[k]), float(work[k])))
    return tuple(out)
