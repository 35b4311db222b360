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


def test_a_live_forked_task_of_an_earlier_version_keeps_its_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier version forked function tasks from a fork server, whose child set the task's
    environment in ``os.environ`` after its exec: the kernel's copy of the process's
    environment (what :mod:`psutil` reads) is the server's, without ``GPULAYER_TASK_ID``. Such a
    task, quiet in its folder for a day, lost the folder it worked in; the folder is its
    working directory, and that is seen."""
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    folder = _old_folder(tmp_path / "home" / "tasks", "tsk-0000000000b1", age=task_files.OLD_QUIET + 60)
    (folder / "data").mkdir()
    then = time.time() - task_files.OLD_QUIET - 60
    for path in (folder / "data", folder):
        os.utime(path, (then, then))
    env = {k: v for k, v in os.environ.items() if k != "GPULAYER_TASK_ID"}
    script = ("import os, sys, time\n"
              f"os.environ['GPULAYER_TASK_ID'] = {folder.name!r}  # (as a forked child set it)\n"
              "print('ready', flush=True)\n"
              "time.sleep(600)\n")
    # (its working directory a folder of its own inside: a task may chdir where it likes)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=folder / "data", env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert task_files.sweep() == []
        assert folder.is_dir()
    finally:
        proc.kill()
        proc.wait()
    assert task_files.sweep() == [folder]


def test_a_folder_whose_task_writes_deeper_in_it_is_not_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task on another machine sharing the home cannot be seen, so a folder is removed only
    once nothing in it changed for a day. A task that appends to ``logs/train.log`` changes
    that file, not the folder nor ``logs`` (a file's change leaves its folder's time alone):
    only the folder and what is directly in it were looked at, and the folder of a task
    writing all the while was removed."""
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    day = task_files.OLD_QUIET + 60
    busy = _old_folder(tmp_path / "home" / "tasks", "tsk-0000000000c1", age=day)
    quiet = _old_folder(tmp_path / "home" / "tasks", "tsk-0000000000c2", age=day)
    for folder in (busy, quiet):
        (folder / "logs" / "run").mkdir(parents=True)
        (folder / "logs" / "run" / "train.log").write_text("step 1\n")
    then = time.time() - day
    for path in (quiet / "logs" / "run" / "train.log", quiet / "logs" / "run", quiet / "logs", quiet,
                 busy / "logs" / "run", busy / "logs", busy):  # (busy's train.log: written just now)
        os.utime(path, (then, then))
    assert task_files.sweep() == [quiet]
    assert busy.is_dir() and not quiet.exists()
