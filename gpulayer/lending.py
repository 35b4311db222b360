"""A task's waits lend its CPU slot (see :mod:`gpulayer.control.lending`).

In a job's own process (the worker sets ``GPULAYER_JOB_ID`` and ``GPULAYER_TASK_ID``), a
wait that blocks (``handle.result()``, ``gl.wait``, ``gl.as_completed``) has the task's CPU
slot lent to the queue while it waits, so that a task waiting for the jobs it submitted
does not keep them from running, and taken back when it ends.

The calls to the control plane are made by one thread of the process (the lender), never by
the waits themselves: a wait's time is not spent lending, and a slow or failing control
plane never holds a wait up. A wait asks for the slot to be lent only after
:data:`GRACE` seconds (a wait that ends sooner, one for a job that has ended already, lends
nothing and starts nobody else's job); the lender lends while any wait of the process asks,
and takes the slot back when none does. A control plane that refuses (an older server that
has no such call, a token that did not submit the task's job) is not asked again through
that client, and its waits keep the slot as before; a task that holds devices lends nothing,
which is remembered too. A call that fails otherwise (the server unreachable) is tried again
a second later, while it is still wanted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpulayer.errors import AuthError, MethodNotAllowed, NotFound

if TYPE_CHECKING:
    from gpulayer.client import Client

__all__ = ["GRACE", "lent_while_waiting"]

log = logging.getLogger(__name__)

#: how long a wait goes on before the slot is lent (seconds)
GRACE = 0.05
#: how long the lender waits to try a failed call again (seconds)
RETRY = 1.0
#: what a control plane's refusal of ``lend_slot`` looks like: it will refuse again
_REFUSALS = (NotFound, MethodNotAllowed, AuthError)


class _Lender:
    """The process's lending: what its waits want, what the control plane was told."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.wanted: dict[int, tuple[float, Client]] = {}  # wait -> (when it wants the slot lent, its client)
        self.lent: Client | None = None  # the client the slot is lent through, while it is
        #: the clients whose control plane said no (or: nothing to lend); weakly, as a client
        #: made later may have a dead one's id
        self.refused: weakref.WeakSet[Client] = weakref.WeakSet()
        self.thread: threading.Thread | None = None
        self.next_wait = 0

    def begin(self, client: Client) -> int | None:
        if client in self.refused:
            return None
        with self.cond:
            self.next_wait += 1
            self.wanted[self.next_wait] = (time.monotonic() + GRACE, client)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="gpulayer-lender", daemon=True)
                self.thread.start()
            self.cond.notify_all()
            return self.next_wait

    def end(self, wait: int | None) -> None:
        if wait is None:
            return
        with self.cond:
            self.wanted.pop(wait, None)
            self.cond.notify_all()

    def _due(self, now: float) -> tuple[Client | None, float | None]:
        """The client of a wait whose grace is over (None: none), and when the next one's ends."""
        due = [c for at, c in self.wanted.values() if at <= now and c not in self.refused]
        later = [at for at, c in self.wanted.values() if at > now and c not in self.refused]
        return (due[0] if due else None), (min(later) if later else None)

    def _run(self) -> None:
        task = (os.environ.get("GPULAYER_JOB_ID", ""), os.environ.get("GPULAYER_TASK_ID", ""))
        retry_at = 0.0
        while True:
            with self.cond:
                while True:
                    now = time.monotonic()
                    client, next_at = self._due(now)
                    change = (client is not None) != (self.lent is not None)
                    if change and now >= retry_at:
                        break
                    wake = [t for t in (next_at, retry_at if change else None) if t is not None]
                    self.cond.wait(max(0.0, min(wake) - now) if wake else None)
                lend_through = client if self.lent is None else self.lent
            assert lend_through is not None
            lent = self._call(lend_through, task, self.lent is None)
            with self.cond:
                if lent is None:
                    retry_at = time.monotonic() + RETRY
                else:
                    self.lent = lend_through if lent else None
                    retry_at = 0.0

    def _call(self, client: Client, task: tuple[str, str], lend: bool) -> bool | None:
        """Lend (``lend``) or take back the slot through ``client``: whether it is lent now,
        None when the control plane could not be told (to be tried again)."""
        try:
            lent = client.api.lend_slot(task[0], task_id=task[1], lent=lend).lent
        except _REFUSALS as exc:  # (it will refuse again: not asked again through this client)
            log.debug("the control plane does not lend task %s's slot: %s", task[1], exc)
            self.refused.add(client)
            return False
        except Exception as exc:  # (unreachable, a database error: tried again while it is wanted)
            log.debug("could not %s task %s's slot: %s", "lend" if lend else "take back", task[1], exc)
            return None
        if lend and not lent:  # (it holds devices, or has ended, or lending is off: nothing to lend)
            self.refused.add(client)
        return lent


_lender = _Lender()


def _forked() -> None:
    global _lender
    _lender = _Lender()  # (the child has no lender thread, and may have been forked mid-call)


os.register_at_fork(after_in_child=_forked)


def _in_task() -> bool:
    return bool(os.environ.get("GPULAYER_JOB_ID") and os.environ.get("GPULAYER_TASK_ID"))


@contextlib.contextmanager
def lent_while_waiting(client: Client, timeout: float | None) -> Iterator[None]:
    """Around a wait through ``client`` of up to ``timeout`` seconds (None: no limit): in a
    task, its CPU slot is lent while the wait goes on past :data:`GRACE` (see the module)."""
    if timeout == 0 or not _in_task():
        yield
        return
    lender = _lender
    wait = lender.begin(client)
    try:
        yield
    finally:
        lender.end(wait)

