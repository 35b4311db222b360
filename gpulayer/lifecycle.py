"""The job and task state machine, as pure functions: no I/O, no clock, no database.

A job's state is derived from its current attempt's tasks (one task per node)::

    queued --placed--> assigned --a node starts--> running --all nodes succeed--> succeeded
       ^                                              |
       |                      one node fails, is lost, times out or is cancelled:
       |                      the nodes that never started are cancelled here; the running
       |                      ones stay running until their workers end them; then
       +---- failed or lost, retries left <-----------+--> failed / timed_out / cancelled

Rules:

* One group, one fate: the job's end is decided only once no node of the attempt still
  runs, from the root cause: the node that ended badly first and was not cancelled because
  of another (its error is the job's, and so is its exit code when the job ends with it;
  the control plane adds which node and worker it was, for a group of several).
* A failed or lost attempt is retried while the job has attempts left (``attempt <
  max_attempts``); a timed-out or cancelled one is not. A cancel request always wins, and
  its reason (stored with the request) is the job's error.
* A task lost before it ever started does not spend the job's retry budget
  (:func:`release_unstarted`).
* A task is lost when its worker went silent, but the worker may only have been cut off
  (a server restart, a network partition) and still finish it: its final report is accepted
  as long as no newer attempt superseded the lost one (:func:`late_report_accepted`), so a
  command that ran once and exited 0 does not end ``lost`` or run twice; but not a report
  that it was cancelled, which only says its worker ended it when told it was lost.
* A task the job no longer wants (its job ended, was cancelled, moved to a newer attempt,
  or another node of its attempt ended badly) must be ended by its worker
  (:func:`must_end`).

:mod:`gpulayer.control` loads the rows, calls these, and writes what they decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpulayer.records import JobError, JobState, TaskState

__all__ = ["JobView", "Settlement", "TaskView", "ended_with_its_group", "late_report_accepted", "must_end",
           "release_unstarted", "root_cause", "settle"]

ENDED_BADLY = frozenset({TaskState.FAILED, TaskState.TIMED_OUT, TaskState.LOST, TaskState.CANCELLED})
#: what a job becomes when its root-cause task ended this way and no retry applies
_FINAL = {TaskState.FAILED: JobState.FAILED, TaskState.LOST: JobState.FAILED,
          TaskState.TIMED_OUT: JobState.TIMED_OUT, TaskState.CANCELLED: JobState.CANCELLED}


@dataclass(frozen=True)
class JobView:
    state: JobState
    attempt: int
    max_attempts: int
    cancel_requested: bool = False
    #: the job's stored error; a cancel request stores its reason here
    error: JobError | None = None


@dataclass(frozen=True)
class TaskView:
    id: str
    state: TaskState
    error: JobError | None = None
    #: when it ended (None: it has not, or the record does not say); orders the root cause
    ended_at: float | None = None


@dataclass
class Settlement:
    """What :func:`settle` decided. ``state`` None: leave the job as it is."""

    state: JobState | None = None
    #: the job's error after this (only meaningful when ``state`` is set)
    error: JobError | None = None
    #: unstarted tasks of the attempt to cancel now (another node ended badly)
    cancel: list[str] = field(default_factory=list)
    #: the job goes back to the queue for a new attempt; ``note`` says why
    retry: bool = False
    note: str = ""
    #: the task whose end decided a bad end (its exit code is the job's when the job ends)
    root: str | None = None


#: why the unstarted nodes of a group that ended badly are cancelled
OTHER_NODE_ENDED = "another node of the job ended"


def settle(job: JobView, tasks: Sequence[TaskView]) -> Settlement:
    """The job's state from its current attempt's ``tasks`` (in node order)."""
    if job.state.terminal or job.state is JobState.QUEUED or not tasks:
        return Settlement()
    bad = [t for t in tasks if t.state in ENDED_BADLY]
    if not bad:
        if all(t.state is TaskState.SUCCEEDED for t in tasks):
            return Settlement(state=JobState.SUCCEEDED, error=None)
        if any(t.state is TaskState.RUNNING or t.state.terminal for t in tasks):
            return Settlement(state=JobState.RUNNING)
        return Settlement(state=JobState.ASSIGNED)

    out = Settlement(cancel=[t.id for t in tasks if t.state is TaskState.ASSIGNED])
    if any(t.state is TaskState.RUNNING for t in tasks):
        out.state = JobState.RUNNING  # the rest of the group is being ended by its workers
        return out
    root = root_cause(bad)
    out.root, error = root.id, root.error
    if job.cancel_requested:
        # the reason the cancel request stored, if it gave one
        reason = job.error if job.error is not None and job.error.type == "cancelled" else None
        out.state, out.error = JobState.CANCELLED, reason or JobError.cancelled()
    elif root.state in (TaskState.FAILED, TaskState.LOST) and job.attempt < job.max_attempts:
        out.state, out.error, out.retry = JobState.QUEUED, error, True
        out.note = f"attempt {job.attempt} {root.state.value}; {job.max_attempts - job.attempt} left"
    else:
        out.state = _FINAL[root.state]
        if root.state is TaskState.LOST:
            error = JobError.lost(error.message if error and error.message else "worker lost")
        out.error = error
    return out


def root_cause(bad: Sequence[TaskView]) -> TaskView:
    """Of the tasks of an attempt that ended badly (in node order), the one the attempt
    ended because of: the first to end that was not cancelled (a node cancelled with its
    group ended because of another; a node whose peer died may fail a moment after it, so
    time, not node order, names the cause). All cancelled: the first of them."""
    causes = [t for t in bad if t.state is not TaskState.CANCELLED]
    if not causes:
        return bad[0]
    return min(causes, key=lambda t: float("inf") if t.ended_at is None else t.ended_at)


def ended_with_its_group(job: JobView, attempt: int, others: Sequence[TaskState]) -> bool:
    """Whether a node its worker ended (reported cancelled) was ended because another node
    of its attempt, in ``others``, ended badly, and not because the job was cancelled or
    moved on to a newer attempt."""
    return (not job.cancel_requested and attempt == job.attempt
            and any(st in ENDED_BADLY and st is not TaskState.CANCELLED for st in others))


def late_report_accepted(job: JobView, task_attempt: int, reported: TaskState) -> bool:
    """Whether a final report (``reported``) for a task of ``task_attempt`` that was marked
    lost still counts: the job has not moved on to a newer attempt (it waits to be placed
    again, or it ended because of the loss). A ``cancelled`` report never does: nobody
    cancelled the task (a cancel of its job ends the job), its worker ended it because the
    control plane said the job no longer wants it (:func:`must_end`: it is lost), and that is
    no outcome of the task's: the loss stands, and the job is retried as it allows."""
    if task_attempt != job.attempt or reported is TaskState.CANCELLED:
        return False
    if job.state is JobState.QUEUED:
        return True
    return job.state.terminal and job.error is not None and job.error.type == "lost"


def release_unstarted(job: JobView) -> int:
    """The job's ``max_attempts`` after one of its tasks was lost before it started: the
    attempt is given back, so a task that never ran costs no retry."""
    return job.max_attempts + 1 if not job.state.terminal else job.max_attempts


def must_end(*, task_state: TaskState, owner: str, reporter: str, attempt: int,
             job_state: JobState | None, job_attempt: int | None, cancel_requested: bool,
             attempt_ended_badly: bool) -> bool:
    """Whether the worker ``reporter``, which says it runs this task, must end it now."""
    return (task_state.terminal or owner != reporter or cancel_requested
            or job_state not in (JobState.ASSIGNED, JobState.RUNNING)
            or attempt != job_attempt or attempt_ended_badly)
