"""The signals that stop a worker (SIGINT, SIGTERM), heard without taking a lock.

Python runs a signal's handler in the main thread between two of its bytecodes: inside
whatever that thread was doing, with whatever locks it held, and inside the handler of the
signal before (a second SIGTERM, a Ctrl-C that reaches the whole process group and then a
``kill``). A handler that sets a :class:`threading.Event` takes the Event's lock, which is
not reentrant: landing while the main thread held it (setting that Event, waiting on it, or
in that handler's own ``set()``), it waited for itself for ever, and a worker whose tasks had
ended never left. A handler that logs writes to a stream that the main thread may have been
writing to.

So the handler only puts the signal's number in a :class:`queue.SimpleQueue`, whose ``put``
is reentrant (made for this), and a thread of its own acts on each (:meth:`StopSignals.follow`):
it says so and stops the worker.
"""

from __future__ import annotations

import queue
import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["StopSignals"]


class StopSignals:
    """Where a worker's stopping signals go: installed before the worker serves, they wait
    in :attr:`heard` until it follows them."""

    def __init__(self) -> None:
        self.heard: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._following = False

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        self.heard.put(signum)  # (nothing else: see the module's doc)

    def install(self, *signums: signal.Signals) -> None:
        """This process's handler of ``signums`` (from the main thread, as Python requires)."""
        for signum in signums:
            signal.signal(signum, self.handler)

    def follow(self, act: Callable[[int], None]) -> None:
        """Call ``act(signum)`` for each signal heard, those heard already first, in a daemon
        thread of its own (once: a second call changes nothing)."""
        if self._following:
            return
        self._following = True

        def run() -> None:
            while True:
                act(self.heard.get())

        threading.Thread(target=run, name="gpulayer-stop-signals", daemon=True).start()
