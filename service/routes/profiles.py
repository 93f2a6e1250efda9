"""/v1/profiles: hardware and model calibration data."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Response

from service import profiles
from service.auth import AdminAccess, ReadAccess, WorkerAccess
from service.context import ServiceContext, get_context
from service.finite_json import FiniteJSONRoute
from service.schemas import ProfileCreate, ProfileOut
from service.tokens import Principal

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], route_class=FiniteJSONRoute)


@router.post("", response_model=ProfileOut, status_code=201)
def create_profile(body: ProfileCreate, ctx: ServiceContext = Depends(get_context),
                   _: Principal = WorkerAccess) -> dict[str, Any]:
    with ctx.db.writing() as session:
        return profiles.create_profile(session, body.name, body.kind, body.host, body.data)


@router.get("", response_model=list[ProfileOut])
def list_profiles(kind: Literal["hardware", "model"] | None = None, host: str | None = Query(None, max_length=255),
                  name: str | None = Query(None, max_length=255), limit: int = Query(100, ge=1, le=1000),
                  ctx: ServiceContext = Depends(get_context), _: Principal = ReadAccess) -> list[dict[str, Any]]:
    with ctx.db.reading() as session:
        return profiles.list_profiles(session, kind, host, name, limit)


@router.get("/{profile_id}", response_model=ProfileOut)
def get_profile(profile_id: str, ctx: ServiceContext = Depends(get_context),
                _: Principal = ReadAccess) -> dict[str, Any]:
    with ctx.db.reading() as session:
        return profiles.get_profile(session, profile_id)


@router.delete("/{profile_id}", status_code=204)
def delete_profile(profile_id: str, ctx: ServiceContext = Depends(get_context),
                   _: Principal = AdminAccess) -> Response:
    with ctx.db.writing() as session:
        profiles.delete_profile(session, profile_id)
    return Response(status_code=204)
