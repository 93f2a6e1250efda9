"""Engine and session factories.

SQLite: WAL so readers never block the writer, a busy timeout instead of immediate "database is locked",
and write transactions opened with ``BEGIN IMMEDIATE`` so that a read-then-write transaction (a claim)
takes the write lock up front instead of failing when it upgrades. PostgreSQL ignores that option; claims
there use ``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

_BEGIN_OPTION = "sqlite_begin"


class DatabaseMissing(Exception):
    """A SQLite database file that does not exist: connecting would create an empty one (and then fail)."""


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None for other databases and in-memory SQLite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    database = str(parsed.database)
    if str(parsed.query.get("uri", "")).lower() == "true":  # sqlite:///file:PATH?mode=ro&uri=true
        if not database.startswith("file:") or parsed.query.get("mode") == "memory":
            return None
        return Path(unquote(urlparse(database).path))
    return Path(database)


def shown_url(url: str) -> str:
    """The URL as messages print it: a SQLite file as its absolute path, others without their password."""
    path = sqlite_file(url)
    return str(path.resolve()) if path is not None else make_url(url).render_as_string(hide_password=True)


def require_database(url: str) -> None:
    """Raise DatabaseMissing, naming the file and how to create it, when a SQLite database does not exist."""
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise DatabaseMissing(f"no database at {path.resolve()}: `paraplan db upgrade` creates it "
                              "(PARAPLAN_DATA_DIR or PARAPLAN_DATABASE_URL choose another)")


def make_engine(url: str, pool_size: int = 10) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               pool_size=pool_size, max_overflow=20)
        _configure_sqlite(engine)
        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=20, pool_pre_ping=True, pool_recycle=1800)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from pysqlite so that BEGIN is ours (IMMEDIATE when asked).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


@dataclass
class Database:
    """One engine and its two session factories: plain (reads) and write (BEGIN IMMEDIATE on SQLite)."""

    engine: Engine
    read: sessionmaker[Session]
    write: sessionmaker[Session]

    @classmethod
    def connect(cls, url: str, pool_size: int = 10) -> Database:
        engine = make_engine(url, pool_size)
        writer = engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        return cls(engine, sessionmaker(engine, expire_on_commit=False),
                   sessionmaker(writer, expire_on_commit=False))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def reading(self) -> Iterator[Session]:
        with self.read() as session:
            yield session

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A write transaction, committed on success and rolled back on error."""
        with self.write() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
