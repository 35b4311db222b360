"""The database: one place that opens it, versions it, and holds every query.

* :class:`Store` opens the database (SQLite or PostgreSQL), checks and migrates its schema
  (:mod:`gpulayer.store.migrations`) and hands out transactions. Every state change runs
  inside :meth:`Store.write`, which serialises writers: ``BEGIN IMMEDIATE`` on SQLite
  (several processes share one ``$GPULAYER_HOME``) and a transaction-scoped advisory lock
  on PostgreSQL (several servers share one database), so a placement pass never sees a
  half-written one and two passes never hand out the same device.
* :mod:`gpulayer.store.tables`: the tables.
* :mod:`gpulayer.store.queries`: every query, one named function each; task state changes
  are compare-and-set (:func:`~gpulayer.store.queries.transition_task`), so a late report
  from a superseded attempt changes nothing.
* :mod:`gpulayer.store.mapping`: rows to API records, in one place.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, SQLModel, create_engine

from gpulayer import config
from gpulayer.errors import InvalidInput
from gpulayer.store import marks, migrations
from gpulayer.store.tables import (
    BundleReaderRow,
    BundleRow,
    EventRow,
    JobRow,
    LogRow,
    MachineRow,
    MarkRow,
    MetaRow,
    SchemaRow,
    TaskRow,
    TokenRow,
    WorkerRow,
)

__all__ = [
    "BundleReaderRow",
    "BundleRow",
    "EventRow",
    "JobRow",
    "LogRow",
    "MachineRow",
    "MetaRow",
    "Store",
    "TaskRow",
    "TokenRow",
    "WorkerRow",
]

# Advisory lock key for PostgreSQL writers ("gpulayer" in ASCII, truncated to fit int8).
_PG_LOCK_KEY = 0x6770756C61796572 & 0x7FFFFFFFFFFFFFFF



def default_url() -> str:
    return f"sqlite:///{config.home() / 'gpulayer.db'}"


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` as users write it; drive it with psycopg 3."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    try:
        parsed = make_url(url)
    except Exception:
        raise InvalidInput(
            f"database URL {url!r} is not a URL; accepted: sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
        ) from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidInput(
            f"database URL {url!r}: backend {parsed.get_backend_name()!r} is not supported; "
            "accepted: sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
        )
    return url


class Store:
    """An open database with its schema checked and brought up to date."""

    def __init__(self, url: str | None = None) -> None:
        self.url = normalise_url(url or default_url())
        self.is_sqlite = self.url.startswith("sqlite")
        self.engine = self._make_engine()
        # SQLite: writers of this process queue here instead of in SQLite's busy handler,
        # which sleeps in growing steps and starves a busy server (see bench/server_heartbeats.py)
        self._write_lock = threading.RLock() if self.is_sqlite else None
        self._migrate()

    def _make_engine(self) -> Engine:
        if self.is_sqlite:
            path = make_url(self.url).database
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                # created readable by its owner only (SQLite gives its -wal and -shm files the
                # database's mode): it holds job specs, code, logs, results and token hashes
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            # pooled: opening a connection (and its PRAGMAs) cost more than a heartbeat's work
            engine = create_engine(
                self.url, pool_size=16, max_overflow=48, pool_timeout=60,
                connect_args={"check_same_thread": False, "timeout": 30},
            )

            @event.listens_for(engine, "connect")
            def _on_connect(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.close()

            @event.listens_for(engine, "begin")
            def _on_begin(conn: Any) -> None:
                mode = "IMMEDIATE" if conn.get_execution_options().get("gl_write") else "DEFERRED"
                # on the driver's connection: through exec_driver_sql this cost more than the
                # transaction's own statements on the hot path (see store/plain.py)
                conn.connection.driver_connection.execute(f"BEGIN {mode}")

            return engine
        return create_engine(self.url, pool_pre_ping=True, pool_size=10, max_overflow=20)

    def _migrate(self) -> None:
        with self.engine.connect().execution_options(gl_write=True) as conn:
            with conn.begin():
                if not self.is_sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
                found = migrations.current_version(conn)
                if found is None:
                    tables: list[Any] = [SchemaRow, WorkerRow, JobRow, TaskRow, BundleRow, LogRow,
                                         EventRow, TokenRow, BundleReaderRow,
                                         MachineRow, MetaRow, MarkRow]
                    SQLModel.metadata.create_all(conn, tables=[t.__table__ for t in tables])
                    marks.install(conn)
                    conn.execute(text("INSERT INTO gl_schema (id, version) VALUES (1, :v)"),
                                 {"v": migrations.SCHEMA_VERSION})
                else:
                    migrations.upgrade(conn, found)

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            v = migrations.current_version(conn)
            conn.rollback()
        return v or 0

    @contextmanager
    def write(self, *, lock: bool = True) -> Iterator[Session]:
        """A transaction that may change state; writers are serialised (see module doc)."""
        with self._write_lock or _NO_LOCK, self.engine.connect().execution_options(gl_write=True) as conn:
            with conn.begin():
                if lock and not self.is_sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
                with Session(bind=conn, expire_on_commit=False) as session:
                    yield session
                    session.flush()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self.engine.connect() as conn:
            with conn.begin():
                with Session(bind=conn, expire_on_commit=False) as session:
                    yield session

    def dispose(self) -> None:
        self.engine.dispose()


_NO_LOCK = contextlib.nullcontext()
