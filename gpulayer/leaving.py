"""What a process does with the jobs it submitted as it ends (see :mod:`gpulayer.client`).

* A process that runs a worker of its own (embedded) waits for its local jobs at a normal
  exit (Ctrl-C during the wait cancels them) and cancels them on SIGTERM.
* A job's own process (a task: ``GPULAYER_TASK_ID`` is set) that submitted jobs cancels
  them when SIGTERM ends it because its job was cancelled: the jobs it started do not run on
  for a job that is gone ("cancelled: the job that submitted it was cancelled"), newest first,
  in the signal's handler (not at exit, which would wait for the task's other threads while
  the worker's grace runs out). A task ended for another reason (its timeout, its group's
  end, its worker stopping: a job that may run again) and one whose function returned leave
  them running.

Only where the program has no SIGTERM handler of its own, and only from the main thread
(where Python delivers signals).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpulayer.api import MAX_BATCH
from gpulayer.errors import GpulayerError

if TYPE_CHECKING:
    from gpulayer.client import Client
    from gpulayer.records import JobRecord

__all__ = ["at_exit", "end_on_sigterm", "in_task", "submitted"]

#: why a task's jobs are cancelled when its job was
TASK_ENDED = "the job that submitted it was cancelled"
#: how long the SIGTERM handler of a task waits for their cancel (a cancel's grace is 1 s)
TASK_CANCEL_WAIT = 0.7

#: the clients that want to hear of SIGTERM: those running a worker in this process, and
#: those that submitted jobs from a task
_clients: list[Client] = []
_handler: list[Any] = []  # the handler, once installed


def in_task() -> bool:
    """Whether this process runs a job's task (the worker sets ``GPULAYER_TASK_ID``)."""
    return bool(os.environ.get("GPULAYER_TASK_ID"))


def submitted(client: Client, job_ids: Sequence[str]) -> None:
    """Note jobs ``client`` submitted; in a task, arrange for them to be cancelled with its
    job (the handler is installed from the main thread, at the first submit made there)."""
    client._submitted += job_ids
    if in_task() and job_ids:
        client._task_exit_set = True
        end_on_sigterm(client)


#: whether the jobs of a cancelled task were looked at (in the handler, else at exit)
_task_done = threading.Event()


def _cancel_in_task() -> None:
    """SIGTERM in a task: if its job was cancelled, cancel the jobs this process submitted."""
    job_id = os.environ.get("GPULAYER_JOB_ID")
    tasked = [c for c in _clients if c._task_exit_set and c._submitted]
    if _task_done.is_set() or not job_id or not tasked:
        return
    try:
        cancelled = tasked[0].job(job_id, brief=True).cancel_requested
    except GpulayerError:
        return
    if cancelled:
        for client in tasked:
            cancel_all(client, list(dict.fromkeys(reversed(client._submitted))), TASK_ENDED)
    _task_done.set()


def _cancel_in_task_now() -> None:
    """In the handler: at once, in a thread of its own (the main thread may hold what the
    calls need), waited for a moment; what it did not finish is done at exit."""
    thread = threading.Thread(target=_cancel_in_task, name="gpulayer-task-ended", daemon=True)
    thread.start()
    thread.join(TASK_CANCEL_WAIT)


def unfinished(client: Client) -> list[JobRecord]:
    """The jobs ``client``'s process submitted that have not ended (brief records: a state,
    an id), read a batch at a time (embedded only)."""
    if client.control is None:
        return []
    ids = list(client._submitted)
    jobs: list[JobRecord] = []
    for i in range(0, len(ids), MAX_BATCH):
        chunk = ids[i:i + MAX_BATCH]
        try:
            records = client.control.records_of(chunk, brief=True)
        except GpulayerError:  # one is gone (a home wiped meanwhile): the others, one by one
            records = []
            for job_id in chunk:
                try:
                    records.append(client.control.get_job(job_id, brief=True))
                except GpulayerError:
                    continue
        jobs += [job for job in records if not job.state.terminal]
    return jobs


def at_exit(client: Client) -> None:
    """The process is ending: wait for (or, after SIGTERM, cancel) the local jobs it
    submitted, then stop its worker."""
    if client._agent is None:
        return
    pending = unfinished(client)
    if pending and client._terminating:
        cancel_all(client, [j.id for j in pending], "the process that submitted it received SIGTERM")
    elif pending:
        shown = ", ".join(f"{j.id} ({'cancelling' if j.cancel_requested else j.state.value})" for j in pending[:5])
        more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
        # (a job cancelled already, as a foreground submit's Ctrl-C does, only has its process to end)
        ask = "" if all(j.cancel_requested for j in pending) else "; press Ctrl-C to cancel them"
        sys.stderr.write(f"gpulayer: waiting for {len(pending)} job(s) this process submitted to end: "
                         f"{shown}{more}{ask}\n")
        sys.stderr.flush()
        try:
            for job in pending:
                client.wait(job.id)
        except KeyboardInterrupt:
            cancel_all(client, [j.id for j in unfinished(client)],
                       "the process that submitted it was interrupted while waiting for it at exit")
        except SystemExit as exc:  # SIGTERM while waiting here (see end_on_sigterm)
            cancel_all(client, [j.id for j in unfinished(client)], "the process that submitted it received SIGTERM")
            client._stop_agent()
            sys.stderr.flush()
            # atexit cannot change the exit status by raising: end with SIGTERM's as the
            # default handler would have (other atexit handlers are skipped, as they are then)
            os._exit(exc.code if isinstance(exc.code, int) else 143)
    client._stop_agent()


def cancel_all(client: Client, job_ids: list[str], reason: str) -> None:
    """Cancel ``job_ids`` with ``reason`` (those ended already are left as they are), saying
    so on stderr."""
    if not job_ids:
        return
    if client.control is not None:
        for i in range(0, len(job_ids), MAX_BATCH):  # (one transaction a batch: see cancel_jobs)
            # one placement pass, after the last: a pass between two would start the jobs
            # of the next batch on this process's worker, to end them at once
            client.control.cancel_many(job_ids[i:i + MAX_BATCH], reason=reason,
                                       place=i + MAX_BATCH >= len(job_ids))
    else:
        try:
            client.cancel_jobs(job_ids, reason)
        except GpulayerError as exc:  # (the server unreachable: they run on, as said)
            sys.stderr.write(f"gpulayer: could not cancel {len(job_ids)} job(s) ({exc}): {reason}\n")
            return
    sys.stderr.write(f"gpulayer: cancelled {len(job_ids)} job(s): {reason}\n")
    sys.stderr.flush()


def end_on_sigterm(client: Client) -> None:
    """SIGTERM (by default: die at once, skipping atexit) ends this process's jobs first.

    Only when the program has not chosen a SIGTERM handler of its own, and only from the
    main thread (where Python delivers signals): from another, the handler is installed at
    a later call of the SDK from the main thread (:func:`on_main_thread`)."""
    if client not in _clients:
        _clients.append(client)
    on_main_thread()


def on_main_thread() -> None:
    """Install the SIGTERM handler of :func:`end_on_sigterm` if a client wants it and this is
    the main thread. Called by the SDK's waits and submits too: a program whose first submit
    ran in another thread (a pool's) gets it at its next call from the main thread (the
    ``.result()`` it waits in), rather than dying at SIGTERM with its jobs left ``running``
    (lost, then retried, once another process opens the home)."""
    if _handler or not _clients or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        if in_task():
            _cancel_in_task_now()
        for c in _clients:
            c._terminating = True
        raise SystemExit(128 + signum)  # unwinds, runs atexit: a script's local jobs are cancelled

    signal.signal(signal.SIGTERM, on_sigterm)
    _handler.append(on_sigterm)
    if in_task():
        atexit.register(_cancel_in_task)  # (what the handler's moment did not finish)

