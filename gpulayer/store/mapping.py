"""Rows to records: the one place that turns what the tables hold into API records.

JSON-shaped columns (capabilities, specs, decisions, errors) hold JSON that the pydantic
records validate on the way out. A column written by an older GPUlayer, or damaged, must
never make a read fail for good: :func:`error_of` and :func:`decision_of` turn what they cannot
read into a record that says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gpulayer.api import JobEvent, LogChunk, ResultJSON, TokenInfo
from gpulayer.hookrecords import Capabilities, Rendezvous
from gpulayer.logtext import log_text
from gpulayer.records import (
    JobError,
    JobRecord,
    JobState,
    MachineRecord,
    PlacementDecision,
    TaskRecord,
    TaskState,
    TaskUsage,
    WorkerRecord,
)
from gpulayer.specs import CHECKED, JobSpec
from gpulayer.store import plain
from gpulayer.store.queries import ACTIVE_TASK_STATES
from gpulayer.store.tables import EventRow, JobRow, MachineRow, TaskRow, TokenRow, WorkerRow

SPEC: TypeAdapter[Any] = TypeAdapter(JobSpec)


def spec(raw: str) -> Any:
    """A stored spec (its arguments were checked at submit: :data:`~gpulayer.specs.CHECKED`)."""
    return SPEC.validate_json(raw, context=CHECKED)


def stored_spec(spec_: Any, args: str | None) -> str:
    """The ``spec`` column of a job spec: a function job's arguments apart, in the ``args``
    column (``args``: :func:`arguments_json` of them, None when there are none)."""
    if args is None:
        return spec_.model_dump_json()  # type: ignore[no-any-return]
    return spec_.model_copy(update={"args": [], "kwargs": {}}).model_dump_json()  # type: ignore[no-any-return]


def arguments_json(args: list[Any], kwargs: dict[str, Any]) -> str:
    """The ``args`` column of a function job's arguments."""
    return json.dumps({"args": args, "kwargs": kwargs})


def job_spec(row: JobRow | plain.Job) -> Any:
    """The whole spec of a stored job (arguments put back)."""
    return spec_with_args(row.spec, row.args)


def spec_with_args(stored: str, args: str | None) -> Any:
    """A spec from its columns (see :func:`stored_spec`)."""
    if not args:
        return spec(stored)
    data = json.loads(stored)
    data.update(json.loads(args))
    return SPEC.validate_python(data, context=CHECKED)


def worker_spec(stored: str, args: str | None) -> Any:
    """:func:`spec_with_args` as a worker is handed it: without the jobs it runs after, which
    the control plane resolved before it placed the job (a worker from before schema 11,
    which has no such fields, refuses a spec with them: every poll that handed it one failed)."""
    spec_ = spec_with_args(stored, args)
    if spec_.after or spec_.after_ended:
        return spec_.model_copy(update={"after": [], "after_ended": []})  # (empty: not written)
    return spec_


def _without_arguments(spec_: Any) -> Any:
    """(A job stored before the arguments had a column of their own has them in its spec.)"""
    if spec_.kind == "function" and (spec_.args or spec_.kwargs):
        return spec_.model_copy(update={"args": [], "kwargs": {}})
    return spec_


def error_of(raw: str | None) -> JobError | None:
    if not raw:
        return None
    try:
        return JobError.model_validate_json(raw)
    except ValidationError:
        return JobError(type="unreadable", message=f"the stored error could not be read: {raw[:200]!r}")


def decision_of(raw: str | None) -> PlacementDecision | None:
    if not raw:
        return None
    try:
        return PlacementDecision.model_validate_json(raw)
    except ValidationError:
        return None


def task_record(t: TaskRow | plain.Task) -> TaskRecord:
    return TaskRecord(
        id=t.id, job_id=t.job_id, attempt=t.attempt, node_rank=t.node_rank, worker_id=t.worker_id,
        devices=json.loads(t.devices), accelerator=t.accelerator, state=TaskState(t.state),
        created_at=t.created_at, started_at=t.started_at, ended_at=t.ended_at, exit_code=t.exit_code,
        error=error_of(t.error),
        rendezvous=Rendezvous.model_validate_json(t.rendezvous) if t.rendezvous else None,
        lent=bool(t.lent) and t.state in ACTIVE_TASK_STATES,  # (an ended task holds nothing either way)
        usage=usage_of(t.usage),
    )


def usage_of(raw: str | None) -> TaskUsage | None:
    if not raw:
        return None
    try:
        return TaskUsage.model_validate_json(raw)
    except ValidationError:  # (written by this module's writer: not expected)
        return None


def job_record(row: JobRow | plain.Job, tasks: Sequence[TaskRow | plain.Task] | None = None, *,
               result: bool = True, arguments: bool = True, as_text: bool = False) -> JobRecord:
    """The job's record; without its ``result`` (``None``) or a function's ``arguments``
    (``args`` and ``kwargs`` empty), neither parsed (the caller need not read the column), as
    a list of jobs gives it; with ``as_text``, the result as its stored JSON text
    (:class:`~gpulayer.wire.ResultJSON`), not parsed."""
    stored = row.result if result else None
    return JobRecord.model_validate(dict(
        id=row.id, spec=job_spec(row) if arguments else _without_arguments(spec(row.spec)), state=JobState(row.state),
        created_at=row.created_at,
        updated_at=row.updated_at, attempt=row.attempt, exit_code=row.exit_code,
        result=(ResultJSON(stored) if as_text else json.loads(stored)) if stored else None,
        error=error_of(row.error),
        decision=decision_of(row.decision), cancel_requested=row.cancel_requested,
        tasks=[task_record(t) for t in tasks or []],
    ), context=CHECKED)  # (the spec's arguments are not checked again: see CHECKED)


def worker_record(row: WorkerRow | dict[str, Any]) -> WorkerRecord:
    """A worker's record from its row, or from some of its columns by name (those missing,
    such as ``last_heartbeat``, get the record's defaults)."""
    cols = row if isinstance(row, dict) else row.model_dump()
    return WorkerRecord(
        **{k: cols[k] for k in _WORKER_FIELDS if k in cols},
        capabilities=Capabilities.model_validate_json(cols["capabilities"]),
    )


_WORKER_FIELDS = ("id", "name", "origin", "cpu_slots", "online", "draining", "last_heartbeat", "registered_at", "pid",
                  "paused")


def log_chunk(r: tuple[int, str, int, str, str, float]) -> LogChunk:
    """A stored chunk, ``(id, task_id, node_rank, stream, data, ts)`` as
    :func:`gpulayer.store.queries.logs` reads it, as the API's record."""
    id_, task_id, node_rank, stream, data, ts = r
    return LogChunk(id=id_, task_id=task_id, node_rank=node_rank, stream=stream,
                    data=log_text(data), ts=ts)


def job_event(r: EventRow) -> JobEvent:
    return JobEvent(ts=r.ts, kind=r.kind, task_id=r.task_id, worker_id=r.worker_id, message=r.message)


def token_info(row: TokenRow) -> TokenInfo:
    return TokenInfo(id=row.id, scope=row.scope, created_at=row.created_at, expires_at=row.expires_at,
                     uses_left=row.uses_left, revoked=row.revoked, worker_id=row.worker_id,
                     description=row.description)


def machine_record(row: MachineRow, now: float, last_task_end: float | None = None) -> MachineRecord:
    """A machine, with what it cost from launch to its end (or ``now``). An idle one is idle
    since its worker's last task ended (``last_task_end``) when that is later than what its
    row says: a task too short for a pass to see the machine busy leaves the row's time as
    it was, and the idle timeout counts from the task's end (:mod:`gpulayer.provisioning`)."""
    idle_since = row.idle_since
    if row.state == "idle" and last_task_end is not None and last_task_end > (idle_since or 0.0):
        idle_since = last_task_end
    cost = None
    if row.price_per_hour is not None and row.launched_at is not None:
        cost = row.price_per_hour * max(0.0, (row.ended_at or now) - row.launched_at) / 3600
    return MachineRecord(
        id=row.id, provider=row.provider, shape=row.shape, region=row.region, state=row.state,
        reason=row.reason, job_id=row.job_id, worker_id=row.worker_id, provider_id=row.provider_id,
        price_per_hour=row.price_per_hour, created_at=row.created_at, launched_at=row.launched_at,
        joined_at=row.joined_at, join_deadline=row.join_deadline, idle_since=idle_since,
        ended_at=row.ended_at, cost=cost,
    )
