"""The statements of a job's cycle, run on the database driver's own cursor.

A job goes through the control plane in five short transactions (submit, the worker's
poll, its start, its report, the caller's wait). Through SQLAlchemy's ORM each statement
cost 0.1-0.3 ms of CPU (building the expression, its cache key, loading objects), about ten
times what SQLite spends running it; on the driver's cursor the same statements cost what
the database does. These functions run in the caller's :class:`~sqlmodel.Session`
transaction (what the session holds is flushed first, as an ORM query would), and write
the same rows the ORM would: the rest of the control plane keeps using
:mod:`gpulayer.store.queries`.

Rows come back as the named tuples :class:`Job` and :class:`Task`, whose fields are the
tables' columns (:mod:`gpulayer.store.mapping` reads them as it reads ORM rows). Statements
are written with ``?`` placeholders and rewritten once for drivers that want ``%s``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

from sqlmodel import Session

from gpulayer.errors import NotFound
from gpulayer.records import JobState
from gpulayer.store.tables import EventRow, JobRow, LogRow, TaskRow, WorkerRow


class Job(NamedTuple):
    """A row of ``gl_jobs`` (the fields are :class:`~gpulayer.store.tables.JobRow`'s columns)."""
    id: str
    kind: str
    spec: str
    state: str
    priority: int
    created_at: float
    updated_at: float
    attempt: int
    max_attempts: int
    exit_code: int | None
    result: str | None
    error: str | None
    decision: str | None
    cancel_requested: bool
    idempotency_key: str | None
    owner: str | None
    args: str | None
    #: how many of the jobs it runs after have not succeeded yet (gpulayer.control.after)
    waiting_for: int = 0
    bundle_digest: str | None = None  # (schema 11: the spec's, in a column of its own)


class Task(NamedTuple):
    """A row of ``gl_tasks`` (the fields are :class:`~gpulayer.store.tables.TaskRow`'s columns)."""
    id: str
    job_id: str
    attempt: int
    node_rank: int
    worker_id: str
    accelerator: str | None
    devices: str
    state: str
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    error: str | None
    rendezvous: str | None
    lent: bool = False  # (SQLite reads it as 0 or 1)
    log_chars: int = 0
    usage: str | None = None


JOB_COLUMNS = ", ".join(Job._fields)
TASK_COLUMNS = ", ".join(Task._fields)
_JOB_TABLE = JobRow.__tablename__
_TASK_TABLE = TaskRow.__tablename__
_EVENT_TABLE = EventRow.__tablename__
_LOG_TABLE = LogRow.__tablename__
_WORKER_TABLE = WorkerRow.__tablename__
#: a log chunk's stream (:data:`gpulayer.api.LogStream`, which this module does not import)
S = TypeVar("S", bound=str)

def not_found(what: str, key: str) -> NotFound:
    """``job 'x': no such job``: how every lookup by id says it found nothing."""
    return NotFound(f"{what} {key!r}: no such {what}")


# ---------------------------------------------------------------- running statements

_rewritten: dict[str, str] = {}


def _sql(s: Session, sql: str) -> str:
    """``sql`` for the session's driver: every ``?`` becomes ``%s`` for psycopg, so the
    statements here never hold a ``?`` or a ``%`` of their own (in a literal)."""
    if s.get_bind().dialect.paramstyle == "qmark":
        return sql
    out = _rewritten.get(sql)
    if out is None:
        if "%" in sql:
            raise ValueError(f"a plain statement with a literal '%' cannot be rewritten for psycopg: {sql}")
        out = _rewritten[sql] = sql.replace("?", "%s")
    return out


def _cursor(s: Session) -> Any:
    if s.new or s.dirty or s.deleted:
        s.flush()  # what the session holds goes first, as before an ORM statement
    return _driver(s).cursor()


def _driver(s: Session) -> Any:
    """The session's own DBAPI connection, looked up once per transaction."""
    conn = s.info.get(_DRIVER)
    if conn is None:
        conn = s.info[_DRIVER] = s.connection().connection
    return conn


#: where a transaction's session keeps its DBAPI connection (see _driver)
_DRIVER = "gl_driver_connection"


def begin_session(s: Session, driver: Any) -> None:
    """A session used again for a new transaction on the same connection (see
    :class:`gpulayer.store._Kept`): what it knew of the last one is forgotten, and its
    DBAPI connection is ``driver`` (no look-up through the session)."""
    s.info.clear()
    s.info[_DRIVER] = driver


def control(s: Session, sql: str) -> None:
    """A statement that changes no row (``SAVEPOINT``, ``ROLLBACK TO SAVEPOINT``...), run on
    the session's connection without flushing it first."""
    cur = _driver(s).cursor()
    try:
        cur.execute(sql)
    finally:
        cur.close()


def execute(s: Session, sql: str, params: tuple[Any, ...] = ()) -> int:
    """Run one statement in the session's transaction; the number of rows it changed."""
    cur = _cursor(s)
    try:
        cur.execute(_sql(s, sql), params)
        return int(cur.rowcount)
    finally:
        cur.close()


def fetch(s: Session, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of one SELECT in the session's transaction, as the driver's tuples."""
    cur = _cursor(s)
    try:
        cur.execute(_sql(s, sql), params)
        return list(cur.fetchall())
    finally:
        cur.close()


#: how many values one ``IN (...)`` list holds (SQLite allows 32,766 variables, or 999 before 3.32)
IN_CHUNK = 500


def fetch_in(s: Session, sql: str, values: list[Any]) -> list[tuple[Any, ...]]:
    """:func:`fetch` of a SELECT whose ``{}`` is an ``IN`` list of ``values``, in chunks of
    :data:`IN_CHUNK` (no values: no rows)."""
    out: list[tuple[Any, ...]] = []
    for i in range(0, len(values), IN_CHUNK):
        chunk = values[i:i + IN_CHUNK]
        out += fetch(s, sql.format(", ".join("?" * len(chunk))), tuple(chunk))
    return out


# ---------------------------------------------------------------- jobs


def _job(r: tuple[Any, ...]) -> Job:
    j = Job(*r)
    return j._replace(cancel_requested=bool(j.cancel_requested))


@functools.cache
def _job_columns(result: bool, arguments: bool) -> str:
    """:data:`JOB_COLUMNS`, NULL in place of the result or the arguments left out."""
    return ", ".join("NULL" if (f == "result" and not result) or (f == "args" and not arguments) else f
                     for f in Job._fields)


def find_job(s: Session, job_id: str, *, result: bool = True, arguments: bool = True) -> Job | None:
    """The job, or None; without its ``result`` or ``arguments`` (None in their places, not
    read) when asked."""
    found = fetch(s, f"SELECT {_job_columns(result, arguments)} FROM {_JOB_TABLE} WHERE id = ?", (job_id,))
    return _job(found[0]) if found else None


def job_id_by_key(s: Session, idempotency_key: str) -> str | None:
    """The job submitted with this idempotency key, if any."""
    found = fetch(s, f"SELECT id FROM {_JOB_TABLE} WHERE idempotency_key = ?", (idempotency_key,))
    return str(found[0][0]) if found else None


def job(s: Session, job_id: str, *, result: bool = True, arguments: bool = True) -> Job:
    """The job, or :class:`~gpulayer.errors.NotFound` in the product's wording (without its
    ``result`` or ``arguments`` when asked: :func:`find_job`)."""
    found = find_job(s, job_id, result=result, arguments=arguments)
    if found is None:
        raise not_found("job", job_id)
    return found


def job_state(s: Session, job_id: str) -> str | None:
    found = fetch(s, f"SELECT state FROM {_JOB_TABLE} WHERE id = ?", (job_id,))
    return str(found[0][0]) if found else None


def jobs_by_id(s: Session, job_ids: list[str]) -> dict[str, Job]:
    """The jobs with these ids that exist."""
    return {r[0]: _job(r) for r in fetch_in(s, f"SELECT {JOB_COLUMNS} FROM {_JOB_TABLE} WHERE id IN ({{}})",
                                            sorted(set(job_ids)))}


def insert_job(s: Session, job: Job) -> None:
    marks = ", ".join("?" * len(Job._fields))
    execute(s, f"INSERT INTO {_JOB_TABLE} ({JOB_COLUMNS}) VALUES ({marks})", tuple(job))


def update_job(s: Session, job_id: str, **values: Any) -> None:
    """Set these columns of the job (a state that ends it: see :func:`note_ended`)."""
    names = sorted(values)
    sets = ", ".join(f"{n} = ?" for n in names)
    execute(s, f"UPDATE {_JOB_TABLE} SET {sets} WHERE id = ?", (*(values[n] for n in names), job_id))
    if values.get("state") in ENDED_STATES:
        note_ended(s, job_id)


#: the states of a job that has ended, in JobState's order
ENDED_STATES = tuple(state.value for state in JobState if state.terminal)
#: where a transaction's session keeps the ids of the jobs it ended (see Store.write)
_ENDED = "gl_ended"


def note_ended(s: Session, job_id: str) -> None:
    """The transaction ends this job: once it committed, :meth:`Store.take_ended
    <gpulayer.store.Store.take_ended>` says so (to the waits for it: see
    :meth:`gpulayer.control.jobs.JobOps.ended_news`). Every write of an ended state calls
    this: :func:`update_job` does, a change of a :class:`JobRow` must."""
    s.info.setdefault(_ENDED, set()).add(job_id)


def ended_in(s: Session) -> set[str]:
    """The jobs this transaction ended (see :func:`note_ended`)."""
    ended: set[str] = s.info.get(_ENDED, set())
    return ended


def undo_ended(s: Session, kept: set[str]) -> None:
    """A savepoint was rolled back: of the jobs the transaction says it ended, only ``kept``
    (those it had ended before the savepoint) still are."""
    ended: set[str] | None = s.info.get(_ENDED)
    if ended is not None:
        ended.intersection_update(kept)


# ---------------------------------------------------------------- tasks


def find_task(s: Session, task_id: str) -> Task | None:
    found = fetch(s, f"SELECT {TASK_COLUMNS} FROM {_TASK_TABLE} WHERE id = ?", (task_id,))
    return Task(*found[0]) if found else None


def task(s: Session, task_id: str) -> Task:
    """The task, or :class:`~gpulayer.errors.NotFound` in the product's wording."""
    found = find_task(s, task_id)
    if found is None:
        raise not_found("task", task_id)
    return found


def tasks_of(s: Session, job_id: str, attempt: int | None = None) -> list[Task]:
    """The job's tasks (of one attempt), by attempt and node rank."""
    if attempt is None:
        rows = fetch(s, f"SELECT {TASK_COLUMNS} FROM {_TASK_TABLE} WHERE job_id = ? "
                        "ORDER BY attempt, node_rank", (job_id,))
    else:
        rows = fetch(s, f"SELECT {TASK_COLUMNS} FROM {_TASK_TABLE} WHERE job_id = ? AND attempt = ? "
                        "ORDER BY node_rank", (job_id, attempt))
    return [Task(*r) for r in rows]


def assigned_of_worker(s: Session, worker_id: str) -> list[tuple[Task, str, str | None]]:
    """The tasks handed to the worker and not started yet, oldest first, each with its job's
    stored spec and arguments."""
    rows = fetch(s, f"SELECT {', '.join(f't.{c}' for c in Task._fields)}, j.spec, j.args "
                    f"FROM {_TASK_TABLE} t JOIN {_JOB_TABLE} j ON j.id = t.job_id "
                    "WHERE t.worker_id = ? AND t.state = 'assigned' ORDER BY t.created_at", (worker_id,))
    n = len(Task._fields)
    return [(Task(*r[:n]), r[n], r[n + 1]) for r in rows]


def insert_tasks(s: Session, tasks: list[Task]) -> None:
    marks = ", ".join("?" * len(Task._fields))
    for task in tasks:
        execute(s, f"INSERT INTO {_TASK_TABLE} ({TASK_COLUMNS}) VALUES ({marks})", tuple(task))


def set_task_state(s: Session, task_id: str, to: str, allowed_from: tuple[str, ...], **values: Any) -> bool:
    """Compare-and-set: move the task to ``to`` (and set these columns) only if its state is
    one of ``allowed_from``; whether it moved."""
    names = sorted(values)
    sets = ", ".join(["state = ?", *(f"{n} = ?" for n in names)])
    marks = ", ".join("?" * len(allowed_from))
    changed = execute(s, f"UPDATE {_TASK_TABLE} SET {sets} WHERE id = ? AND state IN ({marks})",
                      (to, *(values[n] for n in names), task_id, *allowed_from))
    return changed == 1


def set_task_lent(s: Session, task_id: str, lent: bool) -> bool:
    """Whether the task's CPU slot is lent to the queue (:mod:`gpulayer.control.lending`);
    whether that changed."""
    return execute(s, f"UPDATE {_TASK_TABLE} SET lent = ? WHERE id = ? AND lent <> ?", (lent, task_id, lent)) == 1


def claim_output(s: Session, task: Task, start: int, chunks: Sequence[tuple[S, str]]) -> Sequence[tuple[S, str]]:
    """Of an upload of ``task``'s output that begins ``start`` characters into it (every
    stream together, in the order written), the part not stored yet: an upload sent again
    after its answer was lost (a server killed between its commit and its answer) was stored
    by the first, whole or in part (a worker sends what it kept with what came since). The
    task's count of stored characters (``log_chars``) moves to the upload's end in this
    transaction, by a compare-and-set: an upload of the same task that another transaction
    stored meanwhile (PostgreSQL: a retry reaching a second server while the first still
    works) is seen, not stored twice. An upload that begins past the count (output its worker
    gave up on) is stored whole."""
    end = start + sum(len(data) for _, data in chunks)
    stored = task.log_chars
    while end > stored:
        if execute(s, f"UPDATE {_TASK_TABLE} SET log_chars = ? WHERE id = ? AND log_chars = ?",
                   (end, task.id, stored)) == 1:
            break
        stored = int(fetch(s, f"SELECT log_chars FROM {_TASK_TABLE} WHERE id = ?", (task.id,))[0][0])
    else:
        return []  # all of it stored before
    skip = stored - start
    if skip <= 0:
        return chunks
    out: list[tuple[S, str]] = []
    for stream, data in chunks:
        if skip < len(data):
            out.append((stream, data[skip:] if skip > 0 else data))
        skip -= len(data)
    return out


# ---------------------------------------------------------------- workers


def local_workers(s: Session) -> list[tuple[str, str, int | None, float, bool]]:
    """The online local workers: ``(id, hostname, pid, last heartbeat, draining)``."""
    return [(str(i), str(h), p, float(b), bool(d)) for i, h, p, b, d in fetch(
        s, f"SELECT id, hostname, pid, last_heartbeat, draining FROM {_WORKER_TABLE} "
           "WHERE online = ? AND origin = ?", (True, "local"))]


# ---------------------------------------------------------------- events


def add_logs(s: Session, rows: list[tuple[str, str, int, str, str, float]]) -> None:
    """Append log chunks, ``(job_id, task_id, node_rank, stream, data, ts)`` each, in one
    ``executemany`` (through the ORM, a chunk cost 0.6 ms of CPU: building its row object,
    the unit of work's flush; a task that writes fast ships one every few milliseconds)."""
    if not rows:
        return
    cur = _cursor(s)
    try:
        cur.executemany(_sql(s, f"INSERT INTO {_LOG_TABLE} (job_id, task_id, node_rank, stream, data, ts) "
                                "VALUES (?, ?, ?, ?, ?, ?)"), rows)
    finally:
        cur.close()


def add_event(s: Session, *, ts: float, kind: str, job_id: str | None, task_id: str | None,
              worker_id: str | None, message: str) -> None:
    execute(s, f"INSERT INTO {_EVENT_TABLE} (ts, kind, job_id, task_id, worker_id, message) "
               "VALUES (?, ?, ?, ?, ?, ?)", (ts, kind, job_id, task_id, worker_id, message))


__all__ = [
    "JOB_COLUMNS",
    "TASK_COLUMNS",
    "Job",
    "Task",
    "add_event",
    "add_logs",
    "assigned_of_worker",
    "claim_output",
    "control",
    "execute",
    "fetch",
    "fetch_in",
    "find_job",
    "find_task",
    "insert_job",
    "insert_tasks",
    "job",
    "job_id_by_key",
    "job_state",
    "jobs_by_id",
    "not_found",
    "set_task_state",
    "task",
    "tasks_of",
    "update_job",
]
