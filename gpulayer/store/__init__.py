"""The database: one place that opens it, versions it, and holds every query.

* :class:`Store` opens the database (SQLite or PostgreSQL), checks and migrates its schema
  (:mod:`gpulayer.store.migrations`) and hands out transactions. Every state change runs
  inside :meth:`Store.write`, which serialises writers: on SQLite an ``flock`` of
  ``<database>.writers`` (several processes share one ``$GPULAYER_HOME``), then ``BEGIN
  IMMEDIATE``; on PostgreSQL a transaction-scoped advisory lock (several servers share one
  database), so a placement pass never sees a half-written one and two passes never hand
  out the same device. On SQLite a thread keeps its connection and session from one
  transaction to the next (:class:`_Kept`).
* :mod:`gpulayer.store.tables`: the tables.
* :mod:`gpulayer.store.queries`: every query, one named function each; task state changes
  are compare-and-set (:func:`~gpulayer.store.queries.transition_task`), so a late report
  from a superseded attempt changes nothing.
* :mod:`gpulayer.store.plain`: the statements of a job's cycle on the driver's own cursor
  (in the same transaction; the ORM's cost per statement was ten times SQLite's).
* :mod:`gpulayer.store.marks`: change marks kept by triggers, by which a placement pass
  knows whether the fleet changed.
* :mod:`gpulayer.store.mapping`: rows to API records, in one place.
* :mod:`gpulayer.store.nudges`: wake-ups between the processes that share one SQLite file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event, exc, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, SQLModel, create_engine

from gpulayer import config
from gpulayer.errors import DatabaseFailed, InvalidInput
from gpulayer.store import marks, migrations, plain
from gpulayer.store.nudges import Nudges
from gpulayer.store.outages import FULL, cannot_open_full, client_reason
from gpulayer.store.tables import (
    ArtifactsRow,
    BundleReaderRow,
    BundleRow,
    EventRow,
    JobAfterRow,
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
from gpulayer.store.urls import given, normalise_url

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: SQLite's own busy handler only
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "ArtifactsRow",
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


class Store:
    """An open database with its schema checked and brought up to date."""

    def __init__(self, url: str | None = None, *, where: str | None = None) -> None:
        """``where`` names the input the URL came from in errors (a flag such as
        ``--database``; by default ``GPULAYER_DATABASE_URL`` when it is that variable's): a URL
        GPUlayer cannot use, or a database it cannot create or open, is an
        :class:`~gpulayer.errors.InvalidInput` naming it (see :mod:`gpulayer.store.urls`)."""
        self.url = normalise_url(url or default_url(), where)
        #: how an error names this database (see :func:`gpulayer.store.urls.given`)
        self.named = given(url, where)
        self.is_sqlite = self.url.startswith("sqlite")
        #: SQLite: the connections' PRAGMA synchronous (GPULAYER_SQLITE_SYNC), and whether each
        #: commit is thereby synced to the disk (FULL, the default)
        self._sync = config.settings().sqlite_sync.upper()
        self.synced = self.is_sqlite and self._sync == "FULL"
        try:
            self.engine = self._make_engine()
            # SQLite: writers queue here instead of in SQLite's busy handler, which sleeps in
            # growing steps (1, 2, 5, 10 ms...) and starves a busy server (see
            # bench/server_heartbeats.py): those of this process on a lock, those of every
            # process on the database's lock file (a worker process and the submitting one)
            self._write_lock = _WriterLock.of(self._lock_path()) if self.is_sqlite else None
        except OSError as error:  # (its folder, its file or its lock file cannot be made)
            path, on = make_url(self.url).database, error.filename
            why = f"cannot create the database file {path}: {f'{on}: ' if on and on != path else ''}{error.strerror}"
            if _outage(error):  # (a full disk: the URL is right, and will do once it has room)
                raise DatabaseFailed(f"{self.named}: {why}", reason=error.strerror) from None
            raise InvalidInput(f"{given(url, where)}: {why}") from None
        #: wake-ups between the processes that share this SQLite file (None: not shared, or
        #: not supported here)
        self.nudges = Nudges.of(make_url(self.url).database) if self.is_sqlite else None
        #: per thread: the jobs its committed transactions ended (see take_ended)
        self._ended = threading.local()
        #: what a write transaction that ended jobs does before it commits (the control plane's:
        #: the jobs that run after them, gpulayer.control.after), and once it committed (with
        #: the session's ``info``, where the first left what the second needs)
        self.on_ended: Callable[[Session], None] | None = None
        self.after_ended: Callable[[dict[str, Any]], None] | None = None
        #: SQLite: a connection each thread keeps between its transactions (see _Kept)
        self._kept = _Kept(self.engine) if self.is_sqlite else None
        try:
            self._migrate()
        except migrations.SchemaTooNew as error:  # (which database, of the several one may serve)
            self.dispose()
            raise migrations.SchemaTooNew(f"{given(url, where)}: {error}") from None
        except (exc.SQLAlchemyError, OSError) as error:  # (not a database, unreachable, refused)
            self.dispose()
            if _outage(error):  # (a full disk under an upgrade: nothing of it was stored)
                raise self._failed(error) from None
            if self.is_sqlite and cannot_open_full(error, make_url(self.url).database):
                raise DatabaseFailed(f"{self._failed(error)} ({FULL})", reason=FULL) from None
            why = " ".join(str(getattr(error, "orig", None) or error).split())
            raise InvalidInput(f"{given(url, where)}: cannot open the database: {why}") from None

    def _lock_path(self) -> str | None:
        path = make_url(self.url).database
        return f"{path}.writers" if path and path != ":memory:" else None

    def _make_engine(self) -> Engine:
        if self.is_sqlite:
            path = make_url(self.url).database
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                # created readable by its owner only (SQLite gives its -wal and -shm files the
                # database's mode): it holds job specs, code, logs, results and token hashes
                with contextlib.suppress(FileExistsError):
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            # FULL: in WAL mode each commit syncs the log, so what was acknowledged survives a
            # power loss or an OS crash; NORMAL syncs at checkpoints only (GPULAYER_SQLITE_SYNC)
            # pooled: opening a connection (and its PRAGMAs) cost more than a heartbeat's work
            engine = create_engine(
                self.url, pool_size=16, max_overflow=48, pool_timeout=60,
                connect_args={"check_same_thread": False, "timeout": 30},
            )

            @event.listens_for(engine, "connect")
            def _on_connect(dbapi_conn: Any, record: Any) -> None:
                record.info["pid"] = os.getpid()
                dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
                cur = dbapi_conn.cursor()
                _wal(cur, path or "")
                cur.execute(f"PRAGMA synchronous={self._sync}")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.close()

            @event.listens_for(engine, "checkout")
            def _on_checkout(_dbapi_conn: Any, record: Any, proxy: Any) -> None:
                # a forked child (multiprocessing's default on Linux) must not use its parent's
                # connections: they are dropped unclosed (a close in the child could checkpoint
                # the parent's log) and the pool opens new ones
                if record.info.get("pid") != os.getpid():
                    record.dbapi_connection = proxy.dbapi_connection = None
                    raise exc.DisconnectionError("a connection of the process this one was forked from")

            @event.listens_for(engine, "begin")
            def _on_begin(conn: Any) -> None:
                mode = "IMMEDIATE" if conn.get_execution_options().get("gl_write") else "DEFERRED"
                # on the driver's connection: through exec_driver_sql this cost more than the
                # transaction's own statements on the hot path (see store/plain.py)
                driver = conn.connection.driver_connection
                if driver.in_transaction:  # a BEGIN SQLAlchemy never learnt of (a Ctrl-C just
                    # after it), on a kept connection: nothing ran in it, and nothing would end it
                    driver.rollback()
                driver.execute(f"BEGIN {mode}")

            return engine
        return create_engine(self.url, pool_pre_ping=True, pool_size=10, max_overflow=20)

    def _migrate(self) -> None:
        # read first: current at every open but the first after an upgrade, and a write here
        # would make every command wait for (past the busy timeout, fail on) any writer
        if self.schema_version() == migrations.SCHEMA_VERSION:
            return
        with self.engine.connect().execution_options(gl_write=True) as conn:
            with conn.begin():
                if not self.is_sqlite:
                    _advisory_lock(conn)
                found = migrations.current_version(conn)
                if found is None:
                    tables: list[Any] = [SchemaRow, WorkerRow, JobRow, TaskRow, BundleRow, LogRow,
                                         EventRow, TokenRow, BundleReaderRow, JobAfterRow,
                                         MachineRow, MetaRow, MarkRow, ArtifactsRow]
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
    def write(self, *, lock: bool = True, synced: bool = True) -> Iterator[Session]:
        """A transaction that may change state; writers are serialised (see module doc).
        Once it committed, the jobs it ended are added to :meth:`take_ended`'s.

        ``synced=False`` (SQLite): its commit is not synced to the disk before it returns, as
        every other one is (``PRAGMA synchronous=NORMAL`` for it alone): the next synced
        commit, or SQLite's next checkpoint, takes it there, in order. For what a power loss
        or an OS crash may take back without harm, and that comes often: a worker's signs of
        life (its heartbeats, every 0.5 s embedded), which cost an idle worker two syncs of
        the disk a second. PostgreSQL's commits are as its own settings say."""
        try:
            with self._write_lock or _NO_LOCK, self._connection(write=True) as (conn, session):
                relaxed = not synced and self.synced
                try:
                    if relaxed:
                        _driver(conn).execute("PRAGMA synchronous=NORMAL")
                    with conn.begin():
                        if lock and not self.is_sqlite:
                            _advisory_lock(conn)
                        with session:
                            yield session
                            session.flush()
                            if self.on_ended is not None and plain.ended_in(session):
                                self.on_ended(session)
                                session.flush()
                finally:
                    if relaxed:
                        _synced_again(conn)
        except (exc.OperationalError, sqlite3.OperationalError) as error:
            if _refused(error):
                raise
            raise self._failed(error) from error
        ended = plain.ended_in(session)
        if ended:
            self._ended.ids = self.take_ended() | ended
            if self.after_ended is not None:
                self.after_ended(session.info)

    def ended_pending(self) -> bool:
        """Whether :meth:`take_ended` has jobs to say."""
        return bool(getattr(self._ended, "ids", ()))

    def take_ended(self) -> frozenset[str]:
        """The jobs that the transactions this thread committed ended since its last call
        (what the control plane's next announcement of a change names: see
        :meth:`gpulayer.control.core.Core._changed`)."""
        ended: frozenset[str] = frozenset(getattr(self._ended, "ids", ()))
        self._ended.ids = frozenset()
        return ended

    def lock_writers(self, s: Session) -> None:
        """In a ``write(lock=False)`` that turns out to change what other writers read (a
        heartbeat that brings a worker back online moves the change marks, see
        :mod:`.marks`): take the writers' lock after all, before any row is changed, so it
        queues behind them instead of meeting them on the marks' row (PostgreSQL; SQLite's
        writers are serialised already)."""
        if not self.is_sqlite:
            _advisory_lock(s)

    @contextmanager
    def read(self) -> Iterator[Session]:
        try:
            with self._connection(write=False) as (conn, session):
                with conn.begin():
                    with session:
                        yield session
        except (exc.OperationalError, sqlite3.OperationalError) as error:
            if _refused(error):
                raise
            raise self._failed(error) from error

    def _failed(self, error: Exception) -> DatabaseFailed:
        """The database failed under a transaction (a full disk, a lock held too long, a
        PostgreSQL server gone; not a statement it refused, see :func:`_refused`): nothing of
        it was stored. Said naming the database, in
        one line, not as the driver's traceback (see :class:`~gpulayer.errors.DatabaseFailed`)."""
        orig = getattr(error, "orig", None) or error
        why = " ".join(str(orig).split())
        # (a client of a server is told the reason: PostgreSQL's own words name its host,
        # port, user and files, so it is said in ours; SQLite's name none)
        reason = getattr(orig, "reason", None) or (why if self.is_sqlite else client_reason(orig))
        return DatabaseFailed(f"{self.named}: {why}", reason=reason)

    def _connection(self, *, write: bool) -> contextlib.AbstractContextManager[tuple[Connection, Session]]:
        """A connection and a session on it for one transaction (``write``: it begins
        IMMEDIATE on SQLite): the thread's kept ones where it has them free, else a connection
        from the pool, given back after, and a new session."""
        kept = self._kept.lend(write) if self._kept is not None else None
        return kept if kept is not None else _Pooled(self.engine, write)

    def dispose(self) -> None:
        if self._kept is not None:
            self._kept.close()
        self.engine.dispose()
        if self._write_lock is not None:
            self._write_lock.close()
        if self.nudges is not None:
            self.nudges.close()


_NO_LOCK = contextlib.nullcontext()


def _refused(error: Exception) -> bool:
    """Whether SQLite refused a statement (``SQLITE_ERROR``: no such column or table, a syntax
    error, too many variables), which it says with the same OperationalError as a full disk
    or a lock held too long: a mistake of this GPUlayer's (or a schema it does not match), not
    a :class:`~gpulayer.errors.DatabaseFailed` that may pass; a server answers it 500 and logs
    its traceback. (Python 3.10's sqlite3 does not say which error: there, every one is.)"""
    return getattr(getattr(error, "orig", None) or error, "sqlite_errorname", None) == "SQLITE_ERROR"


#: what a database that failed says (SQLite's result codes, errno, PostgreSQL's SQLSTATE classes)
#: where it was found and could be read, but not written now: an outage, not a wrong database
_OUTAGES = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_NOMEM")


def _outage(error: Exception) -> bool:
    """Whether opening the database failed for a reason that passes (a full disk, an I/O
    error, a lock held too long: while its schema was upgraded, in one transaction, which
    left it as it was): a :class:`~gpulayer.errors.DatabaseFailed`, not a database URL
    or file to correct."""
    orig = getattr(error, "orig", None) or error
    if isinstance(orig, OSError) and not isinstance(orig, sqlite3.Error):
        return orig.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO)
    name = getattr(orig, "sqlite_errorname", None) or ""
    return name.startswith(_OUTAGES) or isinstance(orig, _Locked) or str(getattr(orig, "sqlstate", "")).startswith("53")


def _driver(conn: Connection) -> Any:
    """The database driver's own connection under ``conn``."""
    driver = conn.connection.driver_connection
    assert driver is not None  # (a connection in use has one)
    return driver


def _synced_again(conn: Connection) -> None:
    """Back to synced commits on a connection one commit relaxed (see :meth:`Store.write`);
    a connection that cannot be told is dropped, never reused unsynced."""
    try:
        _driver(conn).execute("PRAGMA synchronous=FULL")
    except Exception:
        conn.invalidate()
        raise


class _Pooled:
    """A connection from the pool and a new session on it, for one transaction."""

    __slots__ = ("conn",)

    def __init__(self, engine: Engine, write: bool) -> None:
        self.conn = engine.connect()
        if write:
            self.conn.execution_options(gl_write=True)

    def __enter__(self) -> tuple[Connection, Session]:
        return self.conn, Session(bind=self.conn, expire_on_commit=False)

    def __exit__(self, *_exc: object) -> None:
        self.conn.close()


class _Kept:
    """SQLite: one connection, and one session on it, that a thread keeps from one
    transaction to its next.

    Taking a connection from the pool and giving it back (SQLAlchemy's ``Connection``, the
    pool's checkout and checkin, its reset), and a new ``Session`` with its own begin on the
    connection, cost about four fifths of an empty transaction's CPU, and a job's cycle runs
    six or seven transactions. A SQLite connection outside a transaction holds nothing (no
    lock, no snapshot: each transaction begins with its own ``BEGIN``), so a thread may as
    well keep one; and a session closed at the end of each transaction (as a new one is)
    holds no object from one to the next. At most :data:`KEPT` threads keep one, so the
    pool's limit still bounds the connections; other threads, and a transaction begun
    inside another on the same thread, take one from the pool as before. A thread's
    connection goes back to the pool when the thread ends (``threading.local``), or when
    the store is disposed of."""

    #: the most threads of one store that keep a connection (the pool holds 16 at rest)
    KEPT = 16

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: weakref.WeakSet[_Lent] = weakref.WeakSet()
        self._closed = False

    def lend(self, write: bool) -> _Lent | None:
        """This thread's connection for one transaction, or None (it has none and may not
        have one, or it is in use by a transaction begun before on this thread)."""
        lent: _Lent | None = getattr(self._local, "lent", None)
        if lent is not None and lent.pid != os.getpid():
            # a forked child: its parent's, left alone (see _on_checkout); held, so that no
            # finaliser of the child's gives it back to the pool, which would reset it
            _INHERITED.append(lent)
            self._local.lent = lent = None
        if lent is None:
            with self._lock:
                if self._closed or len(self._all) >= self.KEPT:
                    return None
                lent = self._local.lent = _Lent(self._engine.connect())
                self._all.add(lent)
        elif lent.busy or lent.conn.invalidated or lent.conn.closed:
            if lent.busy:
                return None
            self._local.lent = None  # broken (SQLAlchemy invalidated it): the next one is new
            with self._lock:
                self._all.discard(lent)
            lent.conn.close()
            return self.lend(write)
        if lent.write is not write:
            lent.conn.execution_options(gl_write=write)
            lent.write = write
        return lent

    def close(self) -> None:
        with self._lock:
            self._closed = True
            kept = list(self._all)
        for lent in kept:
            if not lent.busy:
                lent.conn.close()


#: kept connections a forked child found in its threads (see :meth:`_Kept.lend`)
_INHERITED: list[_Lent] = []


class _Lent:
    """A kept connection and session, lent for one transaction at a time (see :class:`_Kept`)."""

    __slots__ = ("__weakref__", "busy", "conn", "driver", "pid", "session", "write")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pid = os.getpid()
        self.driver = conn.connection
        self.session = Session(bind=conn, expire_on_commit=False)
        self.busy = False
        self.write: bool | None = None

    def __enter__(self) -> tuple[Connection, Session]:
        self.busy = True
        plain.begin_session(self.session, self.driver)
        return self.conn, self.session

    def __exit__(self, *_exc: object) -> None:
        self.busy = False

class _Locked(sqlite3.OperationalError):
    """The database is locked (SQLite): another process held it too long. ``reason``: the
    same without the file's path, for a server's clients (see :meth:`Store._failed`)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"the database is locked: {detail}")
        self.reason = "the database is locked: another process held it too long"


#: how long a new connection keeps trying to put the database in WAL mode while other
#: processes hold it: SQLite's busy timeout
_WAL_WAIT = 30.0


def _wal(cur: sqlite3.Cursor, path: str) -> None:
    """``PRAGMA journal_mode=WAL``, tried again while the database is locked. Processes that
    open a new home at once (a worker and a script, two workers) meet here: the switch to
    WAL mode takes the file's exclusive lock, and SQLite answers "database is locked" at once,
    without its busy handler, to the one that would otherwise wait for the other in a
    deadlock (6 processes opening a new database at once: 2 of 60 failed)."""
    deadline = time.monotonic() + _WAL_WAIT
    pause = 0.002
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if time.monotonic() >= deadline:
                raise _Locked(f"{path} could not be put in WAL mode within {_WAL_WAIT:g} s "
                              "(another process holds it)") from exc
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


def _advisory_lock(executor: Connection | Session) -> None:
    """PostgreSQL's writers' lock, held until the transaction ends (see the module doc)."""
    executor.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})


class _WriterLock:
    """One writer at a time: a lock for the threads of this process and, where the platform
    has ``flock``, an exclusive lock on a file next to the database for its processes. The
    kernel hands the file lock to the next waiter as soon as it is released.

    One per database file and process (:meth:`of`): the Stores of one process on one file
    share it, as they share SQLite's own lock. A writer waits for the file lock as long as
    SQLite's busy timeout (a process stopped inside a write holds it), then gives up
    naming the file."""

    #: how long a writer waits for another process's write: SQLite's busy_timeout
    WAIT = 30.0
    _known: dict[str, _WriterLock] = {}
    _known_lock = threading.Lock()

    @classmethod
    def of(cls, path: str | None) -> _WriterLock:
        if path is None:
            return cls(None)
        key = os.path.realpath(path)
        with cls._known_lock:
            lock = cls._known.get(key)
            if lock is None or lock._fd is None:
                lock = cls._known[key] = cls(key)
            lock._users += 1
            return lock

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._threads = threading.RLock()
        self._depth = 0
        self._users = 0
        self._fd: int | None = None
        if path is not None and fcntl is not None:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def __enter__(self) -> None:
        self._threads.acquire()
        if self._depth == 0 and self._fd is not None:
            try:
                self._lock_file()
            except BaseException:
                self._threads.release()
                raise
        self._depth += 1

    def _lock_file(self) -> None:
        assert self._fd is not None
        deadline = time.monotonic() + self.WAIT
        pause = 0.0005
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _Locked(f"another process has held {self.path} for {self.WAIT:g} s "
                                  "(a process stopped while it writes?)") from None
                # (a blocking flock has no timeout; the holder's writes take a millisecond)
                time.sleep(pause)
                pause = min(pause * 2, 0.005)

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()

    def close(self) -> None:
        """One Store fewer uses it; the last one closes the file."""
        with self._known_lock, self._threads:
            self._users -= 1
            if self._users <= 0 and self._fd is not None:
                os.close(self._fd)
                self._fd = None
                if self.path is not None and self._known.get(self.path) is self:
                    del self._known[self.path]
