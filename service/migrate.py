"""Run Alembic migrations programmatically (used by ``paraplan db upgrade`` and tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from service.settings import get_settings

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(database_url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", database_url or get_settings().database_url)
    return cfg


def upgrade(revision: str = "head", database_url: str | None = None) -> None:
    command.upgrade(alembic_config(database_url), revision)
