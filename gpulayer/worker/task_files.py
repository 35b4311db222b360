"""A worker's files on disk: each FunctionJob task's function spec (when it does not travel
in the forked child's request) and its result, in one private folder (mode 0700) under
``$TMPDIR`` that the worker keeps for its life; and the scratch folder of each task that has
no bundle (its working directory), under one folder of the worker's own,
``$GPULAYER_HOME/tasks/w-XXXXXXXX/<task id>``. Not a temporary folder per task: on a
journaled file system making and removing a folder for each task cost more than the rest of
a no-op task's files (0.25 ms).

Each task also gets an artifacts folder beside its scratch folder, ``<task id>.artifacts``
(``GPULAYER_ARTIFACTS_DIR``), removed once what it holds is stored. Both are made with one
system call and, empty (most tasks'), removed with one (a tree's removal takes six, a
listing four): a no-op task's folders cost two ``mkdir`` and two ``rmdir``.

A worker removes its folders as it stops; one that was killed (SIGKILL, the OOM killer, a power
loss) could not, and each folder carries a file (:data:`OWNER`) that names its worker (host,
PID namespace and :func:`~gpulayer.worker.markers.owner`), so that the next worker started on
the machine removes those of workers that are gone (:func:`sweep`), as it ends the processes
they left (:func:`gpulayer.worker.process.reap_orphans`). Only this machine's and this PID
namespace's: a home on a shared file system is seen by the workers of other machines too.

Earlier versions made each task's scratch folder as ``$GPULAYER_HOME/tasks/<task id>``, with
no owner file, and a killed worker's stayed for ever. A worker's start removes such a folder
once no earlier worker can still be using it (:func:`_old_unused`): no process this one can
read runs that task (each process of a task carries the task's id in its environment,
``GPULAYER_TASK_ID``, in every version that made such folders) or works in the folder (a
forked task's readable environment is its fork server's), and nothing in the folder, at any
depth, changed for :data:`OLD_QUIET` seconds (an earlier worker makes the folder a moment
before it starts the task there; a task on another machine sharing the home, or in another
container, cannot be seen, and one that writes nothing in its folder for a day is what this
would take from it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Collection
from pathlib import Path

import psutil

from gpulayer import config
from gpulayer.worker.markers import _pid_namespace, owner, owner_alive

__all__ = ["INLINE_SPEC_MAX", "OLD_QUIET", "OWNER", "TaskFiles", "sweep"]

#: the largest function spec (its arguments, as JSON) a forked task gets in its request
#: rather than in a file
INLINE_SPEC_MAX = 64 * 1024
#: the file in each of a worker's folders that names the worker
OWNER = ".gpulayer-owner"
#: seconds an earlier version's task folder (``tasks/tsk-...``) must have been left unchanged
#: before a starting worker removes it (see :func:`sweep`)
OLD_QUIET = 86400.0
_FILES_PREFIX = "gpulayer-worker-"
_SCRATCH_PREFIX = "w-"
#: an earlier version's task folder: named after its task
_OLD_SCRATCH = re.compile(r"tsk-[0-9a-f]+")


def _whose() -> str:
    return f"{socket.gethostname()}\n{_pid_namespace('self') or ''}\n{owner()}\n"


def _made(parent: Path | None, prefix: str) -> Path:
    """A new private folder that names this worker as its owner."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (folder / OWNER).write_text(_whose())
    return folder


class TaskFiles:
    """The folders of one worker (each made on first use, removed by :meth:`close`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.folder: Path | None = None
        #: where its tasks' scratch folders go
        self.scratch_root: Path | None = None

    def paths(self, task_id: str) -> tuple[Path, Path]:
        """Where the task's spec and its result go."""
        with self._lock:
            if self.folder is None or not self.folder.is_dir():
                self.folder = _made(None, _FILES_PREFIX)
            folder = self.folder
        return folder / f"{task_id}.spec.json", folder / f"{task_id}.json"

    def scratch(self, task_id: str) -> Path:
        """The task's scratch folder (made here)."""
        return self._in_root(task_id)

    def artifacts(self, task_id: str) -> Path:
        """The task's artifacts folder (``GPULAYER_ARTIFACTS_DIR``: what it leaves there is kept
        with its job, see :mod:`gpulayer.worker.artifacts`), made here."""
        return self._in_root(f"{task_id}.artifacts")

    def artifacts_made(self, task_id: str) -> Path | None:
        """Where :meth:`artifacts` made the task's folder (None: no task's folder was made)."""
        root = self.scratch_root
        return None if root is None else root / f"{task_id}.artifacts"

    def _in_root(self, name: str) -> Path:
        root = self.scratch_root
        if root is not None:  # (one system call for a task: the root is looked at only when it is gone)
            try:
                os.mkdir(root / name)
                return root / name
            except FileExistsError:
                if (root / name).is_dir():
                    return root / name
                raise
            except FileNotFoundError:
                pass
        with self._lock:
            if self.scratch_root is None or not self.scratch_root.is_dir():
                self.scratch_root = _made(config.home() / "tasks", _SCRATCH_PREFIX)
            folder = self.scratch_root / name
        folder.mkdir(exist_ok=True)
        return folder

    def remove(self, task_id: str, *, function: bool) -> None:
        """The task's files: its scratch and artifacts folders and, for a FunctionJob's
        (``function``), its spec, its result, and a result the runner was killed while writing
        (``<result>.tmp-<pid>``, see function_runner): a CommandJob has none, and its end
        does not look for them (a failed unlink lists the folder)."""
        root = self.scratch_root
        if root is not None:
            _remove_folder(root / task_id)
            _remove_folder(root / f"{task_id}.artifacts")
        folder = self.folder
        if folder is None or not function:
            return
        with contextlib.suppress(OSError):
            (folder / f"{task_id}.spec.json").unlink()
        try:
            (folder / f"{task_id}.json").unlink()
        except FileNotFoundError:  # never renamed into place: a half-written one may be left
            for left in folder.glob(f"{task_id}.json.tmp-*"):
                with contextlib.suppress(OSError):
                    left.unlink()
        except OSError:
            pass

    def close(self, running: Collection[str] = ()) -> None:
        """Remove the folders (the worker stopped). What is still ``running`` tasks' (ended,
        and still at their end past the stop's wait: packing, sending their artifacts) is
        left to them, and their folders' roots with it (a later worker's :func:`sweep`
        removes those, where the worker's process ends first)."""
        if running:
            for folder in (self.folder, self.scratch_root):
                try:
                    entries = list(os.scandir(folder)) if folder is not None else []
                except OSError:
                    continue
                for entry in entries:  # (a task's are named after it: TASK, TASK.artifacts, TASK.json, ...)
                    if entry.name == OWNER or entry.name.split(".", 1)[0] in running:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        _remove_folder(Path(entry.path))
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
            return
        with self._lock:
            folders, self.folder, self.scratch_root = (self.folder, self.scratch_root), None, None
        for folder in folders:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _remove_folder(folder: Path) -> None:
    """Remove ``folder`` and what it holds, if it is there: one system call for an empty one
    or none (most tasks' scratch and artifacts folders), where a tree's removal takes six."""
    try:
        os.rmdir(folder)
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


def sweep() -> list[Path]:
    """Remove the folders of this machine's workers that are gone; returns them. A folder
    whose owner file cannot be read (being made, another user's, an older version's) stays."""
    removed: list[Path] = []
    mine = _whose().split("\n")[:2]
    for parent, prefix in ((config.home() / "tasks", _SCRATCH_PREFIX), (Path(tempfile.gettempdir()), _FILES_PREFIX)):
        with contextlib.suppress(OSError):
            for folder in parent.glob(f"{prefix}*"):
                try:
                    host, namespace, marker = (folder / OWNER).read_text().split("\n")[:3]
                except (OSError, ValueError):
                    continue
                if [host, namespace] == mine and not owner_alive(marker):
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder)
    removed += _old_unused(config.home() / "tasks")
    return removed


def _old_unused(tasks: Path) -> list[Path]:
    """Remove the earlier versions' task folders in ``tasks`` that no task can still use (see
    the module); returns them."""
    try:
        old = sorted(p for p in tasks.iterdir() if _OLD_SCRATCH.fullmatch(p.name) and p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    cut = time.time() - OLD_QUIET
    quiet = [p for p in old if not _changed_since(p, cut)]
    if not quiet:
        return []
    used = _in_use(tasks, {p.name for p in quiet})
    removed = [p for p in quiet if p.name not in used]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def _changed_since(folder: Path, cut: float) -> bool:
    """Whether the folder or anything in it, at any depth, changed at ``cut`` or later (yes,
    where some of it cannot be read). At any depth: a task that appends to ``logs/train.log``
    changes neither its folder nor ``logs``. (The walk ends at the first change; a folder found
    quiet is walked again by its removal anyway.)"""
    try:
        if folder.lstat().st_mtime >= cut:
            return True
        below = [str(folder)]
        while below:
            with os.scandir(below.pop()) as entries:
                for entry in entries:
                    if entry.stat(follow_symlinks=False).st_mtime >= cut:
                        return True
                    if entry.is_dir(follow_symlinks=False):
                        below.append(entry.path)
    except OSError:
        return True
    return False


def _in_use(tasks: Path, names: set[str]) -> set[str]:
    """Of the folders ``names`` in ``tasks``, those a process this one can read uses: it runs
    their task (``GPULAYER_TASK_ID`` in its environment), or works in them (its working
    directory is in one: an earlier version's forked task set its environment after its exec,
    and the kernel's copy, which is what can be read, is its fork server's)."""
    root = os.path.realpath(tasks)
    used: set[str] = set()
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            task_id = proc.environ().get("GPULAYER_TASK_ID")
            if task_id in names:
                used.add(task_id)
        with contextlib.suppress(psutil.Error, OSError, ValueError):
            inside = os.path.relpath(proc.cwd(), root)
            first = inside.split(os.sep, 1)[0]
            if first in names:
                used.add(first)
    return used
