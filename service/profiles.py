"""Hardware and model calibration profiles uploaded by workers."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Profile
from service.errors import get_or_404


def profile_view(p: Profile, with_data: bool = True) -> dict[str, Any]:
    view: dict[str, Any] = {"id": p.id, "name": p.name, "kind": p.kind, "host": p.host, "created_at": p.created_at}
    if with_data:
        view["data"] = p.data
    return view


def create_profile(session: Session, name: str, kind: str, host: str | None, data: dict[str, Any]) -> dict[str, Any]:
    profile = Profile(name=name, kind=kind, host=host, data=data)
    session.add(profile)
    session.flush()
    return profile_view(profile)


def get_profile(session: Session, profile_id: str) -> dict[str, Any]:
    profile = get_or_404(session, Profile, profile_id, "profile")
    return profile_view(profile)


def list_profiles(session: Session, kind: str | None = None, host: str | None = None,
                  name: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    query = select(Profile).order_by(Profile.created_at.desc()).limit(limit)
    for column, value in ((Profile.kind, kind), (Profile.host, host), (Profile.name, name)):
        if value is not None:
            query = query.where(column == value)
    return [profile_view(p) for p in session.execute(query).scalars()]


def delete_profile(session: Session, profile_id: str) -> None:
    profile = get_or_404(session, Profile, profile_id, "profile")
    session.delete(profile)
