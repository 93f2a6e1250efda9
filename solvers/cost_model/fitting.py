"""Fitting the analytic model's few constants to measured steps: a coordinate search within physical bounds.

Used by ``bench/fidelity.py`` (the published data sets, its own loss) and by the service's calibration sets
(measured steps of one GPU type and stack, or a hardware profile's layer times: mean absolute percentage error,
and leave-one-out or five-fold fits for the held-out figure). Pure: measurements in, constants and figures out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from solvers.cost_model import communication as comm
from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import StageContext
from solvers.cost_model.calibration import DEFAULT_CALIBRATION, AnalyticCalibration
from solvers.cost_model.profile import CollectiveOp, Profile
from solvers.documents.calibration import CalibrationFitDoc
from solvers.errors import SpecError
from solvers.specs import ClusterSpec, ModelSpec, Precision, TrainingSpec
from solvers.strategy import LayerStrategy, PlanStrategy

FIT_KEYS = ("gemm_eta_max", "gemm_d_half", "elementwise_traffic", "kernel_overhead_s", "microbatch_overhead_s",
            "intra_efficiency", "inter_efficiency", "intra_latency_s", "inter_latency_s", "dp_overlap", "tp_overlap",
            "gemm_k_half")

# physical ceilings: no GEMM beats ~90% of the tensor-core peak, no link beats its nominal bandwidth
FIT_BOUNDS = {"gemm_eta_max": 0.9, "intra_efficiency": 1.0, "inter_efficiency": 1.0, "dp_overlap": 1.0,
              "tp_overlap": 1.0}

Loss = Callable[[AnalyticCalibration], float]


def moves(c: AnalyticCalibration, key: str, step: float) -> list[float]:
    """The values one search step tries for ``key``: its value times 1 ± ``step`` within its bound; from 0, which no
    factor moves (a CPU start has no kernel-issue floor), ``step`` times the shipped constant, as the first step up."""
    value, bound = getattr(c, key), FIT_BOUNDS.get(key, float("inf"))
    if value == 0:
        return [min(step * getattr(DEFAULT_CALIBRATION, key), bound)]
    return [min(value * f, bound) for f in (1 - step, 1 + step)]


# How many times a sweep's largest gain is extended, each move twice the last (2^8 - 1 = 255 of its own at most),
# and how many times a move that went too far is halved back (in log space: the square root of its factor)
MAX_EXTENSIONS = 8
MAX_HALVINGS = 4
# A set's fit extends its moves while one of its measurements is more than this far off: measurements that far off
# their start constants describe another machine (a CPU host several times slower than its preset, a network a
# tenth of the preset's), not the model's error (8 % on the published sets); closer, moves of 20 % and less keep
# the constants the measurements leave free near their start (a run whose step hides its compute says little of it)
FAR_OFF = 0.25


def _extend(loss: Loss, best: AnalyticCalibration, best_loss: float, key: str, ratio: float
            ) -> tuple[AnalyticCalibration, float]:
    """Go on multiplying ``key`` by ``ratio`` (its move of the sweep), each move twice the last, while that lowers
    ``loss``, then halve the move that went too far back while it does not: a constant far from its start (a CPU
    host a hundred times slower than its preset) is reached in a sweep, not one 20 % move a sweep. Only the sweep's
    largest gain is extended: the constants the measurements leave free stay as near their start as its moves left
    them."""
    bound = FIT_BOUNDS.get(key, float("inf"))
    extensions = halvings = 0
    for _ in range(4 * (MAX_EXTENSIONS + MAX_HALVINGS)):  # (a bound on the loss's evaluations, whatever its shape)
        if extensions == MAX_EXTENSIONS or halvings > MAX_HALVINGS:
            break
        value = min(getattr(best, key) * ratio, bound)
        cand = replace(best, **{key: value})
        cand_loss = loss(cand) if value != getattr(best, key) else best_loss
        if cand_loss < best_loss - 1e-6:
            best, best_loss = cand, cand_loss
            if not halvings:
                extensions, ratio = extensions + 1, ratio * ratio
        else:
            halvings, ratio = halvings + 1, math.sqrt(ratio)
    return best, best_loss


def coordinate_fit(loss: Loss, start: AnalyticCalibration = DEFAULT_CALIBRATION, keys: Sequence[str] = FIT_KEYS,
                   max_sweeps: int = 12, on_sweep: Callable[[float, float, AnalyticCalibration], None] | None = None,
                   good_enough: float = 0.0, extend_while: Callable[[AnalyticCalibration], bool] | None = None
                   ) -> AnalyticCalibration:
    """Multiply one constant at a time by 1 ± step (``moves``), keeping what lowers ``loss``; after a sweep that
    ends where ``extend_while`` holds, go on with the move that gained most while that pays (``_extend``); halve the
    step after a sweep that changed nothing (from 20 % down to 2 %), stop early at a loss of ``good_enough``.
    ``on_sweep(step, loss, constants)`` after each sweep."""
    best = start
    best_loss = loss(best)
    step = 0.2
    for _ in range(max_sweeps):
        if step <= 0.02 or best_loss <= good_enough:
            break
        improved = False
        gains: dict[str, tuple[float, float]] = {}  # key: (the loss its move took off, the factor it moved by)
        for key in keys:
            for value in moves(best, key, step):
                cand = replace(best, **{key: value})
                cand_loss = loss(cand)
                if cand_loss < best_loss - 1e-6:
                    if getattr(best, key) > 0:  # (no factor leaves 0: a move off it is not extended)
                        gains[key] = (best_loss - cand_loss, value / getattr(best, key))
                    best, best_loss, improved = cand, cand_loss, True
        if not improved:
            step /= 2
        elif gains and extend_while is not None and extend_while(best):
            key = max(gains, key=lambda k: gains[k][0])
            best, best_loss = _extend(loss, best, best_loss, key, gains[key][1])
        if on_sweep:
            on_sweep(step, best_loss, best)
    return best


def pinned_and_unfinished(loss: Loss, fitted: AnalyticCalibration, keys: Sequence[str], step: float = 0.2,
                          tolerance: float = 0.005) -> tuple[list[str], list[str]]:
    """(``identified_keys``, ``unfinished_keys``) from one pricing of each key's ± ``step`` moves (``moves``)."""
    base = loss(fitted)
    at = {key: [loss(replace(fitted, **{key: v})) for v in moves(fitted, key, step)] for key in keys}
    return ([key for key in keys if max(at[key]) - base > tolerance],
            [key for key in keys if min(at[key]) < base - tolerance])


def identified_keys(loss: Loss, fitted: AnalyticCalibration, keys: Sequence[str], step: float = 0.2,
                    tolerance: float = 0.005) -> list[str]:
    """The ``keys`` the data behind ``loss`` pin down: moving one by ± ``step`` from the fit raises the loss by more
    than ``tolerance``. A constant the data leave free keeps (or drifts near) its start: assumed, not measured —
    a single-node run says nothing of the network, a large model's step nothing of the host's kernel issue."""
    return pinned_and_unfinished(loss, fitted, keys, step, tolerance)[0]


def unfinished_keys(loss: Loss, fitted: AnalyticCalibration, keys: Sequence[str], step: float = 0.2,
                    tolerance: float = 0.005) -> list[str]:
    """The ``keys`` that one more move of ± ``step`` from the fit would still improve ``loss`` by more than
    ``tolerance``: the search ran out of sweeps before it reached them (within ``FAR_OFF`` of the measurements a
    constant moves 20 % a sweep; constants that pull against each other zig-zag down their valley), so the fit is the
    best it reached, not the measurements' best."""
    return pinned_and_unfinished(loss, fitted, keys, step, tolerance)[1]


@dataclass(frozen=True)
class Measurement:
    """One measured training step: what ran (model, cluster, training with its stack, the plan) and how long."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    plan: PlanStrategy
    step_time_s: float

    def predicted_s(self, cal: AnalyticCalibration) -> float:
        return AnalyticCostModel(self.model, self.cluster, self.training, calibration=cal).evaluate(
            self.plan).step_time_s


@dataclass(frozen=True)
class LayerMeasurement:
    """One transformer layer's measured forward + backward at ``samples`` per micro-batch in ``layer``'s layout (a
    profile's point), less its own collectives, as the profiler times it: what the analytic model prices as the
    layer's compute and its host's kernel issue."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layer: LayerStrategy
    samples: int
    step_time_s: float  # (the measured time a fit matches, named as a step's)

    def predicted_s(self, cal: AnalyticCalibration) -> float:
        ctx = StageContext(pp=1, stage=0, micro_batches=1, micro_batch_samples=self.samples)
        parts = AnalyticCostModel(self.model, self.cluster, self.training, calibration=cal).layer_costs(
            0, [self.layer], ctx).parts_s
        return float(parts["compute"][0] + parts["launch_overhead"][0])


@dataclass(frozen=True)
class CollectiveMeasurement:
    """One collective's measured time (a profile's point): ``op`` over ``group_size`` ranks, ``ranks_per_node`` of
    them on each node, of ``message_bytes`` (as the profile and the analytic model count them), priced on the
    cluster's links (NVLink within a node, the GPU's share of the node's network across nodes) with the constants'
    efficiencies and per-step latencies."""

    cluster: ClusterSpec  # (its gpus_per_node: the launch's, whose ranks shared the node's network)
    training: TrainingSpec  # (its stack keys the set; a collective's price does not read it)
    op: CollectiveOp
    group_size: int
    ranks_per_node: int
    message_bytes: float
    step_time_s: float

    @property
    def across_nodes(self) -> bool:
        return self.ranks_per_node < self.group_size

    def predicted_s(self, cal: AnalyticCalibration) -> float:
        links = comm.Links.calibrated(self.cluster, cal)
        if self.op == "p2p":
            return float(comm.p2p_s(self.message_bytes, self.across_nodes, links))
        return float(comm.collective_s(self.op, self.message_bytes, self.group_size, self.ranks_per_node, links))


Measured = Measurement | LayerMeasurement | CollectiveMeasurement


def layer_measurements(profile: Profile, gpu: str | dict[str, Any], loc: tuple[str | int, ...] = ()
                       ) -> list[LayerMeasurement]:
    """A profile's dense layer times (plain and Megatron-SP tensor parallelism, whole samples) as measurements
    of the layer of its ``model`` on its ``stack``, on a node of ``gpu`` (a preset name, or a GPU object as a
    cluster takes one: a profile names its device as torch does), in the precision the profiler ran it (fp32 on a
    CPU, bf16 autocast on a GPU). SpecError under ``loc`` where the profile states no model or stack, or holds no
    such layer time; at ``gpu`` for a GPU no cluster takes."""
    if profile.model is None or profile.stack is None:
        missing = "model" if profile.model is None else "stack"
        raise SpecError.at((*loc, missing), f"the profile states no {missing} (the layers it timed): profile again "
                                            "with `paraplan worker profile`, which records both")
    points = [x for x in profile.layer_times if x.layer_type == "dense" and x.cp == 1 and x.ulysses == 1
              and x.ep == 1 and x.backward_ms is not None and x.batch >= 1 and float(x.batch).is_integer()]
    if not points:
        raise SpecError.at((*loc, "layer_times"), "no dense layer time with its backward at a whole number of "
                                                  "samples: nothing to fit")
    try:
        cluster = ClusterSpec.model_validate({"gpu": gpu, "nodes": 1,
                                              "gpus_per_node": max(8, max(x.tp for x in points))})
    except ValueError as err:
        raise SpecError.at(("gpu",), f"{gpu!r}: {err}") from None
    precision: Precision = "fp32" if cluster.gpu.name.lower() == "cpu" else "bf16"
    dense = profile.model.model_copy(update={"moe": None})  # the layer the dense points timed (of an MoE model too)
    out = []
    for x in points:
        assert x.backward_ms is not None  # (filtered above)
        training = TrainingSpec(global_batch_size=int(x.batch), seq_length=x.seq, precision=precision,
                                stack=profile.stack)
        layer = LayerStrategy(tp=x.tp, sp="megatron" if x.sp else None)
        out.append(LayerMeasurement(dense, cluster, training, layer, int(x.batch),
                                    (x.forward_ms + x.backward_ms) / 1e3))
    return out


def profile_measurements(profile: Profile, gpu: str | dict[str, Any], loc: tuple[str | int, ...] = ()
                         ) -> list[Measured]:
    """What a profile measured that the analytic model prices alike: its dense layer times
    (``layer_measurements``) and its collectives: those within a node (on NVLink), and those across nodes where the
    profile states the nodes each group spanned and its launch's ranks per node (``Profile.gpus_per_node``: the
    share of the node's network each rank had), on the network it states (``Profile.inter_node_bandwidth_Gbps``;
    the GPU preset's where it does not, as the cluster's own field then says). Groups across nodes of an older
    profile, which does not say, and groups within a node larger than the launch's node (or than 8 ranks where it is
    not stated) are left out."""
    layers = layer_measurements(profile, gpu, loc)
    node, training = layers[0].cluster, layers[0].training
    launch = profile.gpus_per_node or node.gpus_per_node
    network = ({"inter_node_bandwidth_Gbps": profile.inter_node_bandwidth_Gbps}
               if profile.inter_node_bandwidth_Gbps is not None else {})
    out: list[Measured] = [*layers]
    clusters = {1: node}  # by the nodes a group spans: each of the launch's size
    for c in profile.collectives:
        k = c.ranks_per_node
        if k is None or k > launch or (c.across_nodes and profile.gpus_per_node is None):
            continue
        nodes = c.group_size // k
        if nodes not in clusters:
            clusters[nodes] = ClusterSpec.model_validate(
                {**node.model_dump(mode="json", exclude_none=True), "nodes": nodes, "gpus_per_node": launch,
                 **network})
        out.append(CollectiveMeasurement(clusters[nodes], training, c.op, c.group_size, k, c.message_bytes,
                                         c.time_ms / 1e3))
    return out


def measurement_of(request: dict[str, Any], strategy: dict[str, Any], step_time_s: float,
                   loc: tuple[str | int, ...] = ()) -> Measurement:
    """A measured step of a hybrid request run with ``strategy`` (a plan's strategy object, or the uniform
    shorthand); SpecError under ``loc`` when the request or strategy is not one the analytic model prices."""
    from solvers.cost_model.factory import plan_from_dict, plan_from_shorthand
    from solvers.request import HybridRequest, parse

    try:
        req: HybridRequest = parse(HybridRequest, request)
        if req.cluster.groups is not None:
            raise SpecError.at(("cluster", "groups"), "a calibration set describes one GPU type")
        build = plan_from_dict if "layers" in strategy else plan_from_shorthand
        plan = build(strategy, req.model, req.cluster, req.training)
    except SpecError as err:
        raise err.under(*loc) from None
    if not step_time_s > 0:
        raise SpecError.at((*loc, "step_time_s"), f"must be a positive number of seconds, got {step_time_s!r}")
    return Measurement(req.model, req.cluster, req.training, plan, float(step_time_s))


def predict_s(m: Measured, cal: AnalyticCalibration) -> float:
    return m.predicted_s(cal)


def mape(measurements: Sequence[Measured], cal: AnalyticCalibration) -> float:
    """Mean absolute percentage error (a fraction) of the model's steps against the measured ones."""
    return float(np.mean([abs(predict_s(m, cal) - m.step_time_s) / m.step_time_s for m in measurements]))


def _mape_of(measurements: Sequence[Measured]) -> Loss:
    return lambda c: mape(measurements, c)


def _far_off(measurements: Sequence[Measured]) -> Callable[[AnalyticCalibration], bool]:
    """Whether one of ``measurements`` is more than ``FAR_OFF`` off its prediction under the constants."""
    return lambda c: any(abs(predict_s(m, c) - m.step_time_s) > FAR_OFF * m.step_time_s for m in measurements)


# A set fitted from a handful of runs moves the constants that every step depends on; the per-link latencies and
# the GEMM-shape ones need the spread of the published data sets to be identified.
SET_FIT_KEYS = ("gemm_eta_max", "kernel_overhead_s", "microbatch_overhead_s", "intra_efficiency",
                "inter_efficiency", "dp_overlap")
# A profile times layers and collectives, not steps: the GEMM plateau and the host's kernel issue (its layers), the
# NVLink and network efficiencies and per-step latencies (its collectives within and across nodes, small messages to
# large; a single-node profile pins no network constant, and the fit's report says so).
PROFILE_FIT_KEYS = ("gemm_eta_max", "kernel_overhead_s", "intra_efficiency", "intra_latency_s", "inter_efficiency",
                    "inter_latency_s")
SET_GOOD_ENOUGH = 0.005  # a fit within 0.5 % of its measurements stops: run-to-run noise is larger
MAX_FOLDS = 5  # held-out fits of a set: leave one out up to this many measurements, this many folds beyond


def network_basis(measurements: Sequence[Measured]) -> tuple[float | None, bool | None]:
    """The network, per node (Gb/s; the fastest, where they ran on several), that the measurements across nodes (a
    profile's collectives, or steps on several nodes) ran on, and whether each stated it (a profile's or request's
    ``inter_node_bandwidth_Gbps``; else the GPU preset's stands for it): what a fitted network efficiency is
    relative to. (None, None) where none ran across nodes."""
    clusters = [m.cluster for m in measurements
                if (m.across_nodes if isinstance(m, CollectiveMeasurement) else m.cluster.nodes > 1)]
    if not clusters:
        return None, None
    return (max(c.inter_Gbps for c in clusters),
            all(c.inter_node_bandwidth_Gbps is not None for c in clusters))


@dataclass(frozen=True)
class CalibrationFit:
    constants: AnalyticCalibration
    report: CalibrationFitDoc


def fit_calibration(measurements: Sequence[Measured], start: AnalyticCalibration = DEFAULT_CALIBRATION,
                    keys: Sequence[str] = SET_FIT_KEYS, max_sweeps: int = 6) -> CalibrationFit:
    """Constants fitted to ``measurements`` (MAPE), with the in-sample error, and the held-out error (each
    measurement predicted by constants fitted without it: leave one out, ``MAX_FOLDS`` folds beyond as many)."""
    if not measurements:
        raise ValueError("a fit needs at least one measurement")
    loss = _mape_of(measurements)
    fitted = coordinate_fit(loss, start, keys, max_sweeps, good_enough=SET_GOOD_ENOUGH,
                            extend_while=_far_off(measurements))
    # pinned: a ±20 % move costs more than the runs' noise (as SET_GOOD_ENOUGH has it); unfinished: one still gains
    # more than that
    identified, unfinished = pinned_and_unfinished(loss, fitted, keys, tolerance=SET_GOOD_ENOUGH)
    held_out: float | None = None
    note: str | None = "one measurement: nothing to hold out"
    if len(measurements) > 1:
        # leave one out, or beyond MAX_FOLDS measurements (a profile's layer times) every MAX_FOLDS-th together: as
        # many fits as folds, each its measurements predicted by constants fitted on the rest
        folds = min(len(measurements), MAX_FOLDS)
        errors = []
        for k in range(folds):
            held = measurements[k::folds]
            rest = [x for j, x in enumerate(measurements) if j % folds != k]
            refit = coordinate_fit(_mape_of(rest), start, keys, max_sweeps, good_enough=SET_GOOD_ENOUGH,
                                   extend_while=_far_off(rest))
            errors += [mape([m], refit) for m in held]
        held_out, note = float(np.mean(errors)), None
    network_Gbps, network_stated = network_basis(measurements)
    return CalibrationFit(fitted, CalibrationFitDoc(
        measurements=len(measurements), keys=list(keys), start_mape=mape(measurements, start),
        fit_mape=mape(measurements, fitted), held_out_mape=held_out, held_out_note=note, identified=identified,
        unfinished=unfinished, network_Gbps=network_Gbps, network_stated=network_stated))
