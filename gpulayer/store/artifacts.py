"""The SQL of tasks' artifacts (``gl_artifacts``, schema 13): one row per task that left
files in its artifacts folder, the zip in the row (see :mod:`gpulayer.control.artifacts`)."""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy import select as sa_select
from sqlmodel import Session, col

from gpulayer.store.tables import ArtifactsRow

__all__ = ["data_of", "of_job", "put"]

#: every column but the zip: what a listing reads
_LISTED = (col(ArtifactsRow.task_id), col(ArtifactsRow.job_id), col(ArtifactsRow.attempt),
           col(ArtifactsRow.node_rank), col(ArtifactsRow.digest), col(ArtifactsRow.size),
           col(ArtifactsRow.unpacked), col(ArtifactsRow.files), col(ArtifactsRow.created_at))


def put(s: Session, row: ArtifactsRow) -> None:
    """Store a task's artifacts, replacing what the same task stored before (its worker sent
    them again: the answer to the first upload was lost)."""
    s.execute(delete(ArtifactsRow).where(col(ArtifactsRow.task_id) == row.task_id))
    s.add(row)


def of_job(s: Session, job_id: str) -> list[dict[str, object]]:
    """The job's artifacts without their zips, oldest attempt first, then by node."""
    q = (sa_select(*_LISTED).where(col(ArtifactsRow.job_id) == job_id)
         .order_by(col(ArtifactsRow.attempt), col(ArtifactsRow.node_rank), col(ArtifactsRow.created_at)))
    return [dict(r._mapping) for r in s.execute(q)]


def data_of(s: Session, job_id: str, task_id: str) -> bytes | None:
    """The zip of one task of the job (None: none stored)."""
    q = sa_select(col(ArtifactsRow.data)).where(col(ArtifactsRow.task_id) == task_id,
                                                col(ArtifactsRow.job_id) == job_id)
    row = s.execute(q).first()
    return None if row is None else bytes(row[0])
