"""What a task's processes used (:class:`~gpulayer.records.TaskUsage`): the kernel's own count,
read as the task's main process is reaped with ``wait4``, by its worker (a spawned task) or by
its fork server (a forked one, which sends it with the exit).

That count is the main process's and, added in as each was reaped, that of every process below
it whose parent waited for it: a shell's commands, torchrun's workers, a ``subprocess.run``.
Its peak memory is the largest resident set of one of them, as ``/usr/bin/time`` gives it.
Nothing is sampled while the task runs, so it costs the task nothing.

Linux carries a process's peak across ``exec``: a spawned process is counted from the peak
of the process that forked it as it exec'd, here the worker (50 to 70 MB for ``gpulayer worker
start``; the script's own process for the SDK's in-process worker), whatever the command it
runs. A spawned task whose count did not rise above its worker's own peak, read once the
command was exec'd, is said to have stayed within it (``max_rss_at_most``), not to have used it. A forked task's count starts from its
fork server's resident set, which it maps and uses (the preloads: as if it imported them).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from typing import Any

from gpulayer.records import TaskUsage

__all__ = ["Reaper", "own_peak", "usage_of"]

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
    """This process's peak resident set (bytes): at least what a process it spawned before now
    is counted from (its peak as that process exec'd; it only grows)."""
    return max(0, int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)) * _MAXRSS_UNIT


class Reaper:
    """Finds that a spawned task's main process (this process's child, started with
    ``Popen``) exited, and reaps it with ``wait4``, keeping what it used (``Popen.poll`` or
    ``wait`` would reap it and lose that). ``floor``: :func:`own_peak` once its command was
    exec'd (see :func:`usage_of`).

    ``wait4`` with ``WNOHANG`` both looks and reaps, on every POSIX system: macOS's Python has
    no ``os.waitid``, whose ``WNOWAIT`` looked without reaping, so there ``Popen.poll`` reaped
    every spawned task and none had a count."""

    def __init__(self, popen: subprocess.Popen[bytes], floor: int | None = None) -> None:
        self._popen = popen
        self._floor = floor
        #: what it and the processes it waited for used, once reaped here
        self.usage: TaskUsage | None = None

    def exited(self) -> bool:
        """Whether it exited (reaped now if it did), without waiting."""
        return self._wait(os.WNOHANG)

    def reap(self) -> TaskUsage | None:
        """Wait for it to exit and reap it (where :meth:`exited` did not), setting its
        ``returncode``; what it used (None: it was reaped elsewhere, without it)."""
        self._wait(0)
        return self.usage

    def _wait(self, options: int) -> bool:
        popen = self._popen
        if popen.returncode is not None:
            return True
        try:
            pid, status, rusage = os.wait4(popen.pid, options)
        except ChildProcessError:  # reaped already, not here (a bug elsewhere): Popen says what it can
            return (popen.poll() if options else popen.wait()) is not None
        if pid == 0:
            return False
        popen.returncode = os.waitstatus_to_exitcode(status)
        self.usage = usage_of(rusage, self._floor)
        return True
