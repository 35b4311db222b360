"""How a task ended, as its worker reports it: :class:`TaskOutcome`, and for a FunctionJob
the result or error its function runner wrote (:func:`function_outcome`); and the mark of its
start (:class:`StartMark`)."""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer.api import ResultJSON, TaskAssignment
from gpulayer.errors import AuthError, Conflict, InvalidInput, NotFound
from gpulayer.logtext import escaped_text
from gpulayer.records import MAX_ERROR_MESSAGE, MAX_ERROR_TRACEBACK, MAX_ERROR_TYPE, JobError, TaskState, TaskUsage
from gpulayer.worker.function_runner import RESULT_PREFIX
from gpulayer.worker.process import exit_error

log = logging.getLogger("gpulayer.worker")


@dataclass
class TaskOutcome:
    """How one task ended, as the worker reports it."""

    state: TaskState
    exit_code: int | None = None
    result: Any = None
    error: JobError | None = None
    #: what its processes used, where that was measured (:mod:`.usage`)
    usage: TaskUsage | None = None


#: the control planes (their API objects) that refused a report's usage: from before it
#: (by identity: an embedded :class:`~gpulayer.control.ControlPlane` is not hashable)
_WITHOUT_USAGE: list[weakref.ref[Any]] = []


def finish(api: Any, task_id: str, worker_id: str, outcome: TaskOutcome) -> list[TaskAssignment]:
    """Send the task's final report through ``api`` (a :class:`~gpulayer.api.WorkerAPI`):
    with what it used, or without it to a control plane that refused it (a server from
    before schema 14: ``body.usage: no such field``), which is not sent it again."""
    fields = dict(worker_id=worker_id, state=outcome.state, exit_code=outcome.exit_code, result=outcome.result,
                  error=outcome.error)
    if outcome.usage is not None and not any(ref() is api for ref in _WITHOUT_USAGE):
        try:
            return list(api.finish_task(task_id, usage=outcome.usage, **fields))
        except InvalidInput as exc:
            if "usage" not in str(exc) or "no such field" not in str(exc):
                raise
            _WITHOUT_USAGE.append(weakref.ref(api))
    return list(api.finish_task(task_id, **fields))


def function_outcome(report: TaskOutcome, result_path: Path, python: str | None = None) -> TaskOutcome:
    """A function job's outcome: its process's, with the runner's result or error read in
    (a result as the JSON text the runner wrote: :class:`~gpulayer.api.ResultJSON`). A
    process that failed with no word from the runner is said to have, naming ``python`` (the
    interpreter the job asked for; None: the worker's own, which runs the runner), where its
    own exit says nothing more."""
    try:
        text = result_path.read_text()
        if text.startswith(RESULT_PREFIX) and text.endswith("}"):
            raw = text[len(RESULT_PREFIX):-1]
            report.result = None if raw == "null" else ResultJSON(raw)  # (None: no result, as before)
            return report
        payload = json.loads(text)
    except (OSError, ValueError):
        payload = None
    if isinstance(payload, dict) and payload.get("ok"):
        report.result = payload.get("result")
    elif isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = payload["error"]
        report.state = TaskState.FAILED
        report.error = JobError.raised_by(error_text(err.get("type"))[:MAX_ERROR_TYPE] or "Exception",
                                          _clipped(error_text(err.get("message")), MAX_ERROR_MESSAGE),
                                          _clipped(error_text(err.get("traceback")), MAX_ERROR_TRACEBACK, end=True))
    elif report.state is TaskState.SUCCEEDED:
        report.state = TaskState.FAILED
        report.error = JobError(type="runner", message="the function runner wrote no result")
    elif report.exit_code is not None and 0 < report.exit_code < 128 and (
            report.error is None or report.error.message == exit_error(report.exit_code)):
        # (an exit of its own, no signal: the runner never ran, as with python='/bin/false'
        # or a Python too old to read it, or the function ended its process itself)
        ended = (f"the interpreter {python!r} did not run it (is it a Python 3.10 or newer? its output may say "
                 f"why), or the function ended its process" if python else
                 "the function ended its process (os._exit, or a crash with no Python exception)")
        report.error = JobError(type="runner", message=(
            f"exit code {report.exit_code} before the function runner wrote a result: {ended}"))
    return report


def error_text(value: object) -> str:
    """``value`` as text that can be stored and sent: a lone surrogate (an exception's
    message made from bytes decoded with ``surrogateescape``, or ``'\\udcff'`` itself) as
    its escape, as the job's stderr shows it. A message with one was refused by the
    record, and the task ended as "worker error: ValidationError ..." without it."""
    return escaped_text("" if value is None else str(value))


def _clipped(text: str, limit: int, *, end: bool = False) -> str:
    """``text`` cut to ``limit`` characters, saying so: its start kept (a message), or with
    ``end`` its end (a traceback, whose last lines say what was raised). A message longer
    than the record holds ended the task as "worker error: ValidationError ...", and the
    function's exception was lost."""
    if len(text) <= limit:
        return text
    said = f"... ({len(text)} characters; {'the start' if end else 'the rest'} cut)"
    return said + "\n" + text[len(text) - limit + len(said) + 1:] if end else text[:limit - len(said)] + said


class NotStarted(Exception):
    """The control plane refused the task's start (cancelled, reassigned, unknown);
    ``deleted``: it has no such task any more, its job was deleted."""

    def __init__(self, message: str, *, deleted: bool = False) -> None:
        super().__init__(message)
        self.deleted = deleted


class Deletions:
    """The tasks a worker holds whose job was deleted meanwhile (``gpulayer jobs delete``, a
    prune: the control plane answers "no such task" about them, and only a deletion removes
    a task): each is said once, in one calm line, whichever call finds out first."""

    def __init__(self) -> None:
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def say(self, task_id: str, job_id: str, then: str) -> None:
        """Say (once) that ``task_id``'s job was deleted, and ``then`` what the worker does."""
        with self._lock:
            if task_id in self._said:
                return
            self._said.add(task_id)
        log.info("task %s: job %s was deleted; %s", task_id, job_id, then)

    def said(self, task_id: str) -> bool:
        return task_id in self._said

    def forget(self, task_id: str) -> None:
        """The task is over here."""
        with self._lock:
            self._said.discard(task_id)


class StartMark:
    """Marks one task started in the control plane, once, saying ``how`` it started (the
    ``task_started`` event's message); a refusal raises :class:`NotStarted`."""

    def __init__(self, write: Callable[[str], None], how: str = "spawned") -> None:
        self._write = write
        self.how = how
        self._done = False

    def __call__(self) -> None:
        if self._done:
            return
        try:
            self._write(self.how)
        except (Conflict, NotFound, AuthError) as exc:
            raise NotStarted(str(exc), deleted=isinstance(exc, NotFound)) from exc
        self._done = True
