"""Scratch folders of an earlier GPUlayer's tasks (``$GPULAYER_HOME/tasks/tsk-...``, before
each worker kept its tasks' under a folder of its own that names it) carry no owner file, and
:func:`gpulayer.worker.task_files.sweep` left them for ever. A worker's start now removes one
once no process it can see runs that task (a task's processes carry its id in their
environment, ``GPULAYER_TASK_ID``, in every version that made such folders) and nothing in it
changed for :data:`~gpulayer.worker.task_files.OLD_QUIET` seconds (a process it cannot see, on
another machine sharing the home, or one just being started there)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpulayer.worker import task_files


def _old_folder(tasks: Path, name: str, *, age: float) -> Path:
    folder = tasks / name
    folder.mkdir(parents=True)
    (folder / "out.txt").write_text("written by an earlier version's task\n")
    then = time.time() - age
    for path in (folder / "out.txt", folder):
        os.utime(path, (then, then))
    return folder


def test_a_starting_worker_removes_old_layout_folders_no_live_task_uses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    tasks = home / "tasks"
    day = task_files.OLD_QUIET + 60
    left = _old_folder(tasks, "tsk-0000000000a1", age=day)
    running = _old_folder(tasks, "tsk-0000000000a2", age=day)
    recent = _old_folder(tasks, "tsk-0000000000a3", age=60)  # (its task may be about to start)
    other = _old_folder(tasks, "not-a-task", age=day)  # (not ours to judge)
    # an earlier version's task, still running: its process carries its id
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], cwd=running,
                            env={**os.environ, "GPULAYER_TASK_ID": running.name})
    try:
        removed = task_files.sweep()
        assert removed == [left]
        assert not left.exists() and running.is_dir() and recent.is_dir() and other.is_dir()
    finally:
        proc.kill()
        proc.wait()
    # once it ended (and its folder was quiet), the next start removes it
    assert task_files.sweep() == [running]
