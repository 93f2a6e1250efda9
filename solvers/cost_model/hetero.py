"""A cluster of node groups of different GPU types (``cluster.groups``), priced stage by stage.

The groups' GPUs are laid out in one order (``order``, the pipeline's direction) and a plan's ``pp`` stages take
equal consecutive slices of them. A stage's layers are priced by the analytic model of every GPU type the stage
holds, and the slowest sets its pace (a stage spanning two groups runs data-parallel ranks on both types: the
slow ones wait). A stage must fit in the memory of each of its types; to let the planner keep one memory limit,
a stage's bytes are reported to it scaled by ``reference limit / its types' least limit``, which makes the one
limit test each stage against its own (``evaluate`` reports the real bytes). Between groups the network is
``cluster.inter_group_bandwidth_Gbps`` per node: it prices the pipeline sends across a group boundary and every
inter-node collective of a stage that spans groups (its ring crosses that link). Layer memory does not depend on
the GPU type, so per stage this is exact: the planner's search, bounds and certificate apply unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from solvers.cost_model.aggregate import GIB, evaluate_plan
from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import CostModel, Estimate, LayerCosts, PipelineTraits, StageContext, StageFixed
from solvers.cost_model.calibration import AnalyticCalibration
from solvers.documents.calibration import CalibrationSetUse
from solvers.specs import ClusterSpec, Constraints, ModelSpec, NodeGroup, TrainingSpec
from solvers.strategy import LayerStrategy, PlanStrategy

_MEMORY_KEYS = ("state_bytes", "activation_bytes", "peak_extra_bytes")


@dataclass(frozen=True)
class StageGPUs:
    """The GPUs one stage holds: the groups (indices into ``cluster.groups``) and whether it crosses a boundary."""

    groups: tuple[int, ...]

    @property
    def spans(self) -> bool:
        return len(self.groups) > 1


def stage_groups(groups: Sequence[NodeGroup], order: Sequence[int], pp: int) -> list[StageGPUs]:
    """Which groups each of ``pp`` equal consecutive slices of the GPUs, laid out in ``order``, falls on."""
    bounds, start = [], 0
    for g in order:
        bounds.append((start, start + groups[g].num_gpus, g))
        start += groups[g].num_gpus
    size = start // pp
    out = []
    for s in range(pp):
        lo, hi = s * size, (s + 1) * size
        out.append(StageGPUs(tuple(g for a, b, g in bounds if a < hi and b > lo)))
    return out


class HeteroCostModel(CostModel):
    """``CostModel`` over ``cluster.groups`` laid out in ``order`` (module docstring)."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, constraints: Constraints,
                 calibration: AnalyticCalibration, order: Sequence[int],
                 calibration_set: CalibrationSetUse | None = None):
        assert cluster.groups is not None
        self.calibration_set = calibration_set
        self.groups, self.order = cluster.groups, tuple(order)
        self.model, self.cluster, self.training = model, cluster, training
        self.num_layers, self.num_gpus = model.num_layers, cluster.num_gpus
        ig = cluster.inter_group_bandwidth_Gbps

        def own_network(group: NodeGroup) -> float:
            return cluster.inter_node_bandwidth_Gbps or group.gpu.inter_node_bandwidth_Gbps

        def typed(group: NodeGroup, spanning: bool) -> AnalyticCostModel:
            own = own_network(group)
            net = min(own, ig if ig is not None else own) if spanning else own
            # the whole cluster's size, so that a stage of pp holds num_gpus / pp GPUs as in the planner's space
            spec = ClusterSpec(gpu=group.gpu, nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node,
                               intra_node_bandwidth_GBps=cluster.intra_node_bandwidth_GBps,
                               inter_node_bandwidth_Gbps=net)
            return AnalyticCostModel(model, spec, training, constraints, calibration)

        self.alone = [typed(g, False) for g in self.groups]
        self.spanning = [typed(g, True) for g in self.groups]
        self.limits = [m.memory_limit_bytes for m in self.alone]
        self.memory_limit_bytes = max(self.limits)
        self.memory_limit_note = self.alone[0].memory_limit_note
        # the slower side's network when no inter-group bandwidth is given
        self.networks_Gbps = [own_network(g) for g in self.groups]
        self.inter_group_Gbps = ig if ig is not None else min(self.networks_Gbps)
        self._stages: dict[int, list[StageGPUs]] = {}

    # --- where a stage runs ------------------------------------------------------------------------
    def stages(self, pp: int) -> list[StageGPUs]:
        # asked on every cost query of the planner's hot loops: worked out once per pipeline depth
        hit = self._stages.get(pp)
        if hit is None:
            hit = self._stages[pp] = stage_groups(self.groups, self.order, pp)
        return hit

    def _models(self, ctx: StageContext) -> list[AnalyticCostModel]:
        gpus = self.stages(ctx.pp)[ctx.stage]
        return [(self.spanning if gpus.spans else self.alone)[g] for g in gpus.groups]

    def stage_limit_bytes(self, pp: int, stage: int) -> float:
        """The memory a stage's every GPU has (the least of its types')."""
        return min(self.limits[g] for g in self.stages(pp)[stage].groups)

    def _scale(self, ctx: StageContext) -> float:
        return self.memory_limit_bytes / self.stage_limit_bytes(ctx.pp, ctx.stage)

    # --- CostModel ----------------------------------------------------------------------------------
    def layer_costs(self, layer: int, candidates: Sequence[LayerStrategy], ctx: StageContext) -> LayerCosts:
        costs = [m.layer_costs(layer, candidates, ctx) for m in self._models(ctx)]
        out = _slowest(costs)
        k = self._scale(ctx)
        return replace(out, **{key: getattr(out, key) * k for key in _MEMORY_KEYS},
                       memory_parts_bytes={key: v * k for key, v in out.memory_parts_bytes.items()})

    def transition_s(self, prev: Sequence[LayerStrategy], nxt: Sequence[LayerStrategy], ctx: StageContext
                     ) -> np.ndarray:
        return np.max([m.transition_s(prev, nxt, ctx) for m in self._models(ctx)], axis=0)

    def stage_fixed(self, ctx: StageContext) -> StageFixed:
        fixed = [m.stage_fixed(ctx) for m in self._models(ctx)]
        slow = max(range(len(fixed)), key=lambda i: fixed[i].time_s)
        f = fixed[slow]
        parts, time_s = dict(f.parts_s), f.time_s
        cross = self._boundary_send_s(ctx)
        if cross:
            parts["pp_comm_cross_group"] = cross
            time_s += cross
        k = self._scale(ctx)
        return StageFixed(time_s=time_s, step_time_s=max(x.step_time_s for x in fixed),
                          state_bytes=f.state_bytes * k, activation_bytes=f.activation_bytes * k,
                          other_bytes=f.other_bytes * k, parts_s=parts,
                          step_parts_s=max(fixed, key=lambda x: x.step_time_s).step_parts_s,
                          memory_parts_bytes={key: v * k for key, v in f.memory_parts_bytes.items()})

    def _boundary_send_s(self, ctx: StageContext) -> float:
        """What the pipeline sends across a group boundary cost beyond the group's own network: the stage's
        activations forward (or gradients backward) per micro-batch and chunk, over the inter-group link."""
        if ctx.pp == 1:
            return 0.0
        stages = self.stages(ctx.pp)
        here = stages[ctx.stage]
        crossings = int(ctx.stage > 0 and stages[ctx.stage - 1].groups[-1] != here.groups[0])
        crossings += int(ctx.stage < ctx.pp - 1 and here.groups[-1] != stages[ctx.stage + 1].groups[0])
        if not crossings:
            return 0.0
        n_stage = self.num_gpus // ctx.pp
        e = 4.0 if self.training.precision == "fp32" else 2.0
        msg = ctx.micro_batch_samples * self.training.seq_length * self.model.hidden_size * e / n_stage
        # each group's own link, and the inter-group one at the same efficiency
        g = min(here.groups, key=lambda i: self.alone[i].links.inter_Bps)
        own = self.alone[g].links.inter_Bps
        extra = max(0.0, msg / (own * self.inter_group_Gbps / self.networks_Gbps[g]) - msg / own)
        return float(crossings * ctx.virtual_stages * extra)

    def in_flight_micro_batches(self, ctx: StageContext) -> float:
        return self.alone[0].in_flight_micro_batches(ctx)

    def pipeline_step_time(self, stage_time_s: Sequence[float], stage_step_time_s: Sequence[float],
                           ctx: StageContext) -> float:
        return self.alone[0].pipeline_step_time(stage_time_s, stage_step_time_s, ctx)

    @property
    def pipeline_traits(self) -> PipelineTraits:
        return self.alone[0].pipeline_traits

    def step_bound_from_linear(self, linear_s: float, mean_work_s: float) -> float:
        return self.alone[0].step_bound_from_linear(linear_s, mean_work_s)

    @cached_property
    def mean_peak_flops(self) -> float:
        """Per GPU, averaged over the cluster: MFU counts every GPU at its own peak."""
        precision = self.training.precision
        return sum(g.num_gpus * g.gpu.peak_flops(precision) for g in self.groups) / self.num_gpus

    def evaluate(self, plan: PlanStrategy) -> Estimate:
        """The plan's estimate with each stage's real memory (the planner's view scales it, module docstring)."""
        est = evaluate_plan(self, plan, global_batch_size=self.training.global_batch_size,
                            seq_length=self.training.seq_length, model_flops_per_step=self.alone[0].flops_per_step(),
                            peak_flops_per_gpu=self.mean_peak_flops)
        scale = [self.stage_limit_bytes(plan.pp, s) / self.memory_limit_bytes for s in range(plan.pp)]
        per_stage = [m * k for m, k in zip(est.memory_gib_per_stage, scale, strict=True)]
        parts = [{key: v * k for key, v in p.items()}
                 for p, k in zip(est.memory_breakdown_gib_per_stage, scale, strict=True)]
        notes = [n for n in est.notes if "GiB limit" not in n]
        if not est.fits:
            worst = max(range(plan.pp), key=lambda s: per_stage[s] * GIB / self.stage_limit_bytes(plan.pp, s))
            notes.append(f"stage {worst} needs {per_stage[worst]:.2f} GiB per GPU, over the "
                         f"{self.stage_limit_bytes(plan.pp, worst) / GIB:.2f} GiB limit of its GPUs")
        update: dict[str, object] = {"peak_memory_gib": max(per_stage), "memory_gib_per_stage": per_stage,
                                     "memory_breakdown_gib_per_stage": parts, "notes": notes,
                                     "matmul": list({m.cluster.gpu.name: m.matmul_doc() for m in self.alone}.values())}
        if self.calibration_set is not None:
            update["calibration_set"] = self.calibration_set
        return est.model_copy(update=update)


def _slowest(costs: list[LayerCosts]) -> LayerCosts:
    """Per candidate, the costs on the slowest of a stage's GPU types (memory is the same on every type)."""
    if len(costs) == 1:
        return costs[0]
    times = np.stack([c.time_s for c in costs])
    steps = np.stack([c.step_time_s for c in costs])
    at = np.argmax(times, axis=0)
    cols = np.arange(times.shape[1])

    def pick(parts: list[dict[str, np.ndarray]], which: np.ndarray) -> dict[str, np.ndarray]:
        keys = set().union(*parts)
        return {k: np.stack([np.broadcast_to(p.get(k, 0.0), times.shape[1]) for p in parts])[which, cols]
                for k in keys}

    step_at = np.argmax(steps, axis=0)
    first = costs[0]
    return LayerCosts(time_s=times[at, cols], step_time_s=steps[step_at, cols], state_bytes=first.state_bytes,
                      activation_bytes=first.activation_bytes, peak_extra_bytes=first.peak_extra_bytes,
                      parts_s=pick([c.parts_s for c in costs], at),
                      step_parts_s=pick([c.step_parts_s for c in costs], step_at),
                      memory_parts_bytes=first.memory_parts_bytes)
