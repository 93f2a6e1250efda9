"""Calibration sets: the analytic model's constants fitted from measured steps of one GPU type and stack, stored
as numbered versions of a name; and the resolution of a hybrid request to the set it is priced with.

A request names a set (``cost_model.calibration_set: "NAME"`` or ``"NAME@VERSION"``), or the service picks the
newest set whose GPU type and stack match the request's cluster, or no set applies and the shipped constants
price it. Where a stored set applies, the request is stored with ``cost_model.resolved_calibration_set`` (what
was chosen, its constants, why), which the solver prices with and states as ``estimate.calibration_set``: the
solver never reads the database, and a new version of a set makes an identical request a new plan. Where none
applies the request is stored as sent, and its estimates state the shipped constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.db.engine import Database
from service.db.models import CalibrationSet, Plan, PlanRequest, Profile, Run
from service.errors import Conflict, NotFound
from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.cost_model.calibration_set import RESOLVED, cluster_key, parse_name, set_key
from solvers.cost_model.fitting import (
    SET_FIT_KEYS,
    Measured,
    Measurement,
    fit_calibration,
    measurement_of,
    profile_measurements,
)
from solvers.cost_model.profile import load_profile
from solvers.documents.calibration import CalibrationFitDoc, CalibrationSetUse, ChosenBy
from solvers.errors import SpecError
from solvers.request import HybridRequest
from solvers.run_layout import runtime_request
from solvers.specs import StackSpec


def set_view(row: CalibrationSet) -> dict[str, Any]:
    return {"id": row.id, "name": row.name, "version": row.version, "gpu": row.gpu, "stack": row.stack,
            "constants": row.constants, "fit": row.fit, "sources": row.sources, "created_at": row.created_at}


# --- creating a set from measurements -----------------------------------------------------------------------
def measurements_of_runs(session: Session, run_ids: Sequence[str]) -> list[Measurement]:
    """Each finished run's measured step against its plan (request and strategy) on the stack the runtime ran
    (``solvers.run_layout.RUNTIME_STACK``): a set fitted from runs is the runtime's; SpecError at ``runs[i]``."""
    out = []
    for i, run_id in enumerate(run_ids):
        loc: tuple[str | int, ...] = ("runs", i)
        row = session.execute(select(Run, Plan, PlanRequest.request).join(Plan, Plan.id == Run.plan_id)
                              .join(PlanRequest, PlanRequest.id == Plan.request_id).where(Run.id == run_id)
                              ).one_or_none()
        if row is None:
            raise SpecError.at(loc, f"run {run_id} not found")
        run, plan, request = row
        step = (run.metrics or {}).get("step_time_s")
        if run.status != "succeeded" or not isinstance(step, int | float):
            raise SpecError.at(loc, f"run {run_id} is {run.status} without a measured step_time_s; only a "
                                    "succeeded run's measurement fits a set")
        if plan.kind != "hybrid" or not plan.result:
            raise SpecError.at(loc, f"run {run_id} ran a {plan.kind} plan; calibration sets price hybrid plans")
        # what ran is the runtime, on its own stack, whatever stack the plan was priced for
        out.append(measurement_of(runtime_request(request), plan.result["strategy"], float(step), loc))
    return out


def measurements_of_profiles(session: Session, profile_ids: Sequence[str], gpu: str) -> list[Measured]:
    """Each hardware profile's layer times and collectives on nodes of ``gpu``, as measurements of its model's
    layer on the stack it timed and of the links (``solvers.cost_model.fitting.profile_measurements``); SpecError
    at ``profiles[i]``."""
    out: list[Measured] = []
    for i, profile_id in enumerate(profile_ids):
        loc: tuple[str | int, ...] = ("profiles", i)
        row = session.get(Profile, profile_id)
        if row is None:
            raise SpecError.at(loc, f"profile {profile_id} not found")
        if row.kind != "hardware":
            raise SpecError.at(loc, f"profile {profile_id} is a {row.kind} profile; a set is fitted on a hardware "
                                    "profile's layer times")
        out += profile_measurements(load_profile(row.data, loc), gpu, loc)
    return out


def _one_key(measurements: Sequence[Measured], field: str) -> tuple[str, StackSpec]:
    """The GPU type and stack all the measurements share; SpecError at the first that differs."""
    first = measurements[0]
    key = cluster_key(first.cluster, first.training)
    for i, m in enumerate(measurements[1:], start=1):
        if cluster_key(m.cluster, m.training) != key:
            raise SpecError.at((field, i), f"measured on {m.cluster.gpu.name} with another stack or GPU type than "
                                           f"{field}[0] ({first.cluster.gpu.name}): a set is one GPU type and stack")
    return first.cluster.gpu.name, first.training.priced_stack()


def create_set(db: Database, name: str, measurements: Sequence[Measured], sources: dict[str, Any],
               field: str, keys: Sequence[str] = SET_FIT_KEYS) -> dict[str, Any]:
    """Fit the constants to ``measurements`` and store them as the next version of ``name`` (version 1 when the
    name is new). A name keeps its GPU type and stack: another one is a 409."""
    if not measurements:
        raise SpecError.at((field,), "needs at least one measurement")
    gpu, stack = _one_key(measurements, field)
    key = set_key(gpu, stack)
    fitted = fit_calibration(measurements, keys=keys)  # (seconds: outside any transaction)
    constants = {k: float(getattr(fitted.constants, k)) for k in fitted.report.keys}
    for _ in range(3):
        try:
            with db.writing() as session:
                latest = _latest(session, name)
                if latest is not None and latest.set_key != key:
                    raise Conflict(f"calibration set {name!r} is for {latest.gpu} and its stack; these "
                                   f"measurements are {gpu} or another stack: give them another name")
                row = CalibrationSet(name=name, version=(latest.version + 1) if latest else 1, gpu=gpu,
                                     stack=stack.model_dump(mode="json"), set_key=key, constants=constants,
                                     fit=fitted.report.model_dump(mode="json"), sources=sources)
                session.add(row)
                session.flush()
                return set_view(row)
        except IntegrityError:
            continue  # another version of the name was stored at the same moment: number after it
    raise Conflict(f"calibration set {name!r} is being written concurrently; retry")


# --- reading ------------------------------------------------------------------------------------------------
def _latest(session: Session, name: str) -> CalibrationSet | None:
    return session.execute(select(CalibrationSet).where(CalibrationSet.name == name)
                           .order_by(CalibrationSet.version.desc()).limit(1)).scalar_one_or_none()


def get_set(session: Session, name: str, version: int | None = None) -> dict[str, Any]:
    row = _latest(session, name) if version is None else session.execute(
        select(CalibrationSet).where(CalibrationSet.name == name, CalibrationSet.version == version)
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"calibration set {name!r}" + (f" version {version}" if version else "") + " not found")
    return set_view(row)


def list_sets(session: Session, name: str | None = None, gpu: str | None = None,
              limit: int = 100) -> list[dict[str, Any]]:
    """Every version, newest first."""
    query = select(CalibrationSet).order_by(CalibrationSet.created_at.desc(), CalibrationSet.version.desc())
    if name is not None:
        query = query.where(CalibrationSet.name == name)
    if gpu is not None:
        query = query.where(CalibrationSet.gpu == gpu)
    return [set_view(r) for r in session.execute(query.limit(limit)).scalars()]


# --- resolving a request ------------------------------------------------------------------------------------
def _use(row: CalibrationSet, chosen_by: ChosenBy, note: str) -> CalibrationSetUse:
    shipped = {k: float(getattr(DEFAULT_CALIBRATION, k)) for k in DEFAULT_CALIBRATION.__dataclass_fields__}
    return CalibrationSetUse(name=row.name, version=row.version, chosen_by=chosen_by, gpu=row.gpu,
                             stack=StackSpec.model_validate(row.stack), fit=CalibrationFitDoc.model_validate(row.fit),
                             constants={**shipped, **row.constants}, note=note)


def _fit_words(row: CalibrationSet) -> str:
    fit = CalibrationFitDoc.model_validate(row.fit)
    held = (f"held out {100 * fit.held_out_mape:.1f} %" if fit.held_out_mape is not None
            else "no held-out figure (one measurement)")
    pinned = ("" if fit.identified is None else
              f"; measured by them: {', '.join(fit.identified) or 'none'}, assumed: "
              f"{', '.join(k for k in fit.keys if k not in fit.identified) or 'none'}")
    network = ("" if fit.network_Gbps is None else
               f"; the network's efficiency is relative to {fit.network_Gbps:g} Gb/s per node"
               + ("" if fit.network_stated else " (the GPU preset's: the measurements did not state their network)"))
    short = ("" if not fit.unfinished else
             f"; the search stopped short of the measurements' best fit: {', '.join(fit.unfinished)} would still "
             "improve it")
    return (f"fitted on {fit.measurements} measured step(s) of {row.gpu}: in-sample {100 * fit.fit_mape:.1f} %, "
            f"{held}{pinned}{network}{short}")


def resolve(session: Session, request: dict[str, Any]) -> CalibrationSetUse | None:
    """The stored set a hybrid request is priced with; None where none applies (the shipped constants, which the
    solver states), or for a request whose own errors the solver's validation reports."""
    if request.get("kind", "hybrid") != "hybrid":
        return None
    cost_model = request.get("cost_model") or {}
    if not isinstance(cost_model, dict):
        return None
    named = cost_model.get("calibration_set")
    if cost_model.get("kind", "analytic") not in ("analytic", "profile"):
        if named is not None:
            raise SpecError.at(("cost_model", "calibration_set"), "a calibration set holds the analytic model's "
                               "constants: it applies to cost_model.kind analytic or profile")
        return None
    try:
        req = HybridRequest.model_validate({k: v for k, v in request.items() if k != "cost_model"})
    except ValueError:
        return None  # validation names the request's errors
    key = cluster_key(req.cluster, req.training)
    if named is not None:
        name, version = parse_name(named)
        row = _latest(session, name) if version is None else session.execute(
            select(CalibrationSet).where(CalibrationSet.name == name, CalibrationSet.version == version)
        ).scalar_one_or_none()
        if row is None:
            raise SpecError.at(("cost_model", "calibration_set"), f"no stored calibration set {named!r} "
                               "(GET /v1/calibration-sets lists them)")
        fits = "" if row.set_key == key else (" — fitted on another GPU type or stack than this request's "
                                              f"({req.cluster.gpu.name if req.cluster.groups is None else 'groups'})")
        return _use(row, "request", f"set {row.name!r} v{row.version}, named by the request; {_fit_words(row)}{fits}")
    if key is None:
        return None
    row = session.execute(select(CalibrationSet).where(CalibrationSet.set_key == key)
                          .order_by(CalibrationSet.created_at.desc(), CalibrationSet.version.desc()).limit(1)
                          ).scalar_one_or_none()
    if row is None:
        return None  # the request stays as sent; the solver prices the shipped constants and says so
    return _use(row, "cluster", f"set {row.name!r} v{row.version}, the newest stored for the cluster's "
                                f"{row.gpu} and stack; {_fit_words(row)}")


def with_resolution(db: Database, request: dict[str, Any]) -> dict[str, Any]:
    """``resolved`` in a reading session of its own."""
    with db.reading() as session:
        return resolved(session, request)


def resolved(session: Session, request: dict[str, Any]) -> dict[str, Any]:
    """The request with ``cost_model.resolved_calibration_set`` set by this service where a stored set applies;
    else the request as sent, less any resolution a client wrote (only this service writes one)."""
    use = resolve(session, request)
    cost_model = request.get("cost_model")
    if use is None:
        if isinstance(cost_model, dict) and RESOLVED in cost_model:
            return {**request, "cost_model": {k: v for k, v in cost_model.items() if k != RESOLVED}}
        return request
    cost_model = {k: v for k, v in (cost_model or {}).items() if k != RESOLVED}
    return {**request, "cost_model": {**cost_model, RESOLVED: use.to_json()}}
