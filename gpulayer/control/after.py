"""Jobs that run after others: ``spec.after`` (``gpulayer submit --after JOB``,
``f.options(after=handle)``), as Slurm's ``--dependency=afterok`` and Ray's tasks that take
another's result, and ``spec.after_ended`` (``--after-ended JOB``: any end will do, Slurm's
``afterany``, for a job that cleans up or reports).

A job that names jobs to run after stays ``queued`` and is not placed (the queue's reads skip
it: ``gl_jobs.waiting_for`` > 0) until every one of ``after`` has succeeded and every one of
``after_ended`` has ended; the first of ``after`` to end otherwise (failed, cancelled, timed
out, unschedulable) ends it as ``failed``, with a ``dependency`` error that names it, without
running it, and so on down the chain. A job of ``after`` that has succeeded already (of
``after_ended``, that has ended) counts as done; one of ``after`` that ended otherwise fails
the new job at once.

Both ends are written in the transaction that ends the job run after (the store calls
:func:`resolve` before any write transaction that ended jobs commits: see
:attr:`gpulayer.store.Store.on_ended`), so a crash cannot leave a job waiting for one that
ended. ``gl_job_after`` keeps a row per pair still waiting; a job's own end (a cancel while it
waits) removes its rows too, so a stored job that has ended is named by none.

A job ended by its loss (its worker went silent, no retries left) may still succeed, when that
worker's late report comes (:func:`gpulayer.lifecycle.late_report_accepted`): the jobs that its
loss failed without running, and only it (not run again, never run, still stored; none other of
their ``after`` ended otherwise), wait again, in the report's transaction, for what they run
after as it stands then, and so do the jobs that failed because of them, down the chain, and
the jobs that run after the end of one of those and have not run (:func:`note_revived`), as a
cleared upstream task in Airflow sends its downstream back to wait.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlmodel import Session

from gpulayer.errors import UnknownAfter
from gpulayer.records import JobError, JobState, PlacementDecision
from gpulayer.specs import JobSpec
from gpulayer.store import mapping, plain

#: what a write transaction's session keeps in ``info``: the ended jobs already looked at,
#: the jobs whose last job to run after succeeded (they join the queue), and the jobs a late
#: report revived (see :func:`note_revived`)
_DONE = "gl_after_done"
RELEASED = "gl_after_released"
_REVIVED = "gl_after_revived"

EventSink = Callable[..., None]

_SUCCEEDED = JobState.SUCCEEDED.value
_QUEUED = JobState.QUEUED.value
_FAILED = JobState.FAILED.value
#: how the error of a job that failed because of job ``{}``, which it runs after, begins (see :func:`_fail`)
_NOT_RUN = "not run: {}, which it runs after, "
#: how an ended job that was not a success reads in the message of a job that ran after it
_ENDED_AS = {"failed": "failed", "cancelled": "was cancelled", "timed_out": "timed out",
             "unschedulable": "was unschedulable"}


def hold(s: Session, job_id: str, after: Sequence[str], after_ended: Sequence[str], owner: str | None,
         now: float, event: EventSink) -> None:
    """At submit, in its transaction (the job is stored, not yet placed): ``job_id`` waits for
    the jobs of ``after`` (to succeed) and ``after_ended`` (to end, whatever the outcome) that
    have not ended, or fails at once if one of ``after`` ended without success. An id that
    names no stored job (none of ``owner``'s, for a client token) is an
    :class:`~gpulayer.errors.UnknownAfter`, and nothing is stored."""
    found = {r[0]: (r[1], r[2], r[3]) for r in plain.fetch_in(
        s, "SELECT id, state, owner, error FROM gl_jobs WHERE id IN ({})", sorted({*after, *after_ended}))}
    for field, ids in (("after", after), ("after_ended", after_ended)):
        for i, other in enumerate(ids):
            state_owner = found.get(other)
            if state_owner is None or (owner is not None and state_owner[1] != owner):
                raise UnknownAfter(f"{field}[{i}]={other!r}: no such job"
                                   f"{' of yours' if owner is not None else ''}; accepted: the id of a stored job "
                                   "(gpulayer jobs list)", index=i, job=other, field=field)
    for other in after:
        state, _, error = found[other]
        if state in plain.ENDED_STATES and state != _SUCCEEDED:
            _fail(s, job_id, other, state, error, now, event)
            return
    waiting = [(other, False) for other in after if found[other][0] not in plain.ENDED_STATES]
    waiting += [(other, True) for other in after_ended if found[other][0] not in plain.ENDED_STATES]
    if not waiting:
        return
    for other, any_end in waiting:
        _pair(s, other, job_id, any_end)
    plain.update_job(s, job_id, waiting_for=len(waiting), decision=waiting_decision(waiting, now).model_dump_json())


def waiting_decision(waiting: Sequence[tuple[str, bool]], now: float) -> PlacementDecision:
    """What a job that waits for ``waiting`` (``(id, any end will do)`` of the jobs it runs
    after) says about its place."""
    succeed = [other for other, any_end in waiting if not any_end]
    end = [other for other, any_end in waiting if any_end]
    parts = [*([f"{_listed(succeed)} to succeed"] if succeed else []), *([f"{_listed(end)} to end"] if end else [])]
    them = "it" if len(waiting) == 1 else "them"
    return PlacementDecision(outcome="waiting", summary=f"waiting for {' and '.join(parts)} first (it runs after {them})",
                             at=now)


def resolve(s: Session, now: float, event: EventSink) -> list[str]:
    """Before a write transaction that ended jobs commits: what their ends mean for the jobs
    that run after them (released, or failed in turn, down the chain), and the rows of the jobs
    that ended while they waited removed. The jobs released, in order (the caller places them)."""
    done: set[str] = s.info.setdefault(_DONE, set())
    released: list[str] = []
    while True:
        new = sorted(plain.ended_in(s) - done)
        if not new:
            return released
        done.update(new)
        revived = s.info.get(_REVIVED, set()).intersection(new)
        if revived:
            released += _wait_again(s, sorted(revived), now, event)
        pairs = _pairs_of(s, new)
        if not pairs:
            continue
        _delete_pairs(s, new)
        ended = set(new)
        outcome = {r[0]: (r[1], r[2]) for r in plain.fetch_in(
            s, "SELECT id, state, error FROM gl_jobs WHERE id IN ({})", sorted({a for a, _, _ in pairs if a in ended}))}
        succeeded: dict[str, int] = {}
        for other, job_id, any_end in pairs:
            if job_id in ended or other not in ended:  # (its own end: the row just goes)
                continue
            state, error = outcome[other]
            if state == _SUCCEEDED or any_end:
                succeeded[job_id] = succeeded.get(job_id, 0) + 1
            elif job_id not in plain.ended_in(s):
                _fail(s, job_id, other, state, error, now, event)
        for job_id, count in sorted(succeeded.items()):
            if job_id in plain.ended_in(s):  # (another it ran after failed)
                continue
            plain.execute(s, "UPDATE gl_jobs SET waiting_for = waiting_for - ? WHERE id = ? AND state = ?",
                          (count, job_id, _QUEUED))
            left = _left(s, job_id)
            if left:
                plain.update_job(s, job_id, decision=waiting_decision(left, now).model_dump_json())
            else:
                plain.execute(s, "UPDATE gl_jobs SET waiting_for = 0 WHERE id = ?", (job_id,))
                _release(s, job_id, event)
                released.append(job_id)


def note_revived(s: Session, job_id: str) -> None:
    """In the transaction of a late report that revives ``job_id``, which its loss had ended
    (see :func:`gpulayer.lifecycle.late_report_accepted`): if it succeeds, :func:`resolve`
    puts the jobs that the loss failed back to wait (see the module)."""
    s.info.setdefault(_REVIVED, set()).add(job_id)


def _wait_again(s: Session, revived: list[str], now: float, event: EventSink) -> list[str]:
    """For those of ``revived`` that succeeded after all: the jobs that failed without running
    only because one ended by its loss wait again, and so, down the chain, do the jobs that
    failed because of those, and the jobs that run after their end and have not run. Those
    that wait for nothing are released (the caller places them), in order."""
    back: list[str] = []  # (in the order they went back)
    todo = [(root, f"{root}, which it runs after, succeeded after all (a late report)", root, False)
            for root, state in plain.fetch_in(s, "SELECT id, state FROM gl_jobs WHERE id IN ({})", revived)
            if state == _SUCCEEDED]
    while todo:
        other, why, root, waits = todo.pop(0)
        for job_id, spec in _failed_because_of(s, other):
            waiting = _waits_now(s, spec)
            if waiting is None:  # (another it runs after ended otherwise: it failed because of that too)
                continue
            decision = waiting_decision(waiting, now).model_dump_json() if waiting else None
            if not plain.execute(
                    s, "UPDATE gl_jobs SET state = ?, error = NULL, updated_at = ?, waiting_for = ?, decision = ? "
                    "WHERE id = ? AND state = ?", (_QUEUED, now, len(waiting), decision, job_id, _FAILED)):
                continue
            for after_id, any_end in waiting:
                _pair(s, after_id, job_id, any_end)
            event(s, "waits_again", job_id=job_id, message=f"waits again: {why}")
            back.append(job_id)
            todo.append((job_id, f"{job_id}, which it runs after, will run after all "
                                 f"({root} succeeded after all: a late report)", root, True))
        if waits:  # (``other`` has not ended any more: the jobs after its end that have not run wait for it)
            for job_id in _unstarted_after_end_of(s, other):
                _pair(s, other, job_id, True)
                plain.execute(s, "UPDATE gl_jobs SET waiting_for = waiting_for + 1, updated_at = ? WHERE id = ?",
                              (now, job_id))
                plain.update_job(s, job_id, decision=waiting_decision(_left(s, job_id), now).model_dump_json())
                event(s, "waits_again", job_id=job_id, message=f"waits again: {why}")
                back.append(job_id)
    released: list[str] = []
    for job_id in dict.fromkeys(back):
        if not plain.fetch(s, "SELECT waiting_for FROM gl_jobs WHERE id = ?", (job_id,))[0][0]:
            _release(s, job_id, event)
            released.append(job_id)
    return released


def _failed_because_of(s: Session, other: str) -> list[tuple[str, JobSpec]]:
    """The jobs (with their specs) that failed without running because ``other``, which they
    run after, ended otherwise: never run (no task), not run again (a rerun names the new job,
    which is the user's run now). (Read from the failed jobs' errors, which name it: on a late
    report alone.)"""
    prefix = _NOT_RUN.format(other)
    found: list[tuple[str, JobSpec]] = []
    for job_id, spec_json, error_json in plain.fetch(
            s, "SELECT j.id, j.spec, j.error FROM gl_jobs j WHERE j.state = ? AND j.error LIKE ? "
               "AND NOT EXISTS (SELECT 1 FROM gl_tasks t WHERE t.job_id = j.id) "
               "AND NOT EXISTS (SELECT 1 FROM gl_events e WHERE e.job_id = j.id AND e.kind = ?) "
               "ORDER BY j.created_at, j.id", (_FAILED, f"%{prefix}%", "rerun")):
        error, spec = mapping.error_of(error_json), mapping.spec(spec_json)
        if error is not None and error.type == "dependency" and error.message.startswith(prefix) \
                and other in spec.after:
            found.append((job_id, spec))
    return found


def _waits_now(s: Session, spec: JobSpec) -> list[tuple[str, bool]] | None:
    """What a job of ``spec`` would wait for now (as :func:`waiting_decision` takes it), or
    None where one of its ``after`` ended without success (or was deleted): it did not fail
    because of one job alone."""
    states = {r[0]: r[1] for r in plain.fetch_in(
        s, "SELECT id, state FROM gl_jobs WHERE id IN ({})", sorted({*spec.after, *spec.after_ended}))}
    if any(states.get(a) is None or (states[a] in plain.ENDED_STATES and states[a] != _SUCCEEDED)
           for a in spec.after):
        return None
    # (one of after_ended that is gone had ended: a job is deleted once it has)
    return ([(a, False) for a in spec.after if states[a] not in plain.ENDED_STATES]
            + [(a, True) for a in spec.after_ended if states.get(a, _SUCCEEDED) not in plain.ENDED_STATES])


def _unstarted_after_end_of(s: Session, other: str) -> list[str]:
    """The queued jobs that never ran and run after ``other``'s end (``after_ended``), whose
    end released them (or left them waiting for others): no pair names the two."""
    return [job_id for job_id, spec_json in plain.fetch(
        s, "SELECT j.id, j.spec FROM gl_jobs j WHERE j.state = ? AND j.spec LIKE ? "
           "AND NOT EXISTS (SELECT 1 FROM gl_tasks t WHERE t.job_id = j.id) "
           "AND NOT EXISTS (SELECT 1 FROM gl_job_after a WHERE a.job_id = j.id AND a.after_id = ?) "
           "ORDER BY j.created_at, j.id", (_QUEUED, f"%{other}%", other))
        if other in mapping.spec(spec_json).after_ended]


def _pair(s: Session, after_id: str, job_id: str, any_end: bool) -> None:
    plain.execute(s, "INSERT INTO gl_job_after (after_id, job_id, any_end) VALUES (?, ?, ?)", (after_id, job_id, any_end))


def _left(s: Session, job_id: str) -> list[tuple[str, bool]]:
    """What the job still waits for (as :func:`waiting_decision` takes it)."""
    return [(r[0], bool(r[1])) for r in plain.fetch(
        s, "SELECT after_id, any_end FROM gl_job_after WHERE job_id = ? ORDER BY after_id", (job_id,))]


def _release(s: Session, job_id: str, event: EventSink) -> None:
    event(s, "released", job_id=job_id, message="the jobs it runs after have ended as it needs")
    s.info.setdefault(RELEASED, set()).add(job_id)


def overdue(s: Session) -> list[str]:
    """The ended jobs that either end of a waiting pair still names: ended by a process of a
    GPUlayer from before jobs ran after others (schema 11), which writes a job's state and not
    the pairs, still running on the database an upgrade migrated (an embedded home's worker
    started before it). :func:`resolve` does for them now what their ends would have done.
    (Only pairs still waiting are read: a short table.)"""
    marks = ", ".join("?" * len(plain.ENDED_STATES))
    return [r[0] for r in plain.fetch(
        s, f"SELECT a.after_id FROM gl_job_after a JOIN gl_jobs j ON j.id = a.after_id WHERE j.state IN ({marks}) "
        f"UNION SELECT a.job_id FROM gl_job_after a JOIN gl_jobs j ON j.id = a.job_id WHERE j.state IN ({marks})",
        (*plain.ENDED_STATES, *plain.ENDED_STATES))]


def released_in(info: dict[str, object]) -> list[str]:
    """The jobs a committed transaction released (see :func:`resolve`), from its session's ``info``."""
    found = info.get(RELEASED)
    return sorted(found) if isinstance(found, set) else []


def _pairs_of(s: Session, ended: list[str]) -> list[tuple[str, str, bool]]:
    """The waiting pairs ``(after_id, job_id, any end will do)`` that either end of names one of ``ended``."""
    return [(r[0], r[1], bool(r[2])) for chunk, marks in _chunks(ended) for r in plain.fetch(
        s, f"SELECT after_id, job_id, any_end FROM gl_job_after WHERE after_id IN ({marks}) OR job_id IN ({marks})",
        (*chunk, *chunk))]


def _delete_pairs(s: Session, ended: list[str]) -> None:
    for chunk, marks in _chunks(ended):
        plain.execute(s, f"DELETE FROM gl_job_after WHERE after_id IN ({marks}) OR job_id IN ({marks})",
                      (*chunk, *chunk))


def _chunks(ids: list[str]) -> list[tuple[list[str], str]]:
    """``ids`` in chunks that fit a statement naming each twice (old SQLite: 999 variables),
    each with its ``?, ?...``."""
    step = plain.IN_CHUNK // 2
    return [(ids[i:i + step], ", ".join("?" * len(ids[i:i + step]))) for i in range(0, len(ids), step)]


def _fail(s: Session, job_id: str, other: str, state: str, error: str | None, now: float, event: EventSink) -> None:
    """End the queued job ``job_id`` without running it: ``other``, which it runs after, ended as ``state``."""
    cause = mapping.error_of(error)
    never_ran = cause is not None and cause.type == "dependency"
    how = "did not run either" if never_ran else _ENDED_AS.get(state, state)
    message = f"{_NOT_RUN.format(other)}{how} (gpulayer jobs show {other})"
    changed = plain.execute(
        s, "UPDATE gl_jobs SET state = ?, error = ?, updated_at = ?, waiting_for = 0, decision = NULL "
        "WHERE id = ? AND state = ?",
        (JobState.FAILED.value, JobError.dependency(message).model_dump_json(), now, job_id, _QUEUED))
    if changed:
        plain.note_ended(s, job_id)
        event(s, "dependency_failed", job_id=job_id, message=message)


def _listed(ids: Sequence[str]) -> str:
    if len(ids) <= 3:
        return ", ".join(ids[:-1]) + (" and " if len(ids) > 1 else "") + ids[-1]
    return f"{', '.join(ids[:3])} and {len(ids) - 3} more"


__all__ = ["RELEASED", "hold", "note_revived", "overdue", "released_in", "resolve", "waiting_decision"]
