"""The database: one place that opens it, versions it, and holds the queries that matter.

The control plane reaches the database only through :class:`Store`. Every state change
runs inside :meth:`Store.write`, which serialises writers: ``BEGIN IMMEDIATE`` on SQLite
(several processes share one ``$GPULAYER_HOME``), and a transaction-scoped advisory lock
on PostgreSQL (several servers share one database). A placement pass therefore never
sees a half-written one and two passes never hand out the same device.

Task state changes go through :func:`transition_task`, a compare-and-set on the current
state: a report that arrives after the task moved on (a late report from a superseded
attempt) changes nothing.
"""

from __future__ import annotations

import contextlib
import json
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
from gpulayer.records import TaskState
from gpulayer.store import migrations
from gpulayer.store.tables import (
    BundleRow,
    EventRow,
    JobRow,
    LogRow,
    SchemaRow,
    TaskRow,
    TokenRow,
    WorkerRow,
)

__all__ = [
    "BundleRow",
    "EventRow",
    "JobRow",
    "LogRow",
    "Store",
    "TaskRow",
    "TokenRow",
    "WorkerRow",
    "transition_task",
]

# Advisory lock key for PostgreSQL writers ("gpulayer" in ASCII, truncated to fit int8).
_PG_LOCK_KEY = 0x6770756C61796572 & 0x7FFFFFFFFFFFFFFF

TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.ASSIGNED: frozenset({TaskState.RUNNING, TaskState.CANCELLED, TaskState.LOST,
                                   TaskState.FAILED}),
    TaskState.RUNNING: frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED,
                                  TaskState.TIMED_OUT, TaskState.LOST}),
}


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
        self._local = threading.local()
        # SQLite: writers of this process queue here instead of in SQLite's busy handler,
        # which sleeps in growing steps and starves a busy server (see bench/server_heartbeats.py)
        self._write_lock = threading.RLock() if self.is_sqlite else None
        self._migrate()

    def _make_engine(self) -> Engine:
        if self.is_sqlite:
            path = make_url(self.url).database
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
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
                conn.exec_driver_sql(f"BEGIN {mode}")

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
                                         EventRow, TokenRow]
                    SQLModel.metadata.create_all(conn, tables=[t.__table__ for t in tables])
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


def transition_task(
    session: Session, task_id: str, to: TaskState, **fields: Any
) -> bool:
    """Move a task to ``to`` if the move is allowed from the state it is in now.

    A compare-and-set: returns False (and changes nothing) when the task has already
    moved on, which is how late and duplicate reports are refused.
    """
    allowed_from = [s.value for s, targets in TASK_TRANSITIONS.items() if to in targets]
    if not allowed_from:
        return False
    sets = ", ".join(f"{k} = :{k}" for k in fields)
    params = {"id": task_id, "to": to.value, **{k: _sql_value(v) for k, v in fields.items()}}
    placeholders = ", ".join(f":f{i}" for i in range(len(allowed_from)))
    params.update({f"f{i}": s for i, s in enumerate(allowed_from)})
    sql = (
        f"UPDATE gl_tasks SET state = :to{', ' + sets if sets else ''} "
        f"WHERE id = :id AND state IN ({placeholders})"
    )
    result = session.execute(text(sql), params)
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def _sql_value(v: Any) -> Any:
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return v


def env_database_url() -> str | None:
    return os.environ.get("GPULAYER_DATABASE_URL") or None
