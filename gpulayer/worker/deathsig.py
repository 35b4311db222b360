"""Starting a task's process so that it dies with its worker (Linux: the parent-death signal).

The parent-death signal is set by util-linux's ``setpriv --pdeathsig KILL``, which the task's
command is exec'd through, so that the task is started with ``vfork`` (Python does so when
there is no ``preexec_fn``): a ``preexec_fn`` makes :mod:`subprocess` ``fork`` the whole worker
(its threads, its memory), which cost a large worker several milliseconds of CPU per task and
up to 15 ms of latency on a loaded machine (see bench/submit_latency.py). Without ``setpriv``
(or when the command cannot be resolved to an executable file, so that the error names the
command as before) the signal is set by a ``preexec_fn`` as before. ``setpriv`` does not check
that the worker is still alive when it sets the signal, as the ``preexec_fn`` does: a worker
killed in that microsecond leaves the task to :func:`gpulayer.worker.process.reap_orphans`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["die_with_parent", "setpriv_path", "spawn_argv"]

_PR_SET_PDEATHSIG = 1
_prctl: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        _prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when the thread that started it
    dies (Linux); None elsewhere. It runs between fork and exec, so it only makes the one
    system call (resolved before the fork) and checks that the parent still lives."""
    if _prctl is None:
        return None
    prctl = _prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the worker died before the call: nobody would end us
            os._exit(137)

    return preexec


_setpriv: list[str | None] = []  # [path or None] once looked up


def setpriv_path() -> str | None:
    """util-linux's ``setpriv`` where it can set the parent-death signal (Linux), else None."""
    if not _setpriv:
        found = shutil.which("setpriv") if _prctl is not None else None
        if found is not None:
            try:  # --pdeathsig came with util-linux 2.33 (2018)
                ok = subprocess.run([found, "--pdeathsig", "KILL", "--", "true"], stdin=subprocess.DEVNULL,
                                    capture_output=True, timeout=10).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                ok = False
            found = found if ok else None
        _setpriv.append(found)
    return _setpriv[0]


def _executable(argv0: str, env: dict[str, str], cwd: str | None) -> str | None:
    """The absolute path exec would run for ``argv0`` (``PATH`` of ``env``, ``cwd`` for a
    relative path), or None when it is not an executable file (or PATH is relative)."""
    if os.sep in argv0:
        path = os.path.join(cwd or os.getcwd(), argv0)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    found = shutil.which(argv0, path=env.get("PATH", os.defpath))
    return found if found is not None and os.path.isabs(found) else None


def spawn_argv(argv: list[str], env: dict[str, str], cwd: str | None) -> tuple[list[str], bool]:
    """The argv to start and whether it still needs the ``preexec_fn`` (see the module doc)."""
    setpriv = setpriv_path()
    exe = _executable(argv[0], env, cwd) if setpriv is not None else None
    if setpriv is None or exe is None:
        return argv, True
    return [setpriv, "--pdeathsig", "KILL", "--", exe, *argv[1:]], False
