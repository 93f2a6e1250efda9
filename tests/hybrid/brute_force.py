"""Exhaustive enumeration of hybrid plans under a cost model (for tiny cases only).

Independent of the planner: it enumerates every pipeline configuration, every partition and every
assignment of a candidate to every layer, aggregates per stage as the CostModel contract says, and keeps
each stage's (time, step time) Pareto front before combining stages (exact, because the pipeline step
time is monotone in every stage's inputs).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from solvers.cost_model.base import CostModel, StageContext
from solvers.hybrid.bounds import convex_envelope
from solvers.hybrid.space import SearchSpace


def _compositions(total: int, k: int) -> list[tuple[int, ...]]:
    return [tuple(b - a for a, b in zip((0, *cut), (*cut, total), strict=True))
            for cut in itertools.combinations(range(1, total), k - 1)]


def _front(t: np.ndarray, u: np.ndarray) -> list[tuple[float, float]]:
    order = np.lexsort((u, t))
    out: list[tuple[float, float]] = []
    best_u = math.inf
    for i in order:
        if u[i] < best_u:
            out.append((float(t[i]), float(u[i])))
            best_u = float(u[i])
    return out


def _lower_hull(front: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The vertices of the lower convex hull of a (time, step time) front: the points some positive
    weighting w x time + step time ranks strictly first."""
    ts, us = convex_envelope(np.array([t for t, _ in front]), np.array([u for _, u in front]))
    return list(zip(ts.tolist(), us.tolist(), strict=True))


def best_step_time(cm: CostModel, space: SearchSpace, hull_only: bool = False, embeddings: bool = False) -> float:
    """Minimum step time over the whole space (stages are contiguous blocks of layers). ``hull_only``: over
    the plans whose every stage is a vertex of its lower convex (time, step time) hull, the plans a search
    that scalarises each stage's two times with positive weights can find. ``embeddings``: over every
    embedding / LM-head strategy of the space too (else the cost model's default one)."""
    best = math.inf
    n_layers = space.num_layers
    configs = space.pipeline_configs()
    if embeddings:
        configs = [replace(c, embedding=e) for c in configs for e in space.embedding_options(space.num_gpus // c.pp)]
    for cfg in configs:
        g = space.num_gpus // cfg.pp
        mbs = space.global_batch_size / cfg.micro_batches
        cands = space.layer_candidates(g, int(mbs))
        if not cands:
            continue
        # interleaving splits each stage's layers into virtual_stages chunks: each needs one layer at least
        partitions = [p for p in _compositions(n_layers, cfg.pp) if min(p) >= cfg.virtual_stages]
        for parts in partitions:
            fronts: list[list[tuple[float, float]]] | None = []
            bounds = np.cumsum((0, *parts))
            for s in range(cfg.pp):
                layers = list(range(bounds[s], bounds[s + 1]))
                ctx = StageContext(cfg.pp, s, cfg.micro_batches, mbs, cfg.schedule, cfg.virtual_stages, cfg.embedding)
                fx = cm.stage_fixed(ctx)
                infl = cm.in_flight_micro_batches(ctx)
                trans = np.asarray(cm.transition_s(cands, cands, ctx))
                costs = [cm.layer_costs(i, cands, ctx) for i in layers]
                grid = np.indices((len(cands),) * len(layers)).reshape(len(layers), -1)
                t = np.full(grid.shape[1], fx.time_s, dtype=float)
                u = np.full(grid.shape[1], fx.step_time_s, dtype=float)
                mem = np.full(grid.shape[1], fx.state_bytes + fx.other_bytes + infl * fx.activation_bytes, dtype=float)
                extra = np.zeros(grid.shape[1])
                for pos, c in enumerate(costs):
                    idx = grid[pos]
                    t += c.time_s[idx]
                    u += c.step_time_s[idx]
                    mem += c.state_bytes[idx] + infl * c.activation_bytes[idx]
                    extra = np.maximum(extra, c.peak_extra_bytes[idx])
                    if pos:
                        t += trans[grid[pos - 1], idx]
                ok = mem + extra <= cm.memory_limit_bytes + 1e-6
                if not ok.any():
                    fronts = None
                    break
                front = _front(t[ok], u[ok])
                fronts.append(_lower_hull(front) if hull_only else front)  # type: ignore[union-attr]
            if fronts is None:
                continue
            ctx0 = StageContext(cfg.pp, 0, cfg.micro_batches, mbs, cfg.schedule, cfg.virtual_stages, cfg.embedding)
            for combo in itertools.product(*fronts):
                v = cm.pipeline_step_time([x[0] for x in combo], [x[1] for x in combo], ctx0)
                best = min(best, v)
    return best
