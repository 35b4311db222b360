"""The statements that delete ended jobs and the bundles no job uses (:mod:`gpulayer.control.retention`).

A job is deleted with everything stored for it: its tasks, output and events. Only jobs in
an ended state are ever chosen (the caller checks each id it is given; the age query asks for
those states alone). A bundle is deleted once no stored job names it, whatever its state.
They run in the caller's write transaction, a batch at a time, so that a large prune never
holds the writers' lock for long: a batch's output first, a bounded number of chunks at a
time (:func:`delete_logs`), then the jobs with the rest.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import delete, func
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from gpulayer.records import JobState
from gpulayer.store import plain
from gpulayer.store.tables import ArtifactsRow, BundleReaderRow, BundleRow, EventRow, JobRow, LogRow, TaskRow

#: the states a job may be deleted in
ENDED_STATES: tuple[str, ...] = tuple(s.value for s in JobState if s.terminal)


def ended_before(s: Session, cut: float, *, states: Sequence[str], owner: str | None,
                 limit: int) -> list[str]:
    """Up to ``limit`` ids of jobs in ``states`` (ended ones) that were last changed (ended)
    before ``cut``, oldest first; ``owner``: only that token's. A job ended after it was
    created, so ``created_at < cut`` bounds the scan on the state's (or owner's) index."""
    q = (sa_select(col(JobRow.id))
         .where(col(JobRow.state).in_([st for st in states if st in ENDED_STATES]),
                col(JobRow.created_at) <= cut, col(JobRow.updated_at) <= cut)
         .order_by(col(JobRow.created_at), col(JobRow.id)).limit(limit))
    if owner is not None:
        q = q.where(col(JobRow.owner) == owner)
    return [job_id for (job_id,) in s.execute(q)]


def count_ended_before(s: Session, cut: float, *, states: Sequence[str], owner: str | None) -> int:
    """How many jobs :func:`ended_before` would give, with no limit."""
    q = (sa_select(func.count()).select_from(JobRow)
         .where(col(JobRow.state).in_([st for st in states if st in ENDED_STATES]),
                col(JobRow.created_at) <= cut, col(JobRow.updated_at) <= cut))
    if owner is not None:
        q = q.where(col(JobRow.owner) == owner)
    return int(s.execute(q).scalar_one())


def still_ended(s: Session, job_ids: Sequence[str]) -> list[str]:
    """Those of these jobs that exist and are in an ended state, in their order (a job whose
    task was lost may come back: its worker's late report is accepted)."""
    ended = {job_id for job_id, state in plain.fetch_in(s, "SELECT id, state FROM gl_jobs WHERE id IN ({})",
                                                        list(job_ids)) if state in ENDED_STATES}
    return [j for j in job_ids if j in ended]


def delete_logs(s: Session, job_ids: Sequence[str], limit: int) -> int:
    """Delete up to ``limit`` of these jobs' log chunks; how many it deleted."""
    if not job_ids:
        return 0
    some = sa_select(col(LogRow.id)).where(col(LogRow.job_id).in_(list(job_ids))).limit(limit)
    gone = s.execute(delete(LogRow).where(col(LogRow.id).in_(some)),
                     execution_options={"synchronize_session": False})  # (no RETURNING of every id)
    return int(gone.rowcount)  # type: ignore[attr-defined]


def delete_jobs(s: Session, job_ids: Sequence[str]) -> None:
    """Delete these jobs with their tasks, output, artifacts and events."""
    ids = list(job_ids)
    for i in range(0, len(ids), plain.IN_CHUNK):  # (old SQLite: 999 variables a statement)
        chunk = ids[i:i + plain.IN_CHUNK]
        s.execute(delete(LogRow).where(col(LogRow.job_id).in_(chunk)))
        s.execute(delete(EventRow).where(col(EventRow.job_id).in_(chunk)))
        # (the tasks first: on PostgreSQL a task's artifacts being stored hold its row, and
        # are committed, to be deleted here, by the time its delete goes by)
        s.execute(delete(TaskRow).where(col(TaskRow.job_id).in_(chunk)))
        s.execute(delete(ArtifactsRow).where(col(ArtifactsRow.job_id).in_(chunk)))
        s.execute(delete(JobRow).where(col(JobRow.id).in_(chunk)))


def delete_artifacts_of_gone_jobs(s: Session) -> None:
    """Delete the artifacts whose job is gone: a GPUlayer of schema 12 or older, left running
    on a database a newer one migrated, deletes jobs without them (it does not know their
    table). One lookup in the jobs' primary key for each task's artifacts stored: a scalar
    subquery with a limit, as :func:`unused_bundles` asks (a ``NOT EXISTS`` became a merge with
    the whole index on PostgreSQL)."""
    job = sa_select(col(JobRow.id)).where(col(JobRow.id) == col(ArtifactsRow.job_id)).limit(1).scalar_subquery()
    s.execute(delete(ArtifactsRow).where(job.is_(None)), execution_options={"synchronize_session": False})


def unused_bundles(s: Session, cut: float, among: Collection[str] | None = None) -> list[str]:
    """Bundles stored before ``cut`` (of those ``among``, if given) that no stored job names:
    for each, a lookup in the index of the jobs' ``bundle_digest`` (schema 11), whatever the
    number of jobs kept. It read every stored job's spec before (one search of their text per
    bundle, later one pass over them all: 0.6 s on PostgreSQL with 200,000 jobs kept, in the
    write transaction). The first job that names a bundle is a scalar subquery with a limit,
    which the database runs for each bundle (a ``NOT EXISTS`` became a merge of the bundles
    with the whole index on PostgreSQL). The statement does not alias ``gl_jobs`` (a test
    reads its plan)."""
    first = (sa_select(col(JobRow.id)).where(col(JobRow.bundle_digest) == col(BundleRow.digest))
             .limit(1).scalar_subquery())
    q = sa_select(col(BundleRow.digest)).where(col(BundleRow.created_at) <= cut, first.is_(None))
    if among is None:
        return [d for (d,) in s.execute(q)]
    wanted = sorted(set(among))
    out: list[str] = []
    for i in range(0, len(wanted), plain.IN_CHUNK):  # (old SQLite: 999 variables a statement)
        out += [d for (d,) in s.execute(q.where(col(BundleRow.digest).in_(wanted[i:i + plain.IN_CHUNK])))]
    return out


def bundles_of(s: Session, job_ids: Sequence[str]) -> set[str]:
    """The bundles these jobs name."""
    return {d for (d,) in plain.fetch_in(s, "SELECT bundle_digest FROM gl_jobs WHERE id IN ({}) "
                                            "AND bundle_digest IS NOT NULL", list(job_ids))}


def delete_bundles(s: Session, digests: Iterable[str]) -> None:
    ids = list(digests)
    if ids:
        s.execute(delete(BundleReaderRow).where(col(BundleReaderRow.digest).in_(ids)))
        s.execute(delete(BundleRow).where(col(BundleRow.digest).in_(ids)))


__all__ = ["ENDED_STATES", "bundles_of", "count_ended_before", "delete_artifacts_of_gone_jobs", "delete_bundles",
           "delete_jobs", "delete_logs", "ended_before", "still_ended", "unused_bundles"]
