"""Every query the control plane runs, one named function each.

Each function takes the :class:`~sqlmodel.Session` of a :meth:`Store.read` or
:meth:`Store.write` transaction; the caller decides the transaction, the function decides
the SQL. Functions named after a thing (:func:`job`, :func:`task`, :func:`worker`,
:func:`bundle`, :func:`token`) return it or raise :class:`~gpulayer.errors.NotFound` with
the product's wording; ``find_*`` return ``None`` instead.

The statements that correctness rests on are here and short enough to read: task state
changes are compare-and-set (:func:`transition_task`), a token's last use is spent with a
conditional decrement (:func:`spend_token_use`), and heartbeats are plain batched UPDATEs.
"""

from __future__ import annotations

import json
import operator
import secrets
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Select, and_, delete, func, or_, text, update
from sqlalchemy import select as sa_select
from sqlalchemy.orm import defer
from sqlmodel import Session, SQLModel, col, select

from gpulayer.logtext import log_text
from gpulayer.records import JobState, TaskState
from gpulayer.store import plain
from gpulayer.store.tables import (
    BundleReaderRow,
    BundleRow,
    EventRow,
    JobRow,
    LogRow,
    MachineRow,
    MetaRow,
    TaskRow,
    TokenRow,
    WorkerRow,
)

ACTIVE_TASK_STATES = (TaskState.ASSIGNED.value, TaskState.RUNNING.value)
ENDED_BADLY = (TaskState.FAILED.value, TaskState.TIMED_OUT.value, TaskState.LOST.value,
               TaskState.CANCELLED.value)

#: which states a task may move to from each state (everything else is refused)
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.ASSIGNED: frozenset({TaskState.RUNNING, TaskState.CANCELLED, TaskState.LOST,
                                   TaskState.FAILED}),
    TaskState.RUNNING: frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED,
                                  TaskState.TIMED_OUT, TaskState.LOST}),
}

R = TypeVar("R", bound=SQLModel)


def get_or_raise(s: Session, table: type[R], key: str, what: str, *, for_update: bool = False,
                 fresh: bool = False) -> R:
    """The row of ``table`` with primary key ``key``, or :class:`NotFound` ("job 'x': no such job")."""
    row = s.get(table, key, with_for_update=for_update or None, populate_existing=fresh)
    if row is None:
        raise plain.not_found(what, key)
    return row


# --------------------------------------------------------------------------- jobs


def job(s: Session, job_id: str, *, for_update: bool = False) -> JobRow:
    return get_or_raise(s, JobRow, job_id, "job", for_update=for_update)


def find_job(s: Session, job_id: str) -> JobRow | None:
    return s.get(JobRow, job_id)


def job_owner(s: Session, job_id: str) -> str | None:
    """The token id that submitted the job (None for an embedded submit); NotFound if none."""
    owner = s.execute(sa_select(col(JobRow.owner), col(JobRow.id)).where(col(JobRow.id) == job_id)).first()
    if owner is None:
        raise plain.not_found("job", job_id)
    return owner[0]  # type: ignore[no-any-return]


def jobs(s: Session, *, state: str | None, limit: int, owner: str | None,
         before: tuple[float, str] | None = None) -> Sequence[JobRow]:
    """The newest jobs (ties in submit time by id, so that a page ends where the next
    starts), their results and a function's arguments not loaded (a list leaves them out:
    up to ``GPULAYER_MAX_RESULT_MB`` and ``GPULAYER_MAX_ARGS_MB`` each; reading either of
    one of these rows would load it alone). ``before``: only those after the job of that
    submit time and id in this order (the last of the page before)."""
    q = (select(JobRow).options(defer(JobRow.result), defer(JobRow.args))  # type: ignore[arg-type]
         .order_by(col(JobRow.created_at).desc(), col(JobRow.id).desc()).limit(limit))
    if before is not None:
        at, job_id = before
        q = q.where(or_(col(JobRow.created_at) < at, and_(col(JobRow.created_at) == at, col(JobRow.id) < job_id)))
    if state is not None:
        q = q.where(JobRow.state == state)
    if owner is not None:
        q = q.where(JobRow.owner == owner)
    return list(s.exec(q).all())


def jobs_by_id(s: Session, job_ids: Iterable[str], *, light: bool = False) -> dict[str, JobRow]:
    """The jobs with these ids that exist (what ``explain`` needs of the jobs holding
    workers); ``light``: their results and a function's arguments not loaded (a cancel)."""
    ids = sorted(set(job_ids))
    out: dict[str, JobRow] = {}
    for i in range(0, len(ids), plain.IN_CHUNK):  # (a batch of 1,000 is over old SQLite's 999 variables)
        q = select(JobRow).where(col(JobRow.id).in_(ids[i:i + plain.IN_CHUNK]))
        if light:
            q = q.options(defer(JobRow.result), defer(JobRow.args))  # type: ignore[arg-type]
        out.update((r.id, r) for r in s.exec(q).all())
    return out


def queued_jobs(s: Session) -> Sequence[JobRow]:
    """The queue in submission order (the scheduler applies priorities), without the jobs
    that wait for others to succeed first (``waiting_for``: see gpulayer.control.after). A
    function job's arguments are not loaded: placement never needs them."""
    return list(s.exec(
        select(JobRow).options(defer(JobRow.args))  # type: ignore[arg-type]
        .where(JobRow.state == JobState.QUEUED.value, JobRow.waiting_for == 0)
        .order_by(col(JobRow.created_at), col(JobRow.id))
    ).all())


#: (a job that waits for others to succeed first is not in the queue placement reads)
_QUEUE_KEYS = "SELECT id, created_at, updated_at, attempt{} FROM gl_jobs WHERE state = 'queued' AND waiting_for = 0"


def queue_keys(s: Session, job_id: str | None = None) -> list[tuple[str, float, float | None, int, str | None]]:
    """The queue (or only ``job_id``, if queued) as plain rows, in submission order: ``(id,
    created_at, updated_at, attempt, decision)``; what a placement pass reads of every
    queued job (no ORM objects, no spec; on the driver's cursor, see :mod:`.plain`)."""
    sql = _QUEUE_KEYS.format(", decision")
    if job_id is not None:
        return plain.fetch(s, sql + " AND id = ?", (job_id,))
    return plain.fetch(s, sql + " ORDER BY created_at, id")


def queue_head(s: Session, limit: int) -> list[tuple[str, float, float | None, int, str | None]]:
    """The first ``limit`` jobs of the queue in placement order (higher priority first, then
    submission order), as :func:`queue_keys` rows without their decisions (None; read those
    that matter with :func:`job_decisions`): what a pass that stops once the fleet is full
    reads (the queue behind them does not count)."""
    rows = plain.fetch(s, _QUEUE_KEYS.format("") + " ORDER BY priority DESC, created_at, id LIMIT ?", (limit,))
    return [(*r, None) for r in rows]


def job_decisions(s: Session, job_ids: Sequence[str]) -> dict[str, str | None]:
    """The stored placement decisions of these jobs."""
    return dict(plain.fetch_in(s, "SELECT id, decision FROM gl_jobs WHERE id IN ({})", list(job_ids)))


def has_queued_jobs(s: Session) -> bool:
    return bool(plain.fetch(s, "SELECT id FROM gl_jobs WHERE state = 'queued' AND waiting_for = 0 LIMIT 1"))


def job_specs(s: Session, job_ids: Sequence[str]) -> dict[str, str]:
    """The stored specs (without a function's arguments) of these jobs."""
    return dict(plain.fetch_in(s, "SELECT id, spec FROM gl_jobs WHERE id IN ({})", list(job_ids)))


def job_counts(s: Session) -> dict[str, int]:
    rows = s.execute(sa_select(col(JobRow.state), func.count()).group_by(col(JobRow.state))).all()
    return {str(state): int(n) for state, n in rows}


# --------------------------------------------------------------------------- tasks


def task(s: Session, task_id: str, *, fresh: bool = False) -> TaskRow:
    return get_or_raise(s, TaskRow, task_id, "task", fresh=fresh)


def tasks_of(s: Session, job_id: str, attempt: int | None = None) -> list[TaskRow]:
    q = select(TaskRow).where(TaskRow.job_id == job_id)
    if attempt is not None:
        q = q.where(TaskRow.attempt == attempt)
    # populate_existing: transition_task changes rows with plain SQL, so refresh loaded objects
    q = q.order_by(col(TaskRow.attempt), col(TaskRow.node_rank)).execution_options(populate_existing=True)
    return list(s.exec(q).all())


def active_tasks(s: Session) -> Sequence[TaskRow]:
    """Tasks holding a device or a CPU slot: assigned or running."""
    return list(s.exec(select(TaskRow).where(col(TaskRow.state).in_(ACTIVE_TASK_STATES))).all())


def active_tasks_of_worker(s: Session, worker_id: str) -> Sequence[TaskRow]:
    return list(s.exec(select(TaskRow).where(TaskRow.worker_id == worker_id,
                                        col(TaskRow.state).in_(ACTIVE_TASK_STATES))).all())


def assigned_tasks_of_worker(s: Session, worker_id: str) -> Sequence[TaskRow]:
    """Handed to the worker and not started yet, oldest first."""
    return list(s.exec(select(TaskRow).where(TaskRow.worker_id == worker_id,
                                        TaskRow.state == TaskState.ASSIGNED.value)
                  .order_by(col(TaskRow.created_at))).all())


def assigned_task_workers(s: Session) -> list[tuple[str, str]]:
    """``(task id, worker id)`` of every task handed to a worker and not started yet (few:
    workers start them at once): what a server's waiting long polls are checked against."""
    rows = s.execute(sa_select(col(TaskRow.id), col(TaskRow.worker_id))
                     .where(col(TaskRow.state) == TaskState.ASSIGNED.value)).all()
    return [(str(t), str(w)) for t, w in rows]


def running_tasks_started_before(s: Session, cutoff: float) -> list[tuple[str, str]]:
    """``(task id, worker id)`` of running tasks that started before ``cutoff``."""
    rows = s.execute(sa_select(col(TaskRow.id), col(TaskRow.worker_id)).where(
        col(TaskRow.state) == TaskState.RUNNING.value, col(TaskRow.started_at) < cutoff)).all()
    return [(str(t), str(w)) for t, w in rows]


def transition_task(s: Session, task_id: str, to: TaskState, **fields: Any) -> bool:
    """Move a task to ``to`` if the move is allowed from the state it is in now.

    A compare-and-set: returns False (and changes nothing) when the task has already moved
    on, which is how late and duplicate reports are refused. (A plain statement, see
    :mod:`gpulayer.store.plain`: a task row the session loaded before is not refreshed.)
    """
    allowed_from = tuple(st.value for st, targets in TASK_TRANSITIONS.items() if to in targets)
    if not allowed_from:
        return False
    return plain.set_task_state(s, task_id, to.value, allowed_from, **{k: _sql_value(v) for k, v in fields.items()})


def _sql_value(v: Any) -> Any:
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if hasattr(v, "model_dump_json"):
        return v.model_dump_json()
    return v


def revive_lost_task(s: Session, task_id: str, to: TaskState, **fields: Any) -> bool:
    """A lost task's late final report, accepted (see lifecycle.late_report_accepted)."""
    return plain.set_task_state(s, task_id, to.value, (TaskState.LOST.value,),
                                **{k: _sql_value(v) for k, v in fields.items()})


def heartbeat_view(s: Session, task_ids: Iterable[str]) -> list[tuple[Any, ...]]:
    """For each task: id, state, worker, job id, attempt, and its job's cancel flag, state
    and current attempt (what a heartbeat reply is decided from)."""
    return plain.fetch_in(
        s, "SELECT t.id, t.state, t.worker_id, t.job_id, t.attempt, j.cancel_requested, j.state, j.attempt "
           "FROM gl_tasks t LEFT OUTER JOIN gl_jobs j ON j.id = t.job_id WHERE t.id IN ({})", list(task_ids))


def attempts_ended_badly(s: Session, job_ids: Iterable[str]) -> set[tuple[str, int]]:
    """``(job id, attempt)`` pairs in which some task failed, timed out, was lost or cancelled."""
    ended = ", ".join(f"'{state}'" for state in ENDED_BADLY)
    rows = plain.fetch_in(s, f"SELECT job_id, attempt FROM gl_tasks WHERE state IN ({ended}) AND job_id IN ({{}})",
                          list(job_ids))
    return {(str(j), int(a)) for j, a in rows}


# --------------------------------------------------------------------------- workers


def worker(s: Session, worker_id: str, *, for_update: bool = False, fresh: bool = False) -> WorkerRow:
    return get_or_raise(s, WorkerRow, worker_id, "worker", for_update=for_update, fresh=fresh)


def find_worker(s: Session, worker_id: str) -> WorkerRow | None:
    return s.get(WorkerRow, worker_id)


def workers(s: Session, *, online_only: bool = False) -> Sequence[WorkerRow]:
    q = select(WorkerRow).order_by(col(WorkerRow.registered_at))
    if online_only:
        q = q.where(col(WorkerRow.online).is_(True))
    return list(s.exec(q).all())


#: the columns of a worker a placement pass reads (:func:`online_worker_rows`): all but the
#: heartbeat's time, which changes every few seconds and which placement does not read
WORKER_COLUMNS = ("id", "name", "origin", "capabilities", "cpu_slots", "online", "draining", "registered_at", "pid",
                  "paused")


def online_worker_rows(s: Session) -> list[tuple[Any, ...]]:
    """The online workers as plain tuples of :data:`WORKER_COLUMNS`, in registration order
    (as :func:`workers`; sorted here, which costs a fifth of SQLite's sort of the rows)."""
    rows = plain.fetch(s, f"SELECT {', '.join(WORKER_COLUMNS)} FROM gl_workers WHERE online")
    rows.sort(key=operator.itemgetter(WORKER_COLUMNS.index("registered_at")))
    return rows


def expiry_candidates(s: Session, cutoff: float, ahead: float,
                      hostname: str) -> list[tuple[str, str, str, int | None, float]]:
    """Online workers silent since before ``cutoff``, or last heard after ``ahead`` (from
    the future: the clock stepped back since), and the local ones of ``hostname`` (whose
    process may be gone): what expire_workers looks at, not the whole fleet, as
    ``(id, origin, hostname, pid, last_heartbeat)``. Plain (store/plain.py): every
    process that opens the embedded control plane runs it first, before the ORM has
    compiled anything."""
    rows = plain.fetch(s, "SELECT id, origin, hostname, pid, last_heartbeat FROM gl_workers WHERE online "
                          "AND (last_heartbeat < ? OR last_heartbeat > ? OR (origin = 'local' AND hostname = ?))",
                       (cutoff, ahead, hostname))
    return [(str(i), str(o), str(h), p, float(b)) for i, o, h, p, b in rows]


def online_flags(s: Session, worker_ids: Iterable[str]) -> dict[str, bool]:
    """Worker id -> online, for the ids that exist."""
    return {w: online for w, (online, _) in worker_flags(s, worker_ids).items()}


def touch_workers(s: Session, worker_ids: Iterable[str], now: float) -> None:
    """Heartbeats: the workers are alive at ``now`` (one plain UPDATE per worker, batched)."""
    params = [{"now": now, "yes": True, "id": w} for w in worker_ids]
    if params:
        s.execute(text("UPDATE gl_workers SET last_heartbeat = :now, online = :yes WHERE id = :id"), params)


def touch_workers_at(s: Session, heard: dict[str, float], *, ahead_by: float) -> None:
    """Heartbeats answered before they were written: each worker alive at its own time,
    unless a later one was written; one more than ``ahead_by`` seconds later is from before
    the clock stepped back, and is replaced."""
    params = [{"now": at, "ahead": at + ahead_by, "yes": True, "id": w} for w, at in heard.items()]
    if params:
        s.execute(text("UPDATE gl_workers SET last_heartbeat = :now, online = :yes "
                       "WHERE id = :id AND (last_heartbeat < :now OR last_heartbeat > :ahead)"), params)


def worker_flags(s: Session, worker_ids: Iterable[str]) -> dict[str, tuple[bool, bool]]:
    """Worker id -> (online, draining), for the ids that exist."""
    rows = plain.fetch_in(s, "SELECT id, online, draining FROM gl_workers WHERE id IN ({})", list(worker_ids))
    return {str(w): (bool(o), bool(d)) for w, o, d in rows}


def offline_workers_silent_since(s: Session, cutoff: float) -> list[str]:
    rows = s.execute(sa_select(col(WorkerRow.id)).where(col(WorkerRow.online).is_(False),
                                                         col(WorkerRow.last_heartbeat) <= cutoff)).all()
    return [str(r[0]) for r in rows]


def delete_workers(s: Session, worker_ids: Iterable[str]) -> None:
    ids = list(worker_ids)
    if ids:
        s.execute(delete(WorkerRow).where(col(WorkerRow.id).in_(ids)).execution_options(synchronize_session=False))


def online_worker_count(s: Session) -> int:
    return int(s.execute(sa_select(func.count()).select_from(WorkerRow).where(col(WorkerRow.online).is_(True)))
               .scalar_one())


# --------------------------------------------------------------------------- logs and events


#: a stored log chunk as :func:`logs` reads it: (id, task_id, node_rank, stream, data, ts)
LogLine = tuple[int, str, int, str, str, float]
_LOG_COLUMNS = (col(LogRow.id), col(LogRow.task_id), col(LogRow.node_rank), col(LogRow.stream), col(LogRow.data),
                col(LogRow.ts))


def log_page_query(job_id: str, *, after: int, node: int | None, limit: int) -> Select[int | None, str, int, str, str, float]:
    """The statement of :func:`logs` (``bench/log_reads.py`` shows the databases' plans of it)."""
    q = sa_select(*_LOG_COLUMNS).where(col(LogRow.job_id) == job_id, col(LogRow.id) > after)
    if node is not None:
        q = q.where(col(LogRow.node_rank) == node)
    return q.order_by(col(LogRow.id)).limit(limit)


def logs(s: Session, job_id: str, *, after: int, node: int | None, limit: int, text: int) -> list[LogLine]:
    """The job's chunks after id ``after``, in order: at most ``limit``, and none after the
    one that brings their text to ``text`` characters. Read as a stream (a server-side
    cursor on PostgreSQL), so the rows past that point are never fetched, and planned for this
    job each time (see :func:`logs_backwards`); as plain rows, not ORM objects (a long log is
    many small chunks: building a ``LogRow`` for each cost 16 us)."""
    rows: list[LogLine] = []
    size = 0
    q = log_page_query(job_id, after=after, node=node, limit=limit)
    result = s.connection().execute(q.execution_options(yield_per=256))
    try:
        for row in result:
            rows.append(tuple(row))  # type: ignore[arg-type]
            size += len(row[4])
            if size >= text:
                break
    finally:
        result.close()
    return rows


#: the chunks :func:`logs_backwards` reads at a time
BACK_PAGE = 256


def logs_backwards(s: Session, job_id: str, *, after: int, node: int | None) -> Iterator[tuple[int, str]]:
    """The job's chunks after id ``after``, newest first, as ``(id, text)``: a page of
    :data:`BACK_PAGE` at a time, read as the caller goes on (``--tail``: only as far back as
    its lines reach). Each page through a server-side cursor on PostgreSQL, as :func:`logs`:
    psycopg never prepares one, so it is planned for this job every time (planned once for
    any job, as a statement prepared on its 6th run may be, it read the primary key backwards
    past every chunk other jobs stored after this job's last: ``bench/log_reads.py``)."""
    before: int | None = None
    while True:
        q = sa_select(col(LogRow.id), col(LogRow.data)).where(col(LogRow.job_id) == job_id, col(LogRow.id) > after)
        if node is not None:
            q = q.where(col(LogRow.node_rank) == node)
        if before is not None:
            q = q.where(col(LogRow.id) < before)
        page = q.order_by(col(LogRow.id).desc()).limit(BACK_PAGE).execution_options(stream_results=True)
        rows = s.connection().execute(page).all()
        for chunk_id, data in rows:
            yield chunk_id, log_text(data)  # type: ignore[misc]  # (an id read back is never None)
        if len(rows) < BACK_PAGE:
            return
        before = rows[-1][0]


def add_event(s: Session, *, ts: float, kind: str, job_id: str | None = None, task_id: str | None = None,
              worker_id: str | None = None, message: str = "") -> None:
    """Append an event: a plain INSERT (several per job; building an ORM row for each cost
    more than the insert itself)."""
    plain.add_event(s, ts=ts, kind=kind, job_id=job_id, task_id=task_id, worker_id=worker_id, message=message)


def events(s: Session, job_id: str) -> Sequence[EventRow]:
    return list(s.exec(select(EventRow).where(EventRow.job_id == job_id).order_by(col(EventRow.id))).all())


# --------------------------------------------------------------------------- bundles


def bundle_exists(s: Session, digest: str) -> bool:
    return bool(plain.fetch(s, "SELECT digest FROM gl_bundles WHERE digest = ?", (digest,)))


def bundle(s: Session, digest: str) -> BundleRow:
    return get_or_raise(s, BundleRow, digest, "bundle")


def add_bundle(s: Session, row: BundleRow) -> None:
    s.add(row)


def is_bundle_reader(s: Session, digest: str, reader: str) -> bool:
    return bool(plain.fetch(s, "SELECT digest FROM gl_bundle_readers WHERE digest = ? AND reader = ?", (digest, reader)))


def add_bundle_reader(s: Session, digest: str, reader: str, now: float) -> None:
    if not is_bundle_reader(s, digest, reader):
        s.add(BundleReaderRow(digest=digest, reader=reader, created_at=now))


def worker_runs_bundle(s: Session, worker_id: str, digest: str) -> bool:
    """Whether a task assigned to or running on ``worker_id`` belongs to a job whose code is
    bundle ``digest``."""
    q = (sa_select(col(TaskRow.id)).join(JobRow, col(TaskRow.job_id) == col(JobRow.id))
         .where(col(TaskRow.worker_id) == worker_id, col(TaskRow.state).in_(ACTIVE_TASK_STATES),
                col(JobRow.bundle_digest) == digest).limit(1))
    return s.execute(q).first() is not None


# --------------------------------------------------------------------------- tokens


def find_token_by_hash(s: Session, digest: str) -> TokenRow | None:
    row: TokenRow | None = s.exec(select(TokenRow).where(TokenRow.hash == digest)).first()
    return row


def usable_token_hashes(s: Session, digests: Sequence[str], now: float) -> set[str]:
    """Of these secret hashes, those of tokens that exist and may be used at ``now`` (not
    revoked, expired or used up): how a server re-confirms the tokens it remembers."""
    out: set[str] = set()
    for i in range(0, len(digests), 900):  # within SQLite's limit on bound parameters
        rows = s.execute(sa_select(col(TokenRow.hash)).where(
            col(TokenRow.hash).in_(digests[i:i + 900]), col(TokenRow.revoked).is_(False),
            or_(col(TokenRow.expires_at).is_(None), col(TokenRow.expires_at) > now),
            or_(col(TokenRow.uses_left).is_(None), col(TokenRow.uses_left) > 0))).all()
        out.update(str(r[0]) for r in rows)
    return out


def token(s: Session, token_id: str) -> TokenRow:
    return get_or_raise(s, TokenRow, token_id, "token")


def tokens(s: Session, *, include_revoked: bool = True) -> Sequence[TokenRow]:
    q = select(TokenRow).order_by(col(TokenRow.created_at))
    if not include_revoked:
        q = q.where(col(TokenRow.revoked).is_(False))
    return list(s.exec(q).all())


def add_token(s: Session, row: TokenRow) -> None:
    s.add(row)


def spend_token_use(s: Session, token_id: str) -> bool:
    """Spend one use of a counted token; False when none was left.

    A conditional decrement in SQL, never a value computed here and written back: two joins
    racing for the last use cannot both get it (PostgreSQL writers here take no shared lock).
    """
    result = s.execute(text("UPDATE gl_tokens SET uses_left = uses_left - 1 WHERE id = :id AND uses_left > 0"),
                       {"id": token_id})
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


#: the ``gl_meta`` key every revocation changes (see :func:`revocation_mark`)
REVOCATION_KEY = "token_revocation"


def revoke_token(s: Session, token_id: str) -> None:
    s.execute(update(TokenRow).where(col(TokenRow.id) == token_id).values(revoked=True)
              .execution_options(synchronize_session=False))
    _mark_revocation(s)


def revoke_worker_tokens(s: Session, worker_id: str) -> None:
    s.execute(update(TokenRow).where(col(TokenRow.worker_id) == worker_id, col(TokenRow.scope) == "worker")
              .values(revoked=True).execution_options(synchronize_session=False))
    _mark_revocation(s)


def _mark_revocation(s: Session) -> None:
    """A new random mark, in the revocation's transaction: a server that remembers verified
    tokens re-checks them all when the mark changed (one row read otherwise). An upsert,
    so revocations racing on several servers need no lock of ours."""
    s.execute(text("INSERT INTO gl_meta (key, value) VALUES (:k, :v) "
                   "ON CONFLICT (key) DO UPDATE SET value = excluded.value"),
              {"k": REVOCATION_KEY, "v": secrets.token_hex(8)})


def revocation_mark(s: Session) -> str | None:
    """What the last revocation wrote (None: no token was ever revoked)."""
    return meta(s, REVOCATION_KEY)


# --------------------------------------------------------------------------- machines

MACHINE_ENDED = ("terminated", "failed")


def machine(s: Session, machine_id: str) -> MachineRow:
    return get_or_raise(s, MachineRow, machine_id, "machine", fresh=True)


def add_machine(s: Session, row: MachineRow) -> None:
    s.add(row)


def machines(s: Session, *, live_only: bool = False, provider: str | None = None) -> Sequence[MachineRow]:
    """Machines, oldest first; ``live_only``: not terminated or failed."""
    q = select(MachineRow).order_by(col(MachineRow.created_at), col(MachineRow.id))
    if live_only:
        q = q.where(col(MachineRow.state).not_in(MACHINE_ENDED))
    if provider is not None:
        q = q.where(MachineRow.provider == provider)
    return list(s.exec(q.execution_options(populate_existing=True)).all())


def machine_by_token(s: Session, token_id: str) -> MachineRow | None:
    """The machine a bootstrap token was made for."""
    row: MachineRow | None = s.exec(select(MachineRow).where(MachineRow.token_id == token_id)).first()
    return row


def machine_of_worker(s: Session, worker_id: str) -> MachineRow | None:
    row: MachineRow | None = s.exec(select(MachineRow).where(MachineRow.worker_id == worker_id)).first()
    return row


def busy_worker_ids(s: Session, worker_ids: Iterable[str]) -> set[str]:
    """Which of these workers hold an assigned or running task."""
    ids = list(worker_ids)
    if not ids:
        return set()
    rows = s.execute(sa_select(col(TaskRow.worker_id)).where(
        col(TaskRow.worker_id).in_(ids), col(TaskRow.state).in_(ACTIVE_TASK_STATES)).distinct()).all()
    return {str(r[0]) for r in rows}


def meta(s: Session, key: str) -> str | None:
    row = s.get(MetaRow, key)
    return row.value if row is not None else None


def set_meta(s: Session, key: str, value: str) -> None:
    s.merge(MetaRow(key=key, value=value))


def last_task_ends(s: Session, worker_ids: Iterable[str]) -> dict[str, float]:
    """Worker id -> when its last task ended (what a machine's idle time counts from)."""
    ids = list(worker_ids)
    if not ids:
        return {}
    rows = s.execute(sa_select(col(TaskRow.worker_id), func.max(col(TaskRow.ended_at)))
                     .where(col(TaskRow.worker_id).in_(ids)).group_by(col(TaskRow.worker_id))).all()
    return {str(w): float(t) for w, t in rows if t is not None}
