"""Pure reads of the embedded SQLite database on the standard library's :mod:`sqlite3`.

What the CLI's light path (:mod:`gpulayer.cli.light`) reads without importing SQLAlchemy,
SQLModel or pydantic, which cost a command most of its start-up. It reads the tables that
:mod:`gpulayer.store.tables` declares, in the shape the store writes them, and answers
only when it can answer exactly as the store would; otherwise it raises
:class:`Unanswerable` and the caller takes the full path, which migrates, reports the
error, or reads a server instead:

* a server is configured (``GPULAYER_URL``), or a database other than the default one
  (``GPULAYER_DATABASE_URL``), or a setting cannot be read (the full path words the error);
* there is no database yet (the full path creates it);
* its schema version is not :data:`SCHEMA_VERSION` (older: the full path migrates it;
  newer: it refuses it);
* a row holds something the records would not read (a spec without a known ``kind``);
* a worker would be marked offline first: the full path's client expires local workers
  whose process is gone before it reads
  (:meth:`gpulayer.control.ControlPlane.expire_workers`), which can change a job's state.

It never writes: one deferred transaction, ``PRAGMA query_only``. It is not under
``gpulayer/store/`` because importing that package imports SQLAlchemy.
"""

from __future__ import annotations

import json
import socket
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from gpulayer import config
from gpulayer.errors import GpulayerError
from gpulayer.logtail import tail_start
from gpulayer.logtext import log_text
from gpulayer.pids import pid_alive

__all__ = ["JOB_STATES", "SCHEMA_VERSION", "JobLine", "Unanswerable", "database", "job_lines", "job_logs", "reading"]

#: the schema these reads understand: :data:`gpulayer.store.migrations.SCHEMA_VERSION`
#: (a test keeps the two equal; a new version must be checked against these queries)
SCHEMA_VERSION = 15
#: :class:`gpulayer.records.JobState`'s values, in its order (a test keeps the two equal)
JOB_STATES = ("queued", "assigned", "running", "succeeded", "failed", "cancelled", "timed_out", "unschedulable")


class Unanswerable(Exception):
    """This read cannot be answered here exactly as the store would answer it."""


def database() -> Path:
    """The embedded database this process would open, when it exists and is the default
    one; else :class:`Unanswerable`."""
    try:
        env = config.settings()
        if env.url is not None or env.database_url is not None:
            raise Unanswerable("not the default embedded database")
        path = config.home() / "gpulayer.db"
    except GpulayerError as exc:
        raise Unanswerable(str(exc)) from None
    if not path.is_file():
        raise Unanswerable("no database yet")
    return path


@contextmanager
def reading(path: Path) -> Iterator[sqlite3.Connection]:
    """One read transaction on ``path`` with its schema checked (:data:`SCHEMA_VERSION`).

    Opened read-write (``mode=rw``: never created) but only read from, as the store's own
    reader is, so that SQLite checkpoints and removes the write-ahead log when the last
    connection closes, as it does after the full path."""
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=rw", uri=True, timeout=30, isolation_level=None)
    except sqlite3.Error as exc:
        raise Unanswerable(str(exc)) from None
    with closing(conn):
        try:
            conn.execute("PRAGMA query_only=1")
            conn.execute("BEGIN DEFERRED")
            row = conn.execute("SELECT version FROM gl_schema WHERE id = 1").fetchone()
        except sqlite3.Error as exc:  # no gl_schema: not a database the store made
            raise Unanswerable(str(exc)) from None
        if row is None or row[0] != SCHEMA_VERSION:
            raise Unanswerable(f"schema version {row[0] if row else None}, not {SCHEMA_VERSION}")
        _no_worker_to_expire(conn)
        try:
            yield conn
        finally:
            conn.execute("COMMIT")


def _no_worker_to_expire(conn: sqlite3.Connection) -> None:
    """:class:`Unanswerable` when the full path's client would expire a worker before
    reading: a local one of this host whose process is gone (the same query and test as
    ``ControlPlane.expire_workers``). A silent one it would not: a control plane that was
    just made counts no silence for one heartbeat timeout (:mod:`gpulayer.control.pauses`)."""
    here = socket.gethostname()
    rows = conn.execute(
        "SELECT id, pid FROM gl_workers WHERE gl_workers.online IS 1 AND gl_workers.origin = ? "
        "AND gl_workers.hostname = ?", ("local", here)).fetchall()
    for worker_id, pid in rows:
        if pid and not pid_alive(pid):
            raise Unanswerable(f"worker {worker_id} would be expired first")


class JobLine(NamedTuple):
    """What ``jobs list`` shows of a job (``gpulayer.cli.jobs``'s summary, field by field)."""

    id: str
    state: str
    kind: str
    name: str
    what: str
    attempt: int
    created_at: float


def shown_command(command: list[str]) -> str:
    """A command as a job's summary shows it: its words, a word of several lines (a program
    given inline: ``python -c CODE``, ``bash -c SCRIPT``) as its first line and ``...``."""
    return " ".join(w.partition("\n")[0] + "..." if "\n" in w else w for w in command)


def _what(spec: dict[str, Any]) -> tuple[str, str]:
    """``(kind, what)`` of a stored spec, as the summary of its record says them."""
    kind = spec.get("kind")
    if kind == "command":
        command = spec.get("command")
        if isinstance(command, list) and command and all(isinstance(w, str) for w in command):
            return kind, shown_command(command)
    elif kind == "function":
        function = spec.get("function")
        if isinstance(function, str):
            return kind, function
    elif kind == "distributed":
        entry, nodes = spec.get("entry"), spec.get("nodes", 1)
        if isinstance(entry, str) and type(nodes) is int:
            return kind, f"{entry} x{nodes}"
    raise Unanswerable(f"a spec the records would not read: kind {kind!r}")


def _spec(job_id: str, raw: str) -> dict[str, Any]:
    """A job's stored spec as an object, or :class:`Unanswerable`."""
    try:
        spec = json.loads(raw)
    except ValueError:
        raise Unanswerable(f"job {job_id}: its spec is not JSON") from None
    if not isinstance(spec, dict):
        raise Unanswerable(f"job {job_id}: its spec is not an object")
    return spec


def job_lines(conn: sqlite3.Connection, *, state: str | None, limit: int) -> list[JobLine]:
    """The newest ``limit`` jobs (in ``state``), newest first: :func:`gpulayer.store.queries.jobs`'s
    query (the same filter and order, so SQLite picks the same plan and ties come out alike)."""
    if state is not None and state not in JOB_STATES:
        raise Unanswerable(f"state {state!r}")
    where = "WHERE gl_jobs.state = ? " if state is not None else ""
    params: tuple[Any, ...] = (state, limit, 0) if state is not None else (limit, 0)
    rows = conn.execute(
        "SELECT gl_jobs.id, gl_jobs.spec, gl_jobs.state, gl_jobs.created_at, gl_jobs.attempt FROM gl_jobs "
        f"{where}ORDER BY gl_jobs.created_at DESC, gl_jobs.id DESC LIMIT ? OFFSET ?", params).fetchall()
    lines = []
    for job_id, raw, job_state, created_at, attempt in rows:
        if job_state not in JOB_STATES:
            raise Unanswerable(f"job {job_id}: state {job_state!r}")
        spec = _spec(job_id, raw)
        kind, what = _what(spec)
        name = spec.get("name")
        if name is not None and not isinstance(name, str):
            raise Unanswerable(f"job {job_id}: name {name!r}")
        lines.append(JobLine(job_id, job_state, kind, name or "", what, int(attempt), float(created_at)))
    return lines


#: the log chunks :func:`job_logs` reads at a time (each read its own transaction)
LOG_PAGE = 1000
#: and reads back from the newest at a time, to find where the last lines start (``--tail``)
BACK_PAGE = 256


def job_logs(conn: sqlite3.Connection, job_id: str, node: int | None,
             tail: int | None = None) -> tuple[tuple[str, int], Iterator[tuple[int, str, str]]]:
    """What ``jobs logs JOB`` prints: the job's ``(kind, nodes)`` and its chunks in order,
    ``(node_rank, stream, text)`` (stored text as :func:`gpulayer.logtext.log_text` gives it),
    those of node ``node`` only when given; ``tail``: from where its last ``tail`` lines start
    (:func:`gpulayer.logtail.tail_start`, read from the newest chunk back, a page at a time, as
    the store's ``logs_backwards``). Called in :func:`reading`'s transaction, which
    reads the job; the chunks come a page at a time, each page in a read transaction of its
    own after the first, so a reader that prints slowly (into a pager) holds no snapshot of
    the database meanwhile. :class:`Unanswerable` for a job that is not there (the full
    path says so) or whose spec the records would not read."""
    row = conn.execute("SELECT spec FROM gl_jobs WHERE gl_jobs.id = ?", (job_id,)).fetchone()
    if row is None:
        raise Unanswerable(f"no job {job_id!r}")
    spec = _spec(job_id, row[0])
    kind, _ = _what(spec)
    nodes = spec.get("nodes", 1) if kind == "distributed" else 1
    where = "gl_logs.job_id = ? AND gl_logs.id > ?" + (" AND gl_logs.node_rank = ?" if node is not None else "")
    sql = f"SELECT gl_logs.id, gl_logs.node_rank, gl_logs.stream, gl_logs.data FROM gl_logs WHERE {where} " \
          "ORDER BY gl_logs.id LIMIT ?"

    def page(after: int) -> list[tuple[int, int, str, str]]:
        params = (job_id, after, node, LOG_PAGE) if node is not None else (job_id, after, LOG_PAGE)
        return conn.execute(sql, params).fetchall()

    def backwards() -> Iterator[tuple[int, str]]:
        back = f"SELECT gl_logs.id, gl_logs.data FROM gl_logs WHERE {where} AND gl_logs.id < ? " \
               "ORDER BY gl_logs.id DESC LIMIT ?"
        before = 2**63 - 1
        while True:
            rows = conn.execute(back, (job_id, 0, *([node] if node is not None else []), before, BACK_PAGE)).fetchall()
            yield from ((chunk_id, log_text(data)) for chunk_id, data in rows)
            if len(rows) < BACK_PAGE:
                return
            before = rows[-1][0]

    # a node the job does not have reads nothing (the caller refuses it), and a huge one is
    # never bound (past SQLite's 64 bits it was an OverflowError)
    has_node = node is None or 0 <= node < nodes
    start = (1, 0) if tail is None or not has_node else tail_start(backwards(), tail)
    first = page(start[0] - 1) if has_node and start is not None else []
    cut = start[1] if start is not None else 0

    def chunks() -> Iterator[tuple[int, str, str]]:
        rows = first
        text_from = cut
        while True:
            for _, node_rank, stream, data in rows:
                yield node_rank, stream, log_text(data)[text_from:]
                text_from = 0
            if len(rows) < LOG_PAGE:
                return
            conn.execute("COMMIT")  # (reading()'s own COMMIT at its end then finds one open)
            conn.execute("BEGIN DEFERRED")
            rows = page(rows[-1][0])

    return (kind, nodes), chunks()
