"""Tasks' artifacts: the files a task leaves in its artifacts folder (``GPULAYER_ARTIFACTS_DIR``,
made by its worker), which the worker zips and stores here before the task's final report,
so that they are there when anyone sees the job ended, however its worker's machine went
(`gpulayer jobs artifacts JOB`, ``handle.artifacts()``). One zip per task, kept with its
job until the job is deleted (as SageMaker keeps a training job's model folder, or a
GitHub Actions run its uploaded artifacts).

The zip is checked as a bundle is (:func:`gpulayer.bundles.check_archive`: no absolute or
``..`` path, no link, sizes as declared), under the artifacts' own limits: its size
(``GPULAYER_MAX_ARTIFACTS_MB``), and as many files and bytes once extracted as the worker
may send; a compression ratio is not limited (a task's own output of zeros is no attack on
anyone: its reader asked for it).
"""

from __future__ import annotations

import zipfile
from io import BytesIO
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlmodel import col

from gpulayer import bundles, config
from gpulayer.artifacts import limits, too_large
from gpulayer.errors import NotFound, TooLarge
from gpulayer.store import artifacts as rows
from gpulayer.store import plain
from gpulayer.store.tables import ArtifactsRow, TaskRow
from gpulayer.wire import TaskArtifacts

if TYPE_CHECKING:
    from gpulayer.control import ControlPlane

__all__ = ["check_uploader", "get_artifacts", "list_artifacts", "put_artifacts"]


def check_uploader(cp: ControlPlane, task_id: str, worker_id: str) -> None:
    """Refuse another worker's upload of the task's artifacts (and one for no such task):
    a server does so before it reads the upload's body."""
    with cp.store.read() as s:
        cp._own_task(s, task_id, worker_id)


def put_artifacts(cp: ControlPlane, task_id: str, digest: str, data: bytes, worker_id: str) -> TaskArtifacts:
    check_uploader(cp, task_id, worker_id)  # (another worker's task is refused before its bytes are looked at)
    if len(data) > config.max_artifacts_bytes():
        raise TooLarge(too_large(len(data)))
    # checked outside the write transaction: a large zip's check holds no writer up
    names = bundles.check_archive(data, digest, limits=limits())
    with zipfile.ZipFile(BytesIO(data)) as zf:
        unpacked = sum(i.file_size for i in zf.infolist() if not i.is_dir())
    now = cp.clock()
    with cp.store.write(lock=False) as s:
        if not cp.store.is_sqlite:
            # (PostgreSQL, where this takes no writers' lock: a delete of the job waits for
            # this row, and deletes the artifacts after the task: none left without a job)
            s.execute(select(col(TaskRow.id)).where(col(TaskRow.id) == task_id).with_for_update())
        task = cp._own_task(s, task_id, worker_id)
        row = ArtifactsRow(task_id=task_id, job_id=task.job_id, attempt=task.attempt, node_rank=task.node_rank,
                           digest=digest, size=len(data), unpacked=unpacked, files=len(names), data=data,
                           created_at=now)
        rows.put(s, row)
        cp._event(s, "artifacts_stored", job_id=task.job_id, task_id=task_id, worker_id=worker_id,
                  message=f"{len(names)} file(s), {bundles.format_size(unpacked)}")
    return TaskArtifacts(task_id=task_id, job_id=task.job_id, attempt=task.attempt, node_rank=task.node_rank,
                         digest=digest, size=len(data), unpacked=unpacked, files=len(names), created_at=now)


def list_artifacts(cp: ControlPlane, job_id: str) -> list[TaskArtifacts]:
    with cp.store.read() as s:
        plain.job(s, job_id, result=False, arguments=False)  # (NotFound for no such job)
        return [TaskArtifacts.model_validate(r) for r in rows.of_job(s, job_id)]


def get_artifacts(cp: ControlPlane, job_id: str, task_id: str) -> bytes:
    with cp.store.read() as s:
        plain.job(s, job_id, result=False, arguments=False)
        data = rows.data_of(s, job_id, task_id)
    if data is None:
        raise NotFound(f"task {task_id!r} of {job_id}: no artifacts stored (gpulayer jobs artifacts {job_id})")
    return data
