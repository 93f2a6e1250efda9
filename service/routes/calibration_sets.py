"""/v1/calibration-sets: the analytic model's constants per GPU type and stack, fitted from measured steps."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query

from service import calibration_sets
from service.auth import ReadAccess, SubmitAccess
from service.context import ServiceContext, get_context
from service.finite_json import FiniteJSONRoute
from service.schemas import CalibrationSetCreate, CalibrationSetOut
from service.tokens import Principal
from solvers.cost_model.fitting import PROFILE_FIT_KEYS, measurement_of
from solvers.errors import SpecError

router = APIRouter(prefix="/v1/calibration-sets", tags=["calibration sets"], route_class=FiniteJSONRoute)


@router.post("", response_model=CalibrationSetOut, status_code=201,
             responses={409: {"description": "the name holds a set of another GPU type or stack"},
                        422: {"description": "a run, measurement or profile that cannot be fitted; `loc` names "
                                              "it"}})
def create_set(body: CalibrationSetCreate, ctx: ServiceContext = Depends(get_context),
               _: Principal = SubmitAccess) -> dict[str, Any]:
    """Fit the constants to the measured steps (seconds), or to a profile's layer and collective times, and store
    them as the next version of the name; the result states the fit's in-sample and held-out error (leave one out,
    five folds beyond five measurements)."""
    given = [k for k in ("runs", "measurements", "profiles") if getattr(body, k) is not None]
    if len(given) != 1:
        raise SpecError.at((given[1] if len(given) > 1 else "runs",), "give one of runs (ids of finished runs), "
                           "measurements or profiles (ids of hardware profiles)")
    if (body.gpu is None) != (body.profiles is None):
        raise SpecError.at(("gpu",), "the GPU preset the profiles ran on: with profiles, and only with them (a run "
                                     "or measurement states its cluster)")
    if body.runs is not None:
        with ctx.db.reading() as session:
            measured = calibration_sets.measurements_of_runs(session, body.runs)
        return calibration_sets.create_set(ctx.db, body.name, measured, {"runs": body.runs}, "runs")
    if body.profiles is not None:
        assert body.gpu is not None
        with ctx.db.reading() as session:
            points = calibration_sets.measurements_of_profiles(session, body.profiles, body.gpu)
        return calibration_sets.create_set(ctx.db, body.name, points, {"profiles": body.profiles, "gpu": body.gpu},
                                           "profiles", PROFILE_FIT_KEYS)
    assert body.measurements is not None
    measured = [measurement_of(m.request, m.strategy, m.step_time_s, ("measurements", i))
                for i, m in enumerate(body.measurements)]
    return calibration_sets.create_set(ctx.db, body.name, measured, {"measurements": len(measured)},
                                       "measurements")


@router.get("", response_model=list[CalibrationSetOut])
def list_sets(name: str | None = Query(None, max_length=128), gpu: str | None = Query(None, max_length=128),
              limit: int = Query(100, ge=1, le=1000), ctx: ServiceContext = Depends(get_context),
              _: Principal = ReadAccess) -> list[dict[str, Any]]:
    """Every stored version, newest first."""
    with ctx.db.reading() as session:
        return calibration_sets.list_sets(session, name, gpu, limit)


@router.get("/{name}", response_model=CalibrationSetOut)
def get_set(name: str, version: int | None = Query(None, ge=1), ctx: ServiceContext = Depends(get_context),
            _: Principal = ReadAccess) -> dict[str, Any]:
    """The newest version of a set, or ``version``."""
    with ctx.db.reading() as session:
        return calibration_sets.get_set(session, name, version)
