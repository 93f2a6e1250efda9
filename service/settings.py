"""Service settings, read from the environment (prefix ``PARAPLAN_``) or a ``.env`` file."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> str:
    """Where paraplan keeps its data unless told: the user's data directory (XDG), never the working directory
    (a database relative to it made every command run elsewhere open a second, empty one)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "paraplan")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PARAPLAN_", env_file=".env", extra="ignore")

    # the SQLite database's directory when database_url is not given
    data_dir: str = Field(default_factory=default_data_dir)
    database_url: str = Field(default="", description="SQLAlchemy URL (default: SQLite in data_dir)")
    host: str = "127.0.0.1"
    port: int = 8000
    # Read endpoints (GET) need a token of scope "read" only when this is true.
    require_read_token: bool = False
    # When no token exists at all the service is open (local development); set to false in production.
    open_when_no_tokens: bool = True
    # Salt mixed into token hashes (a server-side secret: a stolen database alone cannot test guesses).
    token_pepper: str = "paraplan-dev-pepper"
    run_dispatcher: bool = True
    dispatcher_concurrency: int = 1
    job_time_limit_s: float = 300.0
    job_memory_limit_mib: int = 4096
    job_lease_s: float = 30.0
    job_max_attempts: int = 3
    run_lease_s: float = 60.0
    run_max_attempts: int = 3
    max_body_bytes: int = 8 * 2**20
    # Solver input limits (a request beyond them is refused with 413 naming the limit).
    max_layers: int = 1024
    max_gpus: int = 65536
    max_sequences: int = 200_000
    max_metaops: int = 512
    max_estimates: int = 1000  # requests in one POST /v1/estimate array
    max_wait_s: float = 60.0
    # Directories whose files requests may name (Galvatron profiles, plan files); none by default, so that a
    # request cannot make the server read arbitrary paths. JSON list in the environment.
    data_roots: list[str] = Field(default_factory=list)
    dispatcher_poll_s: float = 0.5
    seed_demo_plan: bool = False
    log_json: bool = True

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            self.database_url = f"sqlite:///{Path(self.data_dir).expanduser().resolve() / 'paraplan.db'}"
        return self


@lru_cache
def get_settings() -> Settings:
    return Settings()
