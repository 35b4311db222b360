"""Wake-ups for a thread that waits on a task's process: a cancel flag that interrupts the
wait, and a waiter that sleeps until the process exits, the flag is set, or a timeout."""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
import time
from collections.abc import Callable

__all__ = ["Cancel", "ExitWaiter"]

#: the longest one wait sleeps; a caller with a later deadline waits again (a select's timeout
#: is a C int of milliseconds: a task's ``timeout`` of 25 days or more overflowed it, and the
#: task failed at once with "worker error: OverflowError: timeout is too large")
MAX_WAIT = 3600.0


class Cancel(threading.Event):
    """A cancel flag that also wakes a waiting :func:`~gpulayer.worker.process.run_process` at once.

    A plain :class:`threading.Event` works too, but is only looked at every few
    milliseconds; this one interrupts the wait, so a cancel ends the tree without delay."""

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[Callable[[], None]] = []
        self._hooks_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._hooks_lock:
            hooks = list(self._hooks)
        for hook in hooks:
            hook()

    def on_set(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook`` (from the setting thread) when set; returns what unregisters it."""
        with self._hooks_lock:
            self._hooks.append(hook)

        def remove() -> None:
            with self._hooks_lock, contextlib.suppress(ValueError):
                self._hooks.remove(hook)

        return remove


class ExitWaiter:
    """Sleeps until a process exits, a :class:`Cancel` is set, or a timeout passes.

    Linux: a pidfd (readable once the process exited; or ``exited``, set by whoever learns
    of the exit, for a process that is not our child) and a wake-up pipe in one select, so
    an exit or a cancel is noticed in microseconds rather than at the next poll. Elsewhere
    (or with a plain Event) it falls back to short sleeps that grow to 50 ms."""

    def __init__(self, pid: int, cancel: threading.Event | None, exited: Cancel | None = None) -> None:
        self._sel: selectors.BaseSelector | None = None
        self._fds: list[int] = []
        self._unhooks: list[Callable[[], None]] = []
        self._interval = 0.001
        self._cancel = cancel
        self._plain_cancel = False
        hooked = [e for e in (cancel, exited) if isinstance(e, Cancel)]
        pidfd_open = getattr(os, "pidfd_open", None)
        if exited is None:
            if pidfd_open is None:
                return
            try:
                pidfd = pidfd_open(pid)
            except OSError:  # an old kernel, or the process is already gone and reaped
                return
            self._fds.append(pidfd)
        self._sel = selectors.DefaultSelector()
        for fd in self._fds:
            self._sel.register(fd, selectors.EVENT_READ)
        if hooked:
            r, w = os.pipe()
            os.set_blocking(w, False)
            self._fds += [r, w]
            self._sel.register(r, selectors.EVENT_READ)

            def wake() -> None:
                with contextlib.suppress(OSError):
                    os.write(w, b"x")

            for event in hooked:
                self._unhooks.append(event.on_set(wake))
                if event.is_set():
                    wake()
        self._plain_cancel = cancel is not None and not isinstance(cancel, Cancel)

    def __enter__(self) -> ExitWaiter:
        return self

    def __exit__(self, *exc: object) -> None:
        for unhook in self._unhooks:
            unhook()
        if self._sel is not None:
            self._sel.close()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def wait(self, timeout: float | None) -> None:
        """Sleep until the process exits, the cancel is set, or ``timeout`` seconds passed (at
        most :data:`MAX_WAIT`: the caller looks at its deadline and waits again)."""
        timeout = None if timeout is None else min(timeout, MAX_WAIT)
        if self._sel is not None:
            if self._plain_cancel:  # a plain Event: look again soon
                timeout = 0.01 if timeout is None else min(timeout, 0.01)
            self._sel.select(timeout)
            return
        wait = self._interval if timeout is None else min(self._interval, timeout)
        if self._cancel is not None:
            self._cancel.wait(wait)
        else:
            time.sleep(wait)
        self._interval = min(self._interval * 2, 0.05)
