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
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

_BEGIN_OPTION = "sqlite_begin"


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
