"""Run Alembic migrations programmatically (used by ``paraplan db upgrade`` and tests)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from service.db.engine import sqlite_file
from service.settings import get_settings

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(database_url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    # configparser interpolates '%': URL-encoded options (e.g. search_path) must be escaped.
    cfg.set_main_option("sqlalchemy.url", (database_url or get_settings().database_url).replace("%", "%%"))
    return cfg


def upgrade(revision: str = "head", database_url: str | None = None) -> None:
    path = sqlite_file(database_url or get_settings().database_url)
    if path is not None:  # (a new data directory: the database is its first file)
        path.parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(database_url), revision)


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
