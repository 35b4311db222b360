"""Threads a worker reuses: each task runs in a thread of its own, and so does the reader of
its output, but neither is a new thread each time.

A new thread costs its creation (a stack mapped and first touched, a hand-shake with its
starter) on every task; a thread that ran one task and waits for the next costs a queue's
hand-off. :class:`Threads` keeps the threads that finished a call and gives the next call
to one of them, starting a new one only when none is free, so a call never waits behind
another and the threads kept are as many as ran at once at most. They are daemon threads,
as the ones they replace were: a process that exits does not wait for them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpulayer.worker")


class Threads:
    """Runs each call in a thread of its own, reusing the threads that are free."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0  # threads waiting for a call (or about to): each takes the next one
        self._started = 0

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` in a free thread now (a new one if none is free)."""
        with self._lock:
            free = self._free > 0
            if free:
                self._free -= 1
            else:
                self._started += 1
                number = self._started
        self._calls.put((fn, args))
        if not free:
            threading.Thread(target=self._serve, name=f"{self.name}-{number}", daemon=True).start()

    @property
    def started(self) -> int:
        """How many threads were started: at most as many as ran at once, and those that
        were finishing a call (a thread is free once its call returned) when one came."""
        return self._started

    @property
    def free(self) -> int:
        """How many threads wait for a call."""
        with self._lock:
            return self._free

    def _serve(self) -> None:
        while True:
            fn, args = self._calls.get()
            try:
                fn(*args)
            except BaseException:  # the call's own business; this thread serves the next one
                log.exception("%s: a call raised", self.name)
            del fn, args  # (nothing of the call outlives it while this thread waits)
            with self._lock:
                self._free += 1


#: the threads of this process's workers (their tasks, and the readers of their output)
WORKER_THREADS = Threads("gpulayer-worker")


#: how long a stopping worker waits for the control plane to hear that it drains, and that
#: it leaves, before it goes on without (seconds)
LEAVING_WAIT = 5.0


def waited_briefly(what: str, call: Callable[[], None], wait: float = LEAVING_WAIT) -> None:
    """``call()`` in a daemon thread, waited for ``wait`` seconds at most: a stopping worker
    whose control plane is down would otherwise retry each call for
    ``GPULAYER_HTTP_RETRY_SECONDS`` (its grace growing by that much, saying nothing) before
    it drains and before it exits. The call goes on in its thread meanwhile; its own errors
    are its to say."""
    thread = threading.Thread(target=call, name=f"gpulayer-{what.replace(' ', '-')}", daemon=True)
    thread.start()
    thread.join(wait)
    if thread.is_alive():
        log.warning("%s: no answer from the control plane within %g s; going on without it "
                    "(a worker it does not hear from is written off when its heartbeats stop)", what, wait)
