"""What a task's processes used (:class:`~gpulayer.records.TaskUsage`): the kernel's own count,
read as the task's main process is reaped with ``wait4``, by its worker (a spawned task) or by
its fork server (a forked one, which sends it with the exit).

That count is the main process's and, added in as each was reaped, that of every process below
it whose parent waited for it: a shell's commands, torchrun's workers, a ``subprocess.run``.
Its peak memory is the largest resident set of one of them, as ``/usr/bin/time`` gives it.
Nothing is sampled while the task runs, so it costs the task nothing.

Linux carries a process's peak across ``exec``: a spawned process is counted from the peak
of the process that forked it, here the worker (70 MB or so), whatever the command it runs.
A spawned task whose count did not rise above its worker's own peak is said to have stayed
within it (``max_rss_at_most``), not to have used it. A forked task's count starts from its
fork server's resident set, which it maps and uses (the preloads: as if it imported them).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from typing import Any

from gpulayer.records import TaskUsage

__all__ = ["exited", "own_peak", "reap", "usage_of"]

#: ``ru_maxrss`` is in kibibytes on Linux, in bytes on macOS
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


def usage_of(rusage: Any, floor: int | None = None) -> TaskUsage:
    """The record of a ``resource.struct_rusage`` (``os.wait4``'s third value). ``floor``: the
    peak (bytes) of the process that spawned it, from which Linux counts a spawned process's
    peak (it carries the peak across ``exec``): a count that did not rise above it says only
    that the task stayed within it."""
    peak = max(0, int(rusage.ru_maxrss)) * _MAXRSS_UNIT
    known = floor is None or peak > floor
    return TaskUsage(cpu_user=max(0.0, float(rusage.ru_utime)), cpu_system=max(0.0, float(rusage.ru_stime)),
                     max_rss=peak if known else None, max_rss_at_most=None if known else peak)


def own_peak() -> int:
    """This process's peak resident set (bytes): what a process it spawns now is counted from."""
    return max(0, int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)) * _MAXRSS_UNIT


def exited(popen: subprocess.Popen[bytes]) -> bool:
    """Whether ``popen``'s process has exited, without reaping it (``Popen.poll`` would reap
    it, and what it used with it): :func:`reap` reads that as it reaps."""
    if popen.returncode is not None:
        return True
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # (no waitid here: Popen reaps it, and what it used is not known)
        return popen.poll() is not None
    try:
        return waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already (not by us: a bug elsewhere); Popen says what it can
        return popen.poll() is not None


def reap(popen: subprocess.Popen[bytes], floor: int | None = None) -> TaskUsage | None:
    """Wait for ``popen``'s process to exit and reap it, setting its ``returncode``; what it
    and the processes it waited for used (None: it was reaped already, without it).
    ``floor``: :func:`own_peak` as it was spawned (see :func:`usage_of`)."""
    if popen.returncode is not None:
        return None
    try:
        _, status, rusage = os.wait4(popen.pid, 0)
    except ChildProcessError:
        popen.wait()
        return None
    popen.returncode = os.waitstatus_to_exitcode(status)
    return usage_of(rusage, floor)
