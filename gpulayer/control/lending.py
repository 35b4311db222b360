"""A waiting task's CPU slot, lent to the queue (:meth:`ControlPlane.lend_slot`).

A task that waits for jobs (the jobs it submitted, usually: ``inner.remote(x).result()`` in
a ``@gl.remote`` function) holds a CPU slot it does not use; with as many such waits as
slots, the jobs they wait for would queue behind them for ever. So, as Ray does for a task
blocked in ``ray.get``, the task's process lends its slot while it waits (the SDK's waits do
it: :mod:`gpulayer.lending`) and takes it back when the wait ends. A lent task holds nothing a
placement pass counts (``gl_tasks.lent``, schema 9; the change marks follow it), so the
pass that lends the slot may place a queued job there; taking it back may leave the worker
over its slots until a task ends, and no new CPU job is placed there until then. A task
that holds devices keeps them and lends nothing; with ``GPULAYER_SLOT_LENDING=off`` (where
the control plane runs) no task lends anything.

A lending is trusted as a slot is: nothing checks that the task waits (its process says
so), just as nothing checks that a task uses one CPU.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from gpulayer import config
from gpulayer.api import SlotLent
from gpulayer.store import plain, queries

if TYPE_CHECKING:
    from gpulayer.control import ControlPlane


def lend_slot(plane: ControlPlane, job_id: str, task_id: str, lent: bool) -> SlotLent:
    """Lend (``lent``) or take back the CPU slot of ``job_id``'s task ``task_id``: see the
    module. Lending runs a placement pass in the same transaction. A task of another job is
    :class:`~gpulayer.errors.NotFound`, as an unknown one is."""
    started = time.perf_counter()
    result = None
    with plane.store.write() as s:
        task = plain.find_task(s, task_id)
        if task is None or task.job_id != job_id:
            raise plain.not_found("task", task_id)
        can = (task.state in queries.ACTIVE_TASK_STATES and not json.loads(task.devices)
               and config.settings().slot_lending == "on")
        now = lent and can
        changed = plain.set_task_lent(s, task_id, now)
        if changed and now:  # (room came: the head of the queue, as after a task's end)
            result = plane._place_too(s, until_full=True)
    if result is not None:
        plane._placed(result, started)
    elif changed:
        plane._changed()  # (what a worker's slots hold changed: its pages, its waits)
    return SlotLent(lent=now)


__all__ = ["lend_slot"]
