"""Deleting ended jobs: by id (``gpulayer jobs delete``), by age (``gpulayer jobs prune``), and
on a schedule where ``GPULAYER_KEEP_JOBS`` is set (:meth:`ControlPlane.delete_jobs`,
:meth:`ControlPlane.prune_jobs`, :func:`when_due`).

A control plane keeps every job it was given, with its output, result and events, until
one of these deletes it; without them a busy home or server database only grows. Only
ended jobs are deleted: a job that is queued or running is left as it is (cancel it first).
A bundle goes once no stored job names it and it was stored :data:`FRESH` seconds ago or
more (after a delete, those the deleted jobs named; after an admin's or an embedded prune,
any bundle stored before the cut that no job names):
a client whose next job reuses a bundle deleted meanwhile uploads it again
(:class:`~gpulayer.errors.BundleMissing`). An admin's or an embedded prune also deletes the
artifacts whose job is gone, which an older GPUlayer left running after an upgrade leaves
when it deletes jobs (:func:`gpulayer.store.retention.delete_artifacts_of_gone_jobs`).

A prune deletes :data:`BATCH` jobs per transaction, and a delete or a prune deletes their
output before them, :data:`LOG_BATCH` chunks per transaction, so the writers' lock is never
held long (a job whose output went may still come back before it goes: one whose task was
lost, when its worker's late report is accepted; it is left, without that output). The
scheduled prune runs on a thread of its own, at most every :data:`EVERY` seconds (or half
of ``GPULAYER_KEEP_JOBS``, where that is shorter), where heartbeats are heard (an embedded
worker's, a server's housekeeping pass).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpulayer import config
from gpulayer.api import JobsDeleted, JobsPruned
from gpulayer.errors import InvalidInput
from gpulayer.records import JobState
from gpulayer.store import queries, retention

if TYPE_CHECKING:
    from gpulayer.control.core import Core

log = logging.getLogger("gpulayer.control")

#: jobs deleted per transaction
BATCH = 500
#: log chunks deleted per transaction (:func:`_delete_output`)
LOG_BATCH = 20_000
#: seconds a bundle is kept after it was stored, named by a job or not: a client uploads it
#: and then submits the job that names it, in two calls; a prune in between deleted it, and
#: after the SDK uploaded it again, a second prune deleted it again before the second submit
FRESH = 600.0
#: seconds between two scheduled prunes of one control plane (``GPULAYER_KEEP_JOBS``)
EVERY = 600.0

_running = threading.Lock()  # (one scheduled prune at a time in a process)


def delete_jobs(plane: Core, job_ids: Sequence[str], owner: str | None) -> JobsDeleted:
    """Delete the ended ones of these jobs (``owner``'s, for a client token), and the
    bundles they named that no stored job names now; see the module."""
    from gpulayer.control.jobs import job_ids_of

    ids = job_ids_of(job_ids, "delete")
    with plane.store.read() as s:
        rows = queries.jobs_by_id(s, ids, light=True)
    found = [j for j in ids if j in rows and (owner is None or rows[j].owner == owner)]
    states = {j: JobState(rows[j].state) for j in found}
    chosen = [j for j in found if states[j].terminal]
    _delete_output(plane, chosen)
    with plane.store.write() as s:
        ended = retention.still_ended(s, chosen)
        left = set(chosen) - set(ended)  # deleted meanwhile, or back from lost (a late report accepted)
        now = queries.jobs_by_id(s, left, light=True) if left else {}
        for j in left:
            if j in now:
                states[j] = JobState(now[j].state)
            else:
                del states[j]
        digests = retention.bundles_of(s, ended)
        retention.delete_jobs(s, ended)
        if digests:
            retention.delete_bundles(s, retention.unused_bundles(s, plane.clock() - FRESH, among=digests))
    return JobsDeleted(deleted=ended, not_ended={j: st for j, st in states.items() if j not in ended})


def prune_jobs(plane: Core, older_than: float, states: Sequence[str] | None, dry_run: bool,
               owner: str | None) -> JobsPruned:
    """Delete the jobs that ended at least ``older_than`` seconds ago (see the module)."""
    chosen = _states(states)
    if not older_than >= 0:  # (nan too)
        raise InvalidInput(f"older_than {older_than!r}: accepted: a number of seconds >= 0")
    now = plane.clock()
    cut = now - older_than
    if dry_run:
        with plane.store.read() as s:
            return JobsPruned(jobs=retention.count_ended_before(s, cut, states=chosen, owner=owner), dry_run=True)
    deleted = 0
    while True:
        with plane.store.read() as s:
            batch = retention.ended_before(s, cut, states=chosen, owner=owner, limit=BATCH)
        _delete_output(plane, batch)
        with plane.store.write() as s:
            ended = retention.still_ended(s, batch)
            retention.delete_jobs(s, ended)
        deleted += len(ended)
        if len(batch) < BATCH:
            break
    bundles: list[str] = []
    if owner is None:  # (a client's prune deletes its jobs; the bundles no job names are the admin's to remove)
        with plane.store.write() as s:
            bundles = retention.unused_bundles(s, min(cut, now - FRESH))
            retention.delete_bundles(s, bundles)
            retention.delete_artifacts_of_gone_jobs(s)  # (an older process's delete left them)
    return JobsPruned(jobs=deleted, bundles=len(bundles))


def _delete_output(plane: Core, job_ids: Sequence[str]) -> None:
    """Delete these ended jobs' output, :data:`LOG_BATCH` chunks a transaction, before the jobs
    themselves go with the rest: a job that prints writes a chunk every 0.1 s (36,000 an
    hour), and one transaction for 500 jobs of 4,000 chunks each held the writers' lock for
    4.4 s (SQLite), as long as every heartbeat and submit waited."""
    while job_ids:
        with plane.store.write() as s:
            if retention.delete_logs(s, job_ids, LOG_BATCH) < LOG_BATCH:
                return


def _states(states: Sequence[str] | None) -> list[str]:
    if states is None:
        return list(retention.ENDED_STATES)
    if isinstance(states, str):
        states = [states]
    wrong = [st for st in states if st not in retention.ENDED_STATES]
    if wrong or not states:
        raise InvalidInput(f"states {list(states)!r}: accepted: one or more of the ended states "
                           f"{', '.join(retention.ENDED_STATES)} (a job that has not ended is never deleted)")
    return list(dict.fromkeys(states))


def when_due(plane: Core) -> None:
    """The scheduled prune of ``GPULAYER_KEEP_JOBS`` (where the control plane runs), on a
    thread of its own, when :data:`EVERY` seconds (or half the time jobs are kept, if that is
    shorter) passed since this control plane's last."""
    keep = config.settings().keep_jobs
    if keep is None:
        return
    now = time.monotonic()
    if now < plane._retention_next or not _running.acquire(blocking=False):
        return
    plane._retention_next = now + min(EVERY, keep / 2)  # (a short keep is kept to, roughly)

    def run() -> None:
        try:
            pruned = prune_jobs(plane, keep, None, False, None)
            if pruned.jobs or pruned.bundles:
                log.info("GPULAYER_KEEP_JOBS: deleted %d job(s) that ended more than %g s ago, and %d bundle(s) "
                         "no job names", pruned.jobs, keep, pruned.bundles)
        except Exception:  # the database may be away for a moment: the next turn tries again
            log.exception("deleting the jobs GPULAYER_KEEP_JOBS no longer keeps failed")
        finally:
            _running.release()

    threading.Thread(target=run, name="gpulayer-retention", daemon=True).start()


__all__ = ["BATCH", "EVERY", "FRESH", "LOG_BATCH", "delete_jobs", "prune_jobs", "when_due"]
