"""A task's waits lend its CPU slot (see :mod:`gpulayer.control.lending`).

In a job's own process (the worker sets ``GPULAYER_JOB_ID`` and ``GPULAYER_TASK_ID``), a
wait that may block (``handle.result()``, ``gl.wait``, ``gl.as_completed``) tells the
control plane first that the task lends its CPU slot to the queue, and takes it back when
the wait returns or raises, so that a task waiting for the jobs it submitted does not keep
them from running. Threads of one process share the lending: the first wait lends, the
last one to end takes the slot back.

Best effort: a control plane that refuses (an older server that has no such call, a token
that did not submit the task's job) is not asked again by this process, and its waits keep
the slot as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpulayer.errors import GpulayerError

if TYPE_CHECKING:
    from gpulayer.client import Client

__all__ = ["lent_while_waiting"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_waits = 0  # waits of this process under way
_lent: Client | None = None  # the client the slot was lent through, while it is
_refused = False  # the control plane said no once: do not ask again


def _task() -> tuple[str, str] | None:
    job_id, task_id = os.environ.get("GPULAYER_JOB_ID"), os.environ.get("GPULAYER_TASK_ID")
    return (job_id, task_id) if job_id and task_id else None


def _lend(client: Client, job_id: str, task_id: str, lent: bool) -> bool:
    global _refused
    try:
        return client.api.lend_slot(job_id, task_id=task_id, lent=lent).lent
    except GpulayerError as exc:  # (an older server: no such route; another token's job: not found)
        log.debug("the control plane did not %s task %s's slot: %s", "lend" if lent else "return", task_id, exc)
        _refused = True
        return False


@contextlib.contextmanager
def lent_while_waiting(client: Client, timeout: float | None) -> Iterator[None]:
    """Around a wait through ``client`` of up to ``timeout`` seconds (None: no limit): in a
    task, its CPU slot is lent for the wait (a wait of 0 s lends nothing)."""
    global _waits, _lent
    task = _task()
    if task is None or _refused or timeout == 0:
        yield
        return
    with _lock:
        _waits += 1
        if _waits == 1 and _lent is None and _lend(client, *task, True):
            _lent = client
    try:
        yield
    finally:
        with _lock:
            _waits -= 1
            if _waits == 0 and _lent is not None:
                lender, _lent = _lent, None
                _lend(lender, *task, False)
