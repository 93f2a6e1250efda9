"""Fitting the analytic model's few constants to measured steps: a coordinate search within physical bounds.

Used by ``bench/fidelity.py`` (the published data sets, its own loss) and by the service's calibration sets
(measured runs of one GPU type and stack: mean absolute percentage error, and leave-one-measurement-out for the
held-out figure). Pure: measurements in, constants and figures out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.calibration import DEFAULT_CALIBRATION, AnalyticCalibration
from solvers.documents.calibration import CalibrationFitDoc
from solvers.errors import SpecError
from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec
from solvers.strategy import PlanStrategy

FIT_KEYS = ("gemm_eta_max", "gemm_d_half", "elementwise_traffic", "kernel_overhead_s", "microbatch_overhead_s",
            "intra_efficiency", "inter_efficiency", "intra_latency_s", "inter_latency_s", "dp_overlap", "tp_overlap",
            "gemm_k_half")

# physical ceilings: no GEMM beats ~90% of the tensor-core peak, no link beats its nominal bandwidth
FIT_BOUNDS = {"gemm_eta_max": 0.9, "intra_efficiency": 1.0, "inter_efficiency": 1.0, "dp_overlap": 1.0,
              "tp_overlap": 1.0}

Loss = Callable[[AnalyticCalibration], float]


def coordinate_fit(loss: Loss, start: AnalyticCalibration = DEFAULT_CALIBRATION, keys: Sequence[str] = FIT_KEYS,
                   max_sweeps: int = 12, on_sweep: Callable[[float, float, AnalyticCalibration], None] | None = None,
                   good_enough: float = 0.0) -> AnalyticCalibration:
    """Multiply one constant at a time by 1 ± step, keeping what lowers ``loss``; halve the step after a sweep
    that changed nothing (from 20 % down to 2 %), stop early at a loss of ``good_enough``.
    ``on_sweep(step, loss, constants)`` after each sweep."""
    best = start
    best_loss = loss(best)
    step = 0.2
    for _ in range(max_sweeps):
        if step <= 0.02 or best_loss <= good_enough:
            break
        improved = False
        for key in keys:
            for factor in (1 - step, 1 + step):
                value = min(getattr(best, key) * factor, FIT_BOUNDS.get(key, float("inf")))
                cand = replace(best, **{key: value})
                cand_loss = loss(cand)
                if cand_loss < best_loss - 1e-6:
                    best, best_loss, improved = cand, cand_loss, True
        if not improved:
            step /= 2
        if on_sweep:
            on_sweep(step, best_loss, best)
    return best


def identified_keys(loss: Loss, fitted: AnalyticCalibration, keys: Sequence[str], step: float = 0.2,
                    tolerance: float = 0.005) -> list[str]:
    """The ``keys`` the data behind ``loss`` pin down: moving one by ± ``step`` from the fit raises the loss by more
    than ``tolerance``. A constant the data leave free keeps (or drifts near) its start: assumed, not measured —
    a single-node run says nothing of the network, a large model's step nothing of the host's kernel issue."""
    base = loss(fitted)
    out = []
    for key in keys:
        moved = [min(getattr(fitted, key) * f, FIT_BOUNDS.get(key, float("inf"))) for f in (1 - step, 1 + step)]
        if max(loss(replace(fitted, **{key: v})) for v in moved) - base > tolerance:
            out.append(key)
    return out


@dataclass(frozen=True)
class Measurement:
    """One measured training step: what ran (model, cluster, training with its stack, the plan) and how long."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    plan: PlanStrategy
    step_time_s: float


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


def predict_s(m: Measurement, cal: AnalyticCalibration) -> float:
    return AnalyticCostModel(m.model, m.cluster, m.training, calibration=cal).evaluate(m.plan).step_time_s


def mape(measurements: Sequence[Measurement], cal: AnalyticCalibration) -> float:
    """Mean absolute percentage error (a fraction) of the model's steps against the measured ones."""
    return float(np.mean([abs(predict_s(m, cal) - m.step_time_s) / m.step_time_s for m in measurements]))


def _mape_of(measurements: Sequence[Measurement]) -> Loss:
    return lambda c: mape(measurements, c)


# A set fitted from a handful of runs moves the constants that every step depends on; the per-link latencies and
# the GEMM-shape ones need the spread of the published data sets to be identified.
SET_FIT_KEYS = ("gemm_eta_max", "kernel_overhead_s", "microbatch_overhead_s", "intra_efficiency",
                "inter_efficiency", "dp_overlap")
SET_GOOD_ENOUGH = 0.005  # a fit within 0.5 % of its measurements stops: run-to-run noise is larger


@dataclass(frozen=True)
class CalibrationFit:
    constants: AnalyticCalibration
    report: CalibrationFitDoc


def fit_calibration(measurements: Sequence[Measurement], start: AnalyticCalibration = DEFAULT_CALIBRATION,
                    keys: Sequence[str] = SET_FIT_KEYS, max_sweeps: int = 6) -> CalibrationFit:
    """Constants fitted to ``measurements`` (MAPE), with the in-sample error, and the held-out error of
    leave-one-measurement-out fits (each measurement predicted by constants fitted on the others)."""
    if not measurements:
        raise ValueError("a fit needs at least one measurement")
    fitted = coordinate_fit(_mape_of(measurements), start, keys, max_sweeps, good_enough=SET_GOOD_ENOUGH)
    # pinned: a ±20 % move costs more than the runs' noise (as SET_GOOD_ENOUGH has it)
    identified = identified_keys(_mape_of(measurements), fitted, keys, tolerance=SET_GOOD_ENOUGH)
    held_out: float | None = None
    note: str | None = "one measurement: nothing to hold out"
    if len(measurements) > 1:
        errors = []
        for i, m in enumerate(measurements):
            rest = [x for j, x in enumerate(measurements) if j != i]
            errors.append(mape([m], coordinate_fit(_mape_of(rest), start, keys, max_sweeps,
                                                   good_enough=SET_GOOD_ENOUGH)))
        held_out, note = float(np.mean(errors)), None
    return CalibrationFit(fitted, CalibrationFitDoc(
        measurements=len(measurements), keys=list(keys), start_mape=mape(measurements, start),
        fit_mape=mape(measurements, fitted), held_out_mape=held_out, held_out_note=note, identified=identified))
