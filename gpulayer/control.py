"""The control plane: the queue, the worker registry and the scheduler's I/O.

One :class:`ControlPlane` runs embedded (in the user's process, SQLite in
``$GPULAYER_HOME``) or behind the server (SQLite or PostgreSQL). Several control planes
may share one database: every state change is a serialised transaction (see
:mod:`gpulayer.store`), so they never hand out the same device twice.

Lifecycle of a job::

    queued --place--> assigned --worker starts--> running --> succeeded
       ^                                              |  \\--> failed / timed_out / cancelled
       |                                              |
       +---- retry budget left <--- failed or lost ---+

One task per worker per attempt (a distributed job has one per node). A job's state is
derived from its current attempt's tasks in :meth:`ControlPlane._settle_job`; every task
ends in exactly one terminal state, and a task whose worker goes silent becomes ``lost``
(its process may still run: execution is at-least-once).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
from pydantic import BaseModel, TypeAdapter
from sqlalchemy import select as sa_select
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from gpulayer import bundles as _bundles
from gpulayer import scheduling
from gpulayer.errors import Conflict, InvalidInput, NotFound
from gpulayer.hookrecords import Capabilities, Rendezvous
from gpulayer.records import (
    JobRecord,
    JobState,
    PlacementDecision,
    TaskRecord,
    TaskState,
    WorkerRecord,
)
from gpulayer.specs import JobSpec
from gpulayer.store import (
    BundleRow,
    EventRow,
    JobRow,
    LogRow,
    Store,
    TaskRow,
    WorkerRow,
    transition_task,
)

_SPEC = TypeAdapter(JobSpec)

DEFAULT_HEARTBEAT_TIMEOUT = 15.0
ACTIVE_TASK_STATES = (TaskState.ASSIGNED.value, TaskState.RUNNING.value)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


class TaskAssignment(BaseModel):
    """What a worker needs to start one task."""

    task_id: str
    job_id: str
    attempt: int
    node_rank: int
    accelerator: str | None
    devices: list[int]
    spec: JobSpec
    rendezvous: Rendezvous | None = None


class HeartbeatReply(BaseModel):
    known: bool = True
    cancel: list[str] = []  # task ids the worker must end now


class LogChunk(BaseModel):
    id: int
    task_id: str
    node_rank: int
    stream: str
    data: str
    ts: float


@dataclass
class ControlPlane:
    store: Store
    heartbeat_timeout: float = field(
        default_factory=lambda: float(os.environ.get("GPULAYER_HEARTBEAT_TIMEOUT", DEFAULT_HEARTBEAT_TIMEOUT))
    )
    reserve_after: float = 60.0
    clock: Callable[[], float] = time.time
    #: called after each placement pass with its duration in seconds (metrics)
    on_placement: Callable[[float], None] | None = None
    #: called after a placement pass that handed tasks out, with the workers that got them
    #: (the server wakes exactly those workers' long polls)
    on_assigned: Callable[[set[str]], None] | None = None
    _wakeup: threading.Condition = field(default_factory=threading.Condition)
    _last_expiry: float = 0.0
    #: worker id -> (when, task ids it said it runs), from heartbeats this process received
    _reports: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ jobs

    def submit(
        self, spec: JobSpec, *, idempotency_key: str | None = None, owner: str | None = None,
    ) -> JobRecord:
        """Store a job and run a placement pass. The spec must already be resolved
        (profile applied, bundle uploaded and named by ``bundle_digest``)."""
        if spec.bundle is not None:
            raise InvalidInput(
                "spec.bundle: the control plane takes bundles by address; upload the "
                "directory first and pass bundle_digest (the SDK and CLI do this)"
            )
        now = self.clock()
        with self.store.write() as s:
            if idempotency_key is not None:
                existing = s.exec(select(JobRow).where(JobRow.idempotency_key == idempotency_key)).first()
                if existing is not None:
                    return self._job_record(s, existing)
            if spec.bundle_digest is not None and s.get(BundleRow, spec.bundle_digest) is None:
                raise InvalidInput(f"bundle_digest {spec.bundle_digest}: no bundle with that address was uploaded")
            row = JobRow(
                id=new_id("job"), kind=spec.kind, spec=spec.model_dump_json(),
                state=JobState.QUEUED.value, priority=spec.priority, created_at=now, updated_at=now,
                attempt=0, max_attempts=spec.retries + 1, idempotency_key=idempotency_key, owner=owner,
            )
            s.add(row)
            self._event(s, "submitted", job_id=row.id, message=spec.kind)
            job_id = row.id
        self.schedule()
        return self.get_job(job_id)

    def get_job(self, job_id: str) -> JobRecord:
        with self.store.read() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"job {job_id!r}: no such job")
            return self._job_record(s, row)

    def list_jobs(
        self, *, state: str | None = None, limit: int = 100, owner: str | None = None,
    ) -> list[JobRecord]:
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidInput(f"state {state!r}: expected one of {', '.join(s.value for s in JobState)}")
        with self.store.read() as s:
            q = select(JobRow).order_by(col(JobRow.created_at).desc()).limit(limit)
            if state is not None:
                q = q.where(JobRow.state == state)
            if owner is not None:
                q = q.where(JobRow.owner == owner)
            return [self._job_record(s, r, with_tasks=False) for r in s.exec(q).all()]

    def cancel(self, job_id: str) -> JobRecord:
        now = self.clock()
        with self.store.write() as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise NotFound(f"job {job_id!r}: no such job")
            if JobState(row.state).terminal:
                return self._job_record(s, row)
            row.cancel_requested = True
            row.updated_at = now
            if row.state == JobState.QUEUED.value:
                row.state = JobState.CANCELLED.value
                row.error = json.dumps({"type": "cancelled", "message": "cancelled before it started"})
            else:
                # assigned but not started: nothing to stop, end it here
                for t in self._tasks(s, row.id, row.attempt):
                    if t.state == TaskState.ASSIGNED.value:
                        transition_task(s, t.id, TaskState.CANCELLED, ended_at=now,
                                        error=json.dumps({"type": "cancelled", "message": "cancelled"}))
                s.add(row)
                s.flush()
                self._settle_job(s, row, now)
            s.add(row)
            self._event(s, "cancel_requested", job_id=job_id)
        self.schedule()  # devices of cancelled unstarted tasks are free for queued jobs
        self._notify()
        return self.get_job(job_id)

    def logs(
        self, job_id: str, *, after: int = 0, node: int | None = None, limit: int = 10_000,
    ) -> list[LogChunk]:
        with self.store.read() as s:
            if s.get(JobRow, job_id) is None:
                raise NotFound(f"job {job_id!r}: no such job")
            q = select(LogRow).where(LogRow.job_id == job_id, col(LogRow.id) > after)
            if node is not None:
                q = q.where(LogRow.node_rank == node)
            rows = s.exec(q.order_by(col(LogRow.id)).limit(limit)).all()
            return [LogChunk(id=r.id or 0, task_id=r.task_id, node_rank=r.node_rank, stream=r.stream,
                             data=r.data, ts=r.ts) for r in rows]

    def wait_job(self, job_id: str, timeout: float | None = None, poll: float = 0.05) -> JobRecord:
        """Block until the job is terminal or ``timeout`` passes; returns the record."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.state.terminal:
                return job
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return job
            with self._wakeup:
                self._wakeup.wait(min(poll, remaining) if remaining is not None else poll)
            poll = min(poll * 1.5, 0.5)

    # ------------------------------------------------------------------ bundles

    def has_bundle(self, digest: str) -> bool:
        with self.store.read() as s:
            return s.get(BundleRow, digest) is not None

    def put_bundle(self, digest: str, data: bytes) -> bool:
        """Store a bundle; False when that address was already stored. Verifies the content."""
        _bundles.verify_digest(data, digest)
        try:
            with self.store.write(lock=False) as s:
                if s.get(BundleRow, digest) is not None:
                    return False
                s.add(BundleRow(digest=digest, size=len(data), data=data, created_at=self.clock()))
        except IntegrityError:
            return False  # the same content, uploaded concurrently by someone else
        return True

    def get_bundle(self, digest: str) -> bytes:
        with self.store.read() as s:
            row = s.get(BundleRow, digest)
            if row is None:
                raise NotFound(f"bundle {digest}: no such bundle")
            return bytes(row.data)

    # ------------------------------------------------------------------ workers

    def register_worker(
        self, capabilities: Capabilities, *, origin: str = "local", name: str | None = None,
        cpu_slots: int = 1, pid: int | None = None, worker_id: str | None = None,
        token_id: str | None = None,
    ) -> WorkerRecord:
        if origin not in ("local", "existing", "provider"):
            raise InvalidInput(f"origin {origin!r}: expected local, existing or provider")
        if cpu_slots < 0:
            raise InvalidInput(f"cpu_slots {cpu_slots}: expected 0 or more")
        now = self.clock()
        with self.store.write() as s:
            row = s.get(WorkerRow, worker_id) if worker_id else None
            if row is None:
                row = WorkerRow(id=worker_id or new_id("wkr"), name=name or socket.gethostname(),
                                origin=origin, capabilities="{}", registered_at=now)
            row.capabilities = capabilities.model_dump_json()
            row.origin = origin
            row.name = name or row.name
            row.cpu_slots = cpu_slots
            row.online = True
            row.draining = False
            row.last_heartbeat = now
            row.pid = pid
            row.hostname = capabilities.host.hostname
            row.token_id = token_id or row.token_id
            s.add(row)
            self._event(s, "worker_registered", worker_id=row.id, message=origin)
            wid = row.id
        self.schedule()
        return self.get_worker(wid)

    def get_worker(self, worker_id: str) -> WorkerRecord:
        with self.store.read() as s:
            row = s.get(WorkerRow, worker_id)
            if row is None:
                raise NotFound(f"worker {worker_id!r}: no such worker")
            return _worker_record(row)

    def list_workers(self, *, include_offline: bool = True) -> list[WorkerRecord]:
        self.expire_workers()
        with self.store.read() as s:
            q = select(WorkerRow).order_by(col(WorkerRow.registered_at))
            if not include_offline:
                q = q.where(WorkerRow.online == True)  # noqa: E712
            return [_worker_record(r) for r in s.exec(q).all()]

    def worker_usage(self) -> dict[str, dict[str, Any]]:
        """Per online worker: busy devices and CPU slots, from the active tasks."""
        with self.store.read() as s:
            fleet = self._fleet(s)
        return {
            w.record.id: {
                "busy_devices": sorted(f"{k}:{i}" for k, i in w.busy_devices),
                "busy_cpu_slots": w.busy_cpu_slots,
            }
            for w in fleet
        }

    def heartbeat(self, worker_id: str, running: list[str] | None = None) -> HeartbeatReply:
        """Record that the worker is alive; say which of its tasks it must end."""
        return self.heartbeats({worker_id: list(running or [])})[worker_id]

    def heartbeats(self, reports: dict[str, list[str]]) -> dict[str, HeartbeatReply]:
        """Many workers' heartbeats (worker id -> the task ids it runs) in one transaction.

        The reply tells each worker which of its tasks to end: tasks that already ended
        here, tasks of a cancelled job, and tasks of an attempt that another node of the
        group has already failed. A task this control plane thinks is running but that its
        (alive) worker no longer reports is lost: its report went missing.

        The hottest call of a large fleet, so the server batches what arrives together and
        this uses plain statements, not ORM objects.
        """
        now = self.clock()
        replies: dict[str, HeartbeatReply] = {}
        ids = list(reports)
        bad_states = [TaskState.FAILED.value, TaskState.TIMED_OUT.value, TaskState.LOST.value,
                      TaskState.CANCELLED.value]
        with self.store.write(lock=False) as s:
            known = dict(s.execute(select(WorkerRow.id, WorkerRow.online).where(col(WorkerRow.id).in_(ids))).all())
            if known:
                s.execute(text("UPDATE gl_workers SET last_heartbeat = :now, online = :yes WHERE id = :id"),
                          [{"now": now, "yes": True, "id": wid} for wid in known])
            running = {t for wid in known for t in reports[wid]}
            rows = s.execute(
                sa_select(*(col(c) for c in (
                    TaskRow.id, TaskRow.state, TaskRow.worker_id, TaskRow.job_id, TaskRow.attempt,
                    JobRow.cancel_requested, JobRow.state, JobRow.attempt)))
                .join(JobRow, col(JobRow.id) == col(TaskRow.job_id), isouter=True)
                .where(col(TaskRow.id).in_(running))
            ).all() if running else []
            job_ids = {r[3] for r in rows}
            doomed = set(s.execute(
                select(TaskRow.job_id, TaskRow.attempt)
                .where(col(TaskRow.job_id).in_(job_ids), col(TaskRow.state).in_(bad_states))
            ).all()) if job_ids else set()
        for wid in known:  # what each worker says it runs, for the periodic reconciliation
            self._reports[wid] = (now, frozenset(reports[wid]))
        tasks = {r[0]: r for r in rows}
        for wid in ids:
            if wid not in known:
                replies[wid] = HeartbeatReply(known=False)
                continue
            cancel = []
            for task_id in reports[wid]:
                row = tasks.get(task_id)
                if row is None:
                    cancel.append(task_id)
                    continue
                _, state, owner, job_id, attempt, cancel_requested, job_state, job_attempt = row
                if (TaskState(state).terminal or owner != wid or cancel_requested
                        or job_state not in (JobState.ASSIGNED.value, JobState.RUNNING.value)
                        or attempt != job_attempt or (job_id, attempt) in doomed):
                    cancel.append(task_id)
            replies[wid] = HeartbeatReply(known=True, cancel=sorted(cancel))
        if not all(known.values()):
            self.schedule()  # a worker came back: jobs waiting for it may be placed now
        # every worker's heartbeat would otherwise rescan the fleet; once per third of the
        # timeout is enough to notice a silent worker (or a lost report) in time
        if now - self._last_expiry > self.heartbeat_timeout / 3:
            self.expire_workers()
        return replies

    def _reconcile(self, now: float) -> None:
        """Running tasks that their worker, alive and reporting, no longer lists are lost:
        their final report went missing. Only reports this process received count, and a
        task must have started well before them (twice the heartbeat timeout)."""
        recent = {wid: running for wid, (at, running) in self._reports.items()
                  if now - at < self.heartbeat_timeout}
        if not recent:
            return
        with self.store.read() as s:
            candidates = s.execute(
                select(TaskRow.id, TaskRow.worker_id).where(
                    TaskRow.state == TaskState.RUNNING.value,
                    col(TaskRow.started_at) < now - 2 * self.heartbeat_timeout)
            ).all()
        unreported = [tid for tid, wid in candidates if wid in recent and tid not in recent[wid]]
        if unreported:
            self._lose_unreported(unreported, now)
            self.schedule()

    def _lose_unreported(self, task_ids: list[str], now: float) -> None:
        with self.store.write() as s:
            for task_id in task_ids:
                why = "its worker no longer reports it running (the final report was lost)"
                if transition_task(s, task_id, TaskState.LOST, ended_at=now,
                                   error=json.dumps({"type": "lost", "message": why})):
                    task = s.get(TaskRow, task_id, populate_existing=True)
                    if task is None:
                        continue
                    self._event(s, "task_lost", job_id=task.job_id, task_id=task_id,
                                worker_id=task.worker_id, message=why)
                    job = s.get(JobRow, task.job_id)
                    if job is not None:
                        self._settle_job(s, job, now)

    def set_draining(self, worker_id: str) -> None:
        """The worker takes no new work; what it runs now may finish."""
        with self.store.write() as s:
            row = s.get(WorkerRow, worker_id)
            if row is None:
                raise NotFound(f"worker {worker_id!r}: no such worker")
            row.draining = True
            s.add(row)
            # tasks handed to it that never started go back to the queue
            for t in s.exec(select(TaskRow).where(TaskRow.worker_id == worker_id,
                                                  TaskRow.state == TaskState.ASSIGNED.value)).all():
                self._lose_unstarted(s, t, self.clock(), "worker is draining")
        self.schedule()

    def deregister_worker(self, worker_id: str) -> None:
        """A worker leaving on purpose: offline now; its unfinished tasks are lost."""
        now = self.clock()
        with self.store.write() as s:
            row = s.get(WorkerRow, worker_id)
            if row is None:
                return
            row.online = False
            row.draining = True
            s.add(row)
            self._lose_tasks(s, worker_id, now, "worker stopped")
            self._event(s, "worker_left", worker_id=worker_id)
        self.schedule()

    def expire_workers(self) -> list[str]:
        """Mark silent workers offline and their tasks lost; returns their ids."""
        now = self.clock()
        self._last_expiry = now
        self._reconcile(now)
        cutoff = now - self.heartbeat_timeout
        with self.store.read() as s:
            candidates = s.exec(select(WorkerRow).where(WorkerRow.online == True)).all()  # noqa: E712
            here = socket.gethostname()
            stale = [
                w.id for w in candidates
                if w.last_heartbeat < cutoff
                or (w.origin == "local" and w.hostname == here and w.pid and not _pid_alive(w.pid))
            ]
        if not stale:
            return []
        with self.store.write() as s:
            for wid in stale:
                # look again inside the write: a heartbeat may have come in since the read
                # (FOR UPDATE: on PostgreSQL heartbeats do not take the writers' lock)
                row = s.get(WorkerRow, wid, with_for_update=not self.store.is_sqlite, populate_existing=True)
                if row is None or not row.online:
                    continue
                pid_gone = row.origin == "local" and row.hostname == here and row.pid and not _pid_alive(row.pid)
                if row.last_heartbeat >= cutoff and not pid_gone:
                    continue
                row.online = False
                s.add(row)
                self._lose_tasks(s, wid, now, f"worker {wid} stopped sending heartbeats")
                self._event(s, "worker_offline", worker_id=wid)
        self.schedule()
        return stale

    # ------------------------------------------------------------------ tasks (worker side)

    def poll(self, worker_id: str, wait: float = 0.0) -> list[TaskAssignment]:
        """Tasks assigned to this worker and not started yet; waits up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            with self.store.read() as s:
                rows = s.exec(
                    select(TaskRow).where(TaskRow.worker_id == worker_id,
                                          TaskRow.state == TaskState.ASSIGNED.value)
                    .order_by(col(TaskRow.created_at))
                ).all()
                out = []
                for t in rows:
                    job = s.get(JobRow, t.job_id)
                    if job is None:
                        continue
                    out.append(TaskAssignment(
                        task_id=t.id, job_id=t.job_id, attempt=t.attempt, node_rank=t.node_rank,
                        accelerator=t.accelerator, devices=json.loads(t.devices),
                        spec=_SPEC.validate_json(job.spec),
                        rendezvous=Rendezvous.model_validate_json(t.rendezvous) if t.rendezvous else None,
                    ))
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            with self._wakeup:
                self._wakeup.wait(min(remaining, 0.2))

    def start_task(self, task_id: str, worker_id: str) -> None:
        now = self.clock()
        with self.store.write() as s:
            task = self._own_task(s, task_id, worker_id)
            if not transition_task(s, task_id, TaskState.RUNNING, started_at=now):
                raise Conflict(f"task {task_id} is {task.state}; it cannot start")
            job = s.get(JobRow, task.job_id)
            assert job is not None
            self._settle_job(s, job, now)
            self._event(s, "task_started", job_id=task.job_id, task_id=task_id, worker_id=worker_id)

    def append_logs(self, task_id: str, worker_id: str, chunks: list[tuple[str, str]]) -> None:
        now = self.clock()
        with self.store.write(lock=False) as s:
            task = self._own_task(s, task_id, worker_id)
            for stream, data in chunks:
                if stream not in ("stdout", "stderr", "system"):
                    raise InvalidInput(f"log stream {stream!r}: expected stdout, stderr or system")
                s.add(LogRow(job_id=task.job_id, task_id=task_id, node_rank=task.node_rank,
                             stream=stream, data=data, ts=now))
        self._notify()

    def finish_task(
        self, task_id: str, worker_id: str, state: TaskState | str, *,
        exit_code: int | None = None, result: Any = None, error: dict[str, Any] | None = None,
    ) -> None:
        """A worker's final report. A report for a task that already ended (superseded,
        lost, cancelled) is refused with :class:`Conflict` and changes nothing."""
        state = TaskState(state)
        if not state.terminal:
            raise InvalidInput(f"state {state.value!r}: a finished task reports a terminal state")
        now = self.clock()
        with self.store.write() as s:
            task = self._own_task(s, task_id, worker_id)
            message = (error or {}).get("message") if error else None
            ok = transition_task(s, task_id, state, ended_at=now, exit_code=exit_code,
                                 error=json.dumps(error) if error else None)
            if not ok:
                raise Conflict(
                    f"task {task_id} is already {task.state}; a late report from a superseded "
                    "attempt is refused"
                )
            job = s.get(JobRow, task.job_id)
            assert job is not None
            if task.attempt == job.attempt and task.node_rank == 0:
                if state is TaskState.SUCCEEDED and result is not None:
                    job.result = json.dumps(result)
                job.exit_code = exit_code
            self._settle_job(s, job, now, failed_error=error)
            self._event(s, "task_finished", job_id=task.job_id, task_id=task_id,
                        worker_id=worker_id, message=f"{state.value} {message or ''}".strip())
        self._notify()
        self.schedule()

    # ------------------------------------------------------------------ placement

    def schedule(self) -> None:
        """One placement pass over the whole queue, written in one transaction."""
        started = time.perf_counter()
        now = self.clock()
        with self.store.write() as s:
            rows = s.exec(
                select(JobRow).where(JobRow.state == JobState.QUEUED.value)
                .order_by(col(JobRow.created_at), col(JobRow.id))
            ).all()
            if not rows:
                return
            queue = [
                scheduling.QueuedJob(id=r.id, spec=_SPEC.validate_json(r.spec), seq=i,
                                     queued_at=r.updated_at or r.created_at)
                for i, r in enumerate(rows)
            ]
            fleet = self._fleet(s)
            result = scheduling.place(queue, fleet, now, reserve_after=self.reserve_after)
            by_id = {r.id: r for r in rows}
            addresses = {w.record.id: w.record.capabilities.host.address for w in fleet}
            for a in result.assignments:
                job = by_id[a.job_id]
                job.attempt += 1
                job.state = JobState.ASSIGNED.value
                job.updated_at = now
                rdzv = None
                spec = _SPEC.validate_json(job.spec)
                if spec.kind == "distributed":
                    rank0 = next(n for n in a.nodes if n.node_rank == 0)
                    rdzv = Rendezvous(
                        master_addr=addresses.get(rank0.worker_id, "127.0.0.1"),
                        master_port=_rendezvous_port(),
                        nnodes=len(a.nodes), run_id=f"{job.id}-{job.attempt}",
                    )
                for n in a.nodes:
                    s.add(TaskRow(
                        id=new_id("tsk"), job_id=job.id, attempt=job.attempt, node_rank=n.node_rank,
                        worker_id=n.worker_id, accelerator=n.accelerator, devices=json.dumps(n.devices),
                        state=TaskState.ASSIGNED.value, created_at=now,
                        rendezvous=rdzv.model_dump_json() if rdzv else None,
                    ))
                decision = result.decisions.get(a.job_id)
                job.decision = decision.model_dump_json() if decision else None
                s.add(job)
                self._event(s, "assigned", job_id=job.id,
                            message=", ".join(f"{n.worker_id}{n.devices or ''}" for n in a.nodes))
            assigned = {a.job_id for a in result.assignments}
            for job_id, decision in result.decisions.items():
                if job_id in assigned:
                    continue
                job = by_id[job_id]
                spec = _SPEC.validate_json(job.spec)
                encoded = decision.model_dump_json(exclude={"at"})
                if decision.outcome == "unschedulable" and spec.placement.on_unschedulable == "fail":
                    job.state = JobState.UNSCHEDULABLE.value
                    job.updated_at = now
                    job.decision = decision.model_dump_json()
                    job.error = json.dumps({"type": "unschedulable", "message": decision.render()})
                    s.add(job)
                    self._event(s, "unschedulable", job_id=job.id, message=decision.summary)
                elif job.decision is None or _strip_at(job.decision) != encoded:
                    job.decision = decision.model_dump_json()
                    s.add(job)
        if self.on_placement is not None:
            self.on_placement(time.perf_counter() - started)
        if self.on_assigned is not None and result.assignments:
            self.on_assigned({n.worker_id for a in result.assignments for n in a.nodes})
        self._notify()

    # ------------------------------------------------------------------ internals

    def _fleet(self, s: Session) -> list[scheduling.WorkerState]:
        workers = s.exec(select(WorkerRow).where(WorkerRow.online == True)).all()  # noqa: E712
        states = {w.id: scheduling.WorkerState(record=_worker_record(w)) for w in workers}
        active = s.exec(select(TaskRow).where(col(TaskRow.state).in_(ACTIVE_TASK_STATES))).all()
        for t in active:
            ws = states.get(t.worker_id)
            if ws is None:
                continue
            devices = json.loads(t.devices)
            if t.accelerator and devices:
                ws.busy_devices.update((t.accelerator, i) for i in devices)
            else:
                ws.busy_cpu_slots += 1
        return list(states.values())

    def _tasks(self, s: Session, job_id: str, attempt: int | None = None) -> list[TaskRow]:
        q = select(TaskRow).where(TaskRow.job_id == job_id)
        if attempt is not None:
            q = q.where(TaskRow.attempt == attempt)
        # populate_existing: transition_task updates rows with SQL, so refresh loaded objects
        q = q.order_by(col(TaskRow.attempt), col(TaskRow.node_rank)).execution_options(populate_existing=True)
        return list(s.exec(q).all())

    def _own_task(self, s: Session, task_id: str, worker_id: str) -> TaskRow:
        task = s.get(TaskRow, task_id)
        if task is None:
            raise NotFound(f"task {task_id!r}: no such task")
        if task.worker_id != worker_id:
            raise Conflict(f"task {task_id} is assigned to {task.worker_id}, not {worker_id}")
        return task

    def _lose_tasks(self, s: Session, worker_id: str, now: float, why: str) -> None:
        tasks = s.exec(select(TaskRow).where(TaskRow.worker_id == worker_id,
                                             col(TaskRow.state).in_(ACTIVE_TASK_STATES))).all()
        for t in tasks:
            if t.state == TaskState.ASSIGNED.value:
                self._lose_unstarted(s, t, now, why)
                continue
            if transition_task(s, t.id, TaskState.LOST, ended_at=now,
                               error=json.dumps({"type": "lost", "message": why})):
                self._event(s, "task_lost", job_id=t.job_id, task_id=t.id, worker_id=worker_id, message=why)
                job = s.get(JobRow, t.job_id)
                if job is not None:
                    self._settle_job(s, job, now)

    def _lose_unstarted(self, s: Session, t: TaskRow, now: float, why: str) -> None:
        """A task that never started is lost without spending the job's retry budget."""
        if transition_task(s, t.id, TaskState.LOST, ended_at=now,
                           error=json.dumps({"type": "lost", "message": f"{why} (never started)"})):
            job = s.get(JobRow, t.job_id)
            if job is not None and not JobState(job.state).terminal:
                job.max_attempts += 1
                self._settle_job(s, job, now)
            self._event(s, "task_released", job_id=t.job_id, task_id=t.id, worker_id=t.worker_id, message=why)

    def _settle_job(
        self, s: Session, job: JobRow, now: float, failed_error: dict[str, Any] | None = None,
    ) -> None:
        """Derive the job's state from its current attempt's tasks (one group, one fate).

        When one node of the attempt fails (or is lost, times out, is cancelled), the nodes
        that never started are cancelled here, and the running ones stay ``running`` until
        their workers have ended them (heartbeats tell them to): their devices are busy
        until then. The job's fate is decided once the whole group is down.
        """
        if JobState(job.state).terminal or job.state == JobState.QUEUED.value:
            return
        s.flush()
        tasks = self._tasks(s, job.id, job.attempt)
        if not tasks:
            return
        states = [TaskState(t.state) for t in tasks]
        bad = [t for t in tasks if TaskState(t.state) in
               (TaskState.FAILED, TaskState.TIMED_OUT, TaskState.LOST, TaskState.CANCELLED)]
        if bad:
            for t in tasks:
                if t.state == TaskState.ASSIGNED.value:
                    transition_task(s, t.id, TaskState.CANCELLED, ended_at=now,
                                    error=json.dumps({"type": "cancelled",
                                                      "message": "another node of the job ended"}))
            if any(t.state == TaskState.RUNNING.value for t in self._tasks(s, job.id, job.attempt)):
                job.state = JobState.RUNNING.value  # the rest of the group is being ended
                job.updated_at = now
                s.add(job)
                return
            # the root cause, not the nodes cancelled because of it
            first = next((t for t in bad if t.state != TaskState.CANCELLED.value), bad[0])
            first_state = TaskState(first.state)
            error = failed_error or (json.loads(first.error) if first.error else None)
            if job.cancel_requested:
                job.state = JobState.CANCELLED.value
                job.error = json.dumps({"type": "cancelled", "message": "cancelled"})
            elif first_state in (TaskState.FAILED, TaskState.LOST) and job.attempt < job.max_attempts:
                job.state = JobState.QUEUED.value  # retry: the next placement is a new attempt
                job.error = json.dumps(error) if error else None
                self._event(s, "retry", job_id=job.id,
                            message=f"attempt {job.attempt} {first_state.value}; {job.max_attempts - job.attempt} left")
            else:
                job.state = {
                    TaskState.FAILED: JobState.FAILED, TaskState.LOST: JobState.FAILED,
                    TaskState.TIMED_OUT: JobState.TIMED_OUT, TaskState.CANCELLED: JobState.CANCELLED,
                }[first_state].value
                if first_state is TaskState.LOST:
                    error = {"type": "lost", "message": (error or {}).get("message", "worker lost")}
                job.error = json.dumps(error) if error else None
        elif all(st is TaskState.SUCCEEDED for st in states):
            job.state = JobState.SUCCEEDED.value
            job.error = None
        elif any(st is TaskState.RUNNING or st.terminal for st in states):
            job.state = JobState.RUNNING.value
        else:
            job.state = JobState.ASSIGNED.value
        job.updated_at = now
        s.add(job)

    def _job_record(self, s: Session, row: JobRow, with_tasks: bool = True) -> JobRecord:
        tasks = []
        if with_tasks:
            for t in self._tasks(s, row.id):
                err = t.error
                tasks.append(TaskRecord(
                    id=t.id, job_id=t.job_id, attempt=t.attempt, node_rank=t.node_rank,
                    worker_id=t.worker_id, devices=json.loads(t.devices), accelerator=t.accelerator,
                    state=TaskState(t.state), created_at=t.created_at, started_at=t.started_at,
                    ended_at=t.ended_at, exit_code=t.exit_code,
                    error=(json.loads(err).get("message") if err and err.startswith("{") else err),
                    rendezvous=Rendezvous.model_validate_json(t.rendezvous) if t.rendezvous else None,
                ))
        return JobRecord(
            id=row.id, spec=_SPEC.validate_json(row.spec), state=JobState(row.state),
            created_at=row.created_at, updated_at=row.updated_at, attempt=row.attempt,
            exit_code=row.exit_code, result=json.loads(row.result) if row.result else None,
            error=json.loads(row.error) if row.error else None,
            decision=PlacementDecision.model_validate_json(row.decision) if row.decision else None,
            cancel_requested=row.cancel_requested, tasks=tasks,
        )

    def _event(self, s: Session, kind: str, *, job_id: str | None = None, task_id: str | None = None,
               worker_id: str | None = None, message: str = "") -> None:
        s.add(EventRow(ts=self.clock(), kind=kind, job_id=job_id, task_id=task_id,
                       worker_id=worker_id, message=message))

    def events(self, job_id: str) -> list[dict[str, Any]]:
        with self.store.read() as s:
            rows = s.exec(select(EventRow).where(EventRow.job_id == job_id).order_by(col(EventRow.id))).all()
            return [{"ts": r.ts, "kind": r.kind, "task_id": r.task_id, "worker_id": r.worker_id,
                     "message": r.message} for r in rows]

    def _notify(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()

    def counts(self) -> dict[str, Any]:
        """Figures for metrics: jobs by state, workers online, queue depth."""
        with self.store.read() as s:
            by_state = dict(s.execute(text("SELECT state, COUNT(*) FROM gl_jobs GROUP BY state")).all())
            online = s.execute(text("SELECT COUNT(*) FROM gl_workers WHERE online")).scalar_one()
        return {"jobs": {k: int(v) for k, v in by_state.items()}, "workers_online": int(online),
                "queue_depth": int(by_state.get("queued", 0))}


#: where rendezvous ports are drawn from: below the ephemeral ranges of Linux (32768-60999)
#: and macOS (49152-65535), so an outgoing connection on rank 0's host cannot hold the port
RENDEZVOUS_PORTS = (20000, 32767)


def _rendezvous_port() -> int:
    low, high = RENDEZVOUS_PORTS
    raw = os.environ.get("GPULAYER_RENDEZVOUS_PORTS")
    if raw:
        try:
            low, high = (int(p) for p in raw.split("-", 1))
        except ValueError:
            raise InvalidInput(f"GPULAYER_RENDEZVOUS_PORTS={raw!r}: expected LOW-HIGH, e.g. 20000-32767") from None
        if not 1024 <= low <= high <= 65535:
            raise InvalidInput(f"GPULAYER_RENDEZVOUS_PORTS={raw!r}: expected 1024 <= LOW <= HIGH <= 65535")
    return low + secrets.randbelow(high - low + 1)


def _strip_at(decision_json: str) -> str:
    try:
        return PlacementDecision.model_validate_json(decision_json).model_dump_json(exclude={"at"})
    except Exception:
        return ""


def _worker_record(row: WorkerRow) -> WorkerRecord:
    return WorkerRecord(
        id=row.id, name=row.name, origin=row.origin,
        capabilities=Capabilities.model_validate_json(row.capabilities),
        cpu_slots=row.cpu_slots, online=row.online, draining=row.draining,
        last_heartbeat=row.last_heartbeat, registered_at=row.registered_at, pid=row.pid,
    )


def _pid_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False

