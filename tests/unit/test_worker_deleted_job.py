"""A worker whose task's job is deleted (``gpulayer jobs delete``, a prune) while the task is
assigned to it or running on it: it says so in one calm line and ends the task's processes
as for a cancel, rather than logging refusals and warnings about a task it cannot find.

Only an ended job is deleted, so a running task's job was ended without it: its worker was
silent past the heartbeat timeout (a suspended machine), its task lost and its job failed.
The tests write that end into the database as the control plane does (one transaction), then
delete the job with the control plane's own delete; a real worker agent runs a real process.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control import ControlPlane
from gpulayer.pids import pid_alive
from gpulayer.records import JobState
from gpulayer.specs import CommandJob
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from tests.factories import make_capabilities
from tests.support import wait_for


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("gpulayer.worker")]


def test_a_running_task_whose_job_is_deleted_ends_as_for_a_cancel_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    db = tmp_path / "gpulayer.db"
    cp = ControlPlane(Store(f"sqlite:///{db}"))
    # heartbeats and polls far apart: what the worker learns, it learns from its own calls
    worker = Agent(cp, capabilities=make_capabilities(), cpu_slots=1, heartbeat_interval=600, poll_wait=600)
    worker.start()
    pid_file = tmp_path / "pid"
    try:
        job = cp.submit(CommandJob(command=[sys.executable, "-c", (
            f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "while True:\n    print('working', flush=True)\n    time.sleep(0.05)\n")]))
        wait_for(lambda: cp.get_job(job.id).state is JobState.RUNNING and cp.logs(job.id), what="the job's output")
        pid = int(pid_file.read_text())
        caplog.set_level(logging.INFO, logger="gpulayer")
        with sqlite3.connect(db) as con:  # its worker went silent: the task lost, the job failed
            con.execute("UPDATE gl_tasks SET state = 'lost' WHERE job_id = ?", (job.id,))
            con.execute("UPDATE gl_jobs SET state = 'failed' WHERE id = ?", (job.id,))
        assert cp.delete_jobs([job.id]).deleted == [job.id]

        wait_for(lambda: not worker.running_tasks and not pid_alive(pid), what="the task's process to end")
        # one line, whichever call heard of it first: a shipment of its output (which ends
        # it), or the poll (which ends it as it ends a cancelled task) and then its report
        said = _said(caplog)
        assert len(said) == 1 and said[0][0] == "INFO", said
        assert re.fullmatch(rf"task tsk-\w+: job {job.id} was deleted; its processes (are|were) ended as for "
                            "a cancel", said[0][1]), said
    finally:
        worker.stop(grace=0)
        cp.store.dispose()


class DeletedBeforeItStarts:
    """The control plane, where a job is cancelled and deleted just before its task's start
    reaches it (the worker was handed the task a moment before)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cp, name)

    def start_task(self, task_id: str, **kwargs: Any) -> None:
        (job,) = self.cp.list_jobs()
        self.cp.cancel(job.id)  # (assigned, not started: it ends at once)
        assert self.cp.delete_jobs([job.id]).deleted == [job.id]
        self.cp.start_task(task_id, **kwargs)


def test_a_task_whose_job_is_deleted_before_it_starts_is_not_started_and_the_worker_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    cp = ControlPlane(Store(f"sqlite:///{tmp_path / 'gpulayer.db'}"))
    worker = Agent(DeletedBeforeItStarts(cp), capabilities=make_capabilities(),  # type: ignore[arg-type]
                   cpu_slots=1, heartbeat_interval=600)
    worker.start()
    marker = tmp_path / "ran"
    try:
        caplog.set_level(logging.INFO, logger="gpulayer")
        job = cp.submit(CommandJob(command=["touch", str(marker)]))
        wait_for(lambda: _said(caplog), what="the worker to say something")
        wait_for(lambda: not worker.running_tasks, what="the task to be let go")
        said = _said(caplog)
        assert len(said) == 1 and re.fullmatch(rf"not starting tsk-\w+: job {job.id} was deleted", said[0][1]), said
        assert not marker.exists()
    finally:
        worker.stop(grace=0)
        cp.store.dispose()

