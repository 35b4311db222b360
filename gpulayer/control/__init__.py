"""The control plane: the queue, the worker registry and the scheduler's I/O.

One :class:`ControlPlane` runs embedded (in the user's process, SQLite in
``$GPULAYER_HOME``) or behind the server (SQLite or PostgreSQL), and implements every
operation of :mod:`gpulayer.api` (clients, workers, admin). It only orchestrates: the SQL is
in :mod:`gpulayer.store.queries`, placement in :mod:`gpulayer.scheduling`, what a report, a
loss or a cancel does to a job in :mod:`gpulayer.lifecycle`. Several control planes may
share one database: every state change is a serialised transaction (see
:mod:`gpulayer.store`), so they never hand out the same device twice.

Every task ends in exactly one terminal state; a task whose worker goes silent becomes
``lost`` (its process may still run: execution is at-least-once).

Who wants to hear about changes (the server's long polls, its metrics) registers a
:class:`ControlObserver` with :meth:`ControlPlane.observe`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from gpulayer import bundles as _bundles
from gpulayer import config, lifecycle, tokens
from gpulayer.api import (
    MAX_LONG_POLL,
    BundleStored,
    HeartbeatReply,
    JobEvent,
    JoinReply,
    LogChunk,
    LogStream,
    NewToken,
    TaskAssignment,
    TokenInfo,
    WorkerUsage,
)
from gpulayer.control import explaining, placement
from gpulayer.errors import Conflict, InvalidArgument, InvalidInput
from gpulayer.hookrecords import Capabilities, Rendezvous
from gpulayer.records import Explanation, JobError, JobRecord, JobState, TaskState, WorkerRecord, new_id
from gpulayer.specs import JobSpec
from gpulayer.store import BundleRow, EventRow, JobRow, LogRow, Store, TaskRow, WorkerRow, mapping, queries

ORIGINS = ("local", "existing", "provider")
#: the name of the worker a script or `gpulayer submit` runs in its own process: its row is
#: forgotten when it stops (it is started afresh by the next one)
IN_PROCESS_NAME = "in-process"


class ControlObserver:
    """Hears about the control plane's changes; override what you need. Called on the
    thread that made the change, after its transaction committed: return quickly."""

    def on_change(self) -> None:
        """Something changed (a job, a task, a log)."""

    def on_placement(self, seconds: float) -> None:
        """A placement pass took ``seconds``."""

    def on_assigned(self, worker_ids: frozenset[str]) -> None:
        """A placement pass handed tasks to these workers."""


@dataclass
class ControlPlane:
    store: Store
    heartbeat_timeout: float = field(default_factory=lambda: config.settings().heartbeat_timeout)
    reserve_after: float = 60.0
    clock: Callable[[], float] = time.time
    _wakeup: threading.Condition = field(default_factory=threading.Condition)
    _observers: list[ControlObserver] = field(default_factory=list)
    _last_expiry: float = 0.0
    #: worker id -> (when, task ids it said it runs), from heartbeats this process received;
    #: written by heartbeat batches and read by reconciliation on other threads
    _reports: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)
    _reports_lock: threading.Lock = field(default_factory=threading.Lock)
    _tokens: tokens.TokenStore | None = None
    #: until when silence counts for nothing (a server's start: see begin_grace)
    _grace_until: float = 0.0

    def observe(self, observer: ControlObserver) -> None:
        self._observers.append(observer)

    def unobserve(self, observer: ControlObserver) -> None:
        self._observers.remove(observer)

    @property
    def tokens(self) -> tokens.TokenStore:
        if self._tokens is None:
            self._tokens = tokens.TokenStore(self.store, clock=self.clock)
        return self._tokens

    # ------------------------------------------------------------------ jobs

    def submit(self, spec: JobSpec, *, idempotency_key: str | None = None,
               owner: str | None = None) -> JobRecord:
        """Store a job and run a placement pass. The spec must already be resolved
        (profile applied, bundle uploaded and named by ``bundle_digest``). Idempotency keys
        are scoped to ``owner``: one owner can never see another's job by guessing a key."""
        if spec.bundle is not None:
            raise InvalidInput(
                "spec.bundle: the control plane takes bundles by address; upload the "
                "directory first and pass bundle_digest (the SDK and CLI do this)"
            )
        key = f"{owner}:{idempotency_key}" if owner and idempotency_key else idempotency_key
        if spec.kind == "function":
            _check_arguments(spec.function, spec.args, spec.kwargs)
        now = self.clock()
        with self.store.write() as s:
            if key is not None:
                existing = queries.find_job_by_key(s, key)
                if existing is not None:
                    return mapping.job_record(existing, queries.tasks_of(s, existing.id))
            if spec.bundle_digest is not None and not queries.bundle_exists(s, spec.bundle_digest):
                raise InvalidInput(f"bundle_digest {spec.bundle_digest}: no bundle with that address was uploaded")
            spec_json, args_json = mapping.stored_spec(spec)
            row = JobRow(
                id=new_id("job"), kind=spec.kind, spec=spec_json, args=args_json,
                state=JobState.QUEUED.value, priority=spec.priority, created_at=now, updated_at=now,
                attempt=0, max_attempts=spec.retries + 1, idempotency_key=key, owner=owner,
            )
            s.add(row)
            self._event(s, "submitted", job_id=row.id, message=spec.kind)
            job_id = row.id
        self.schedule()
        return self.get_job(job_id)

    def get_job(self, job_id: str) -> JobRecord:
        with self.store.read() as s:
            return mapping.job_record(queries.job(s, job_id), queries.tasks_of(s, job_id))

    def job_owner(self, job_id: str) -> str | None:
        """The token id that submitted the job (None when submitted in-process)."""
        with self.store.read() as s:
            return queries.job_owner(s, job_id)

    def list_jobs(self, *, state: JobState | str | None = None, limit: int = 100,
                  owner: str | None = None) -> list[JobRecord]:
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidInput(f"state {state!r}: expected one of {', '.join(s.value for s in JobState)}")
        with self.store.read() as s:
            value = JobState(state).value if state is not None else None
            return [mapping.job_record(r) for r in queries.jobs(s, state=value, limit=limit, owner=owner)]

    def cancel(self, job_id: str, *, reason: str | None = None) -> JobRecord:
        """End the job: a queued one at once, a running one through its workers (their next
        heartbeat or poll). ``reason`` (in-process callers) becomes the job's error."""
        now = self.clock()
        with self.store.write() as s:
            row = queries.job(s, job_id)
            if JobState(row.state).terminal:
                return mapping.job_record(row, queries.tasks_of(s, job_id))
            row.cancel_requested = True
            row.updated_at = now
            if row.state == JobState.QUEUED.value:
                row.state = JobState.CANCELLED.value
                row.error = JobError.cancelled(f"{reason} (before it started)" if reason
                                               else "cancelled before it started").model_dump_json()
            else:
                if reason:
                    row.error = JobError.cancelled(reason).model_dump_json()
                # assigned but not started: nothing to stop, end it here
                for t in queries.tasks_of(s, row.id, row.attempt):
                    if t.state == TaskState.ASSIGNED.value:
                        queries.transition_task(s, t.id, TaskState.CANCELLED, ended_at=now,
                                                error=JobError.cancelled())
                s.add(row)
                self._settle(s, row, now)
            s.add(row)
            self._event(s, "cancel_requested", job_id=job_id)
        self.schedule()  # devices of cancelled unstarted tasks are free for queued jobs
        self._changed()
        return self.get_job(job_id)

    def logs(self, job_id: str, *, after: int = 0, node: int | None = None, limit: int = 10_000) -> list[LogChunk]:
        with self.store.read() as s:
            queries.job(s, job_id)
            return [mapping.log_chunk(r) for r in queries.logs(s, job_id, after=after, node=node, limit=limit)]

    def wait_job(self, job_id: str, *, timeout: float = MAX_LONG_POLL) -> JobRecord:
        """The job once it is terminal, or as it is after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        poll = 0.05
        while True:
            job = self.get_job(job_id)
            remaining = deadline - time.monotonic()
            if job.state.terminal or remaining <= 0:
                return job
            with self._wakeup:
                self._wakeup.wait(min(poll, remaining))
            poll = min(poll * 1.5, 0.5)

    def explain(self, spec: JobSpec, *, owner: str | None = None, prospective: Sequence[WorkerRecord] = ()) -> Explanation:
        """What placement would say about a resolved ``spec`` now (:mod:`.explaining`); stores nothing."""
        return explaining.explain(self, spec, owner=owner, prospective=prospective)

    def explain_job(self, job_id: str, *, owner: str | None = None,
                    prospective: Sequence[WorkerRecord] = ()) -> Explanation:
        return explaining.explain(self, None, job_id=job_id, owner=owner, prospective=prospective)

    def queue_position(self, job_id: str) -> int | None:
        return explaining.position_of(self, job_id)

    def events(self, job_id: str) -> list[JobEvent]:
        with self.store.read() as s:
            return [mapping.job_event(r) for r in queries.events(s, job_id)]

    # ------------------------------------------------------------------ bundles

    def has_bundle(self, digest: str) -> bool:
        with self.store.read() as s:
            return queries.bundle_exists(s, digest)

    def put_bundle(self, digest: str, data: bytes) -> BundleStored:
        """Store a bundle (``stored`` False when that address was already stored).
        Verifies that the content hashes to its address first."""
        _bundles.verify_digest(data, digest)
        try:
            with self.store.write(lock=False) as s:
                if queries.bundle_exists(s, digest):
                    return BundleStored(digest=digest, size=len(data), stored=False)
                queries.add_bundle(s, BundleRow(digest=digest, size=len(data), data=data, created_at=self.clock()))
        except IntegrityError:  # the same content, uploaded concurrently by someone else
            return BundleStored(digest=digest, size=len(data), stored=False)
        return BundleStored(digest=digest, size=len(data), stored=True)

    def get_bundle(self, digest: str) -> bytes:
        with self.store.read() as s:
            return bytes(queries.bundle(s, digest).data)

    # ------------------------------------------------------------------ workers

    def register_worker(
        self, capabilities: Capabilities, *, worker_id: str | None = None, name: str | None = None,
        cpu_slots: int = 1, pid: int | None = None, origin: str | None = None,
    ) -> WorkerRecord:
        """Register a worker, or register an existing one again (it keeps its origin).

        ``origin`` applies to a new worker only and defaults to ``local``: in this process
        (or on this home) a worker is local unless a join token said otherwise.
        """
        if origin is not None and origin not in ORIGINS:
            raise InvalidInput(f"origin {origin!r}: expected local, existing or provider")
        if cpu_slots < 0:
            raise InvalidInput(f"cpu_slots {cpu_slots}: expected 0 or more")
        with self.store.write() as s:
            wid = self._register(s, capabilities, worker_id=worker_id, name=name, cpu_slots=cpu_slots,
                                 pid=pid, origin=origin)
        self.schedule()
        return self.get_worker(wid)

    def _register(self, s: Session, capabilities: Capabilities, *, worker_id: str | None, name: str | None,
                  cpu_slots: int, pid: int | None, origin: str | None, token_id: str | None = None) -> str:
        now = self.clock()
        row = queries.find_worker(s, worker_id) if worker_id else None
        if row is None:
            row = WorkerRow(id=worker_id or new_id("wkr"), name=name or socket.gethostname(),
                            origin=origin or "local", capabilities="{}", registered_at=now)
        row.capabilities = capabilities.model_dump_json()
        row.name = name or row.name
        row.cpu_slots = cpu_slots
        row.online = True
        row.draining = False
        row.last_heartbeat = now
        row.pid = pid
        row.hostname = capabilities.host.hostname
        row.token_id = token_id or row.token_id
        s.add(row)
        self._event(s, "worker_registered", worker_id=row.id, message=row.origin)
        return row.id

    def join_worker(self, capabilities: Capabilities, *, join_token: str, name: str | None = None,
                    cpu_slots: int = 1, pid: int | None = None) -> JoinReply:
        """Spend a join or bootstrap token, register a new worker and issue its credential,
        all in one transaction: a failure part-way burns nothing."""
        if cpu_slots < 0:
            raise InvalidInput(f"cpu_slots {cpu_slots}: expected 0 or more")
        now = self.clock()
        with self.store.write() as s:
            joined = tokens.check(s, join_token, now=now, spend=True)
            if joined.scope not in ("join", "bootstrap"):
                raise InvalidInput(f"token {joined.id} has scope {joined.scope!r}; workers join with a join "
                                   "or bootstrap token")
            wid = new_id("wkr")
            cred, secret = tokens.new_token(s, "worker", now=now, worker_id=wid,
                                            description=f"credential of {wid} (joined with {joined.id})")
            origin = "provider" if joined.scope == "bootstrap" else "existing"
            self._register(s, capabilities, worker_id=wid, name=name, cpu_slots=cpu_slots, pid=pid,
                           origin=origin, token_id=cred.id)
        self.schedule()
        return JoinReply(worker_id=wid, token=secret, token_id=cred.id, worker=self.get_worker(wid))

    def get_worker(self, worker_id: str) -> WorkerRecord:
        with self.store.read() as s:
            return mapping.worker_record(queries.worker(s, worker_id))

    def list_workers(self, *, include_offline: bool = True) -> list[WorkerRecord]:
        self.expire_workers()
        with self.store.read() as s:
            return [mapping.worker_record(r) for r in queries.workers(s, online_only=not include_offline)]

    def worker_usage(self) -> dict[str, WorkerUsage]:
        """Per online worker: busy devices and CPU slots, from the active tasks."""
        with self.store.read() as s:
            fleet = placement.fleet(s)
        return {
            w.record.id: WorkerUsage(busy_devices=sorted(f"{k}:{i}" for k, i in w.busy_devices),
                                     busy_cpu_slots=w.busy_cpu_slots)
            for w in fleet
        }

    def heartbeat(self, worker_id: str, *, running: Sequence[str] = ()) -> HeartbeatReply:
        """Record that the worker is alive; say which of its tasks it must end."""
        return self.heartbeats({worker_id: list(running)})[worker_id]

    def heartbeats(self, reports: dict[str, list[str]]) -> dict[str, HeartbeatReply]:
        """Many workers' heartbeats (worker id -> the task ids it runs) in one transaction.

        The reply tells each worker which of its tasks to end (:func:`lifecycle.must_end`).
        A task this control plane thinks is running but that its (alive) worker no longer
        reports is lost: its report went missing (see :meth:`_reconcile`).

        The hottest call of a large fleet, so the server batches what arrives together and
        this uses plain statements, not ORM objects.
        """
        now = self.clock()
        with self.store.write(lock=False) as s:
            known = queries.online_flags(s, reports)
            queries.touch_workers(s, known, now)
            rows = queries.heartbeat_view(s, {t for wid in known for t in reports[wid]})
            doomed = queries.attempts_ended_badly(s, {r[3] for r in rows})
        with self._reports_lock:
            for wid in known:  # what each worker says it runs, for the periodic reconciliation
                self._reports[wid] = (now, frozenset(reports[wid]))
        tasks = {r[0]: r for r in rows}
        replies: dict[str, HeartbeatReply] = {}
        for wid, running in reports.items():
            if wid not in known:
                replies[wid] = HeartbeatReply(known=False)
                continue
            cancel = []
            for task_id in running:
                row = tasks.get(task_id)
                if row is None:
                    cancel.append(task_id)
                    continue
                _, state, owner, job_id, attempt, cancel_requested, job_state, job_attempt = row
                if lifecycle.must_end(task_state=TaskState(state), owner=owner, reporter=wid, attempt=attempt,
                                      job_state=JobState(job_state) if job_state else None,
                                      job_attempt=job_attempt, cancel_requested=bool(cancel_requested),
                                      attempt_ended_badly=(job_id, attempt) in doomed):
                    cancel.append(task_id)
            replies[wid] = HeartbeatReply(known=True, cancel=sorted(cancel))
        if not all(known.values()):
            self.schedule()  # a worker came back: jobs waiting for it may be placed now
        # every heartbeat would otherwise rescan the fleet; once per third of the timeout
        # is enough to notice a silent worker (or a lost report) in time
        if now - self._last_expiry > self.heartbeat_timeout / 3:
            self.expire_workers()
        return replies

    def _reconcile(self, now: float) -> None:
        """Running tasks that their worker, alive and reporting, no longer lists are lost:
        their final report went missing. Only reports this process received count, and a
        task must have started well before them (twice the heartbeat timeout)."""
        with self._reports_lock:
            for wid in [w for w, (at, _) in self._reports.items() if now - at >= self.heartbeat_timeout]:
                del self._reports[wid]  # stale: its worker is silent or gone
            recent = {wid: running for wid, (_, running) in self._reports.items()}
        if not recent:
            return
        with self.store.read() as s:
            candidates = queries.running_tasks_started_before(s, now - 2 * self.heartbeat_timeout)
        unreported = [tid for tid, wid in candidates if wid in recent and tid not in recent[wid]]
        if not unreported:
            return
        why = "its worker no longer reports it running (the final report was lost)"
        with self.store.write() as s:
            for task_id in unreported:
                task = queries.task(s, task_id)
                self._lose(s, task, now, why)
        self.schedule()

    def drain_worker(self, worker_id: str) -> None:
        """The worker takes no new work; what it runs now may finish."""
        now = self.clock()
        with self.store.write() as s:
            row = queries.worker(s, worker_id)
            row.draining = True
            s.add(row)
            # tasks handed to it that never started go back to the queue
            for t in queries.assigned_tasks_of_worker(s, worker_id):
                self._lose(s, t, now, "worker is draining")
        self.schedule()

    def deregister_worker(self, worker_id: str) -> None:
        """A worker leaving on purpose: offline now, its unfinished tasks lost, its
        credential revoked."""
        now = self.clock()
        with self.store.write() as s:
            row = queries.worker(s, worker_id)
            row.online = False
            row.draining = True
            s.add(row)
            for t in queries.active_tasks_of_worker(s, worker_id):
                self._lose(s, t, now, "worker stopped")
            self._event(s, "worker_left", worker_id=worker_id)
            queries.revoke_worker_tokens(s, worker_id)
        self.tokens.forget()
        self.schedule()

    def begin_grace(self) -> None:
        """A server that just started (maybe after being down a while) has heard nobody
        yet: for one heartbeat timeout no worker is offline for its silence, so workers that
        kept running through the outage reconnect and report instead of being written off."""
        self._grace_until = self.clock() + self.heartbeat_timeout

    def seen(self, worker_ids: Iterable[str]) -> None:
        """Signs of life other than heartbeats (any call a worker made): they count the same."""
        with self.store.write(lock=False) as s:
            # only workers still online: a late call of a worker that left (or was written
            # off) must not bring it back
            alive = [w for w, online in queries.online_flags(s, worker_ids).items() if online]
            queries.touch_workers(s, alive, self.clock())

    def expire_workers(self) -> list[str]:
        """Mark silent workers offline and their tasks lost; returns their ids."""
        now = self.clock()
        self._last_expiry = now
        self._reconcile(now)
        cutoff = now - self.heartbeat_timeout
        silence_counts = now >= self._grace_until
        here = socket.gethostname()

        def dead(w: WorkerRow) -> bool:
            pid_gone = w.origin == "local" and w.hostname == here and bool(w.pid) and not _pid_alive(w.pid or 0)
            return (silence_counts and w.last_heartbeat < cutoff) or pid_gone

        with self.store.read() as s:
            stale = [w.id for w in queries.expiry_candidates(s, cutoff, here) if dead(w)]
        if not stale:
            return []
        with self.store.write() as s:
            for wid in stale:
                # look again inside the write: a heartbeat may have come in since the read
                # (FOR UPDATE: on PostgreSQL heartbeats do not take the writers' lock)
                row = queries.worker(s, wid, for_update=not self.store.is_sqlite, fresh=True)
                if not row.online or not dead(row):
                    continue
                row.online = False
                s.add(row)
                why = (f"worker {wid} (pid {row.pid}) is gone" if row.origin == "local" and row.hostname == here
                       and row.pid and not _pid_alive(row.pid) else f"worker {wid} stopped sending heartbeats")
                for t in queries.active_tasks_of_worker(s, wid):
                    self._lose(s, t, now, why)
                self._event(s, "worker_offline", worker_id=wid)
                if row.name == IN_PROCESS_NAME and row.origin == "local":
                    queries.delete_workers(s, [wid])  # a script's own worker is not worth a row once gone
        self.schedule()
        return stale

    # ------------------------------------------------------------------ tasks (worker side)

    def poll_tasks(self, worker_id: str, *, wait: float = 0.0) -> list[TaskAssignment]:
        """Tasks assigned to this worker and not started yet; waits up to ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            with self.store.read() as s:
                out = []
                for t in queries.assigned_tasks_of_worker(s, worker_id):
                    job = queries.find_job(s, t.job_id)
                    if job is None:
                        continue
                    out.append(TaskAssignment(
                        task_id=t.id, job_id=t.job_id, attempt=t.attempt, node_rank=t.node_rank,
                        accelerator=t.accelerator, devices=json.loads(t.devices), spec=mapping.job_spec(job),
                        rendezvous=Rendezvous.model_validate_json(t.rendezvous) if t.rendezvous else None,
                    ))
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            with self._wakeup:
                self._wakeup.wait(min(remaining, 0.2))

    def start_task(self, task_id: str, *, worker_id: str) -> None:
        """Idempotent: starting a task its worker already started is success (the first
        answer may have been lost), so a worker can retry this through an outage."""
        now = self.clock()
        with self.store.write() as s:
            task = self._own_task(s, task_id, worker_id)
            if not queries.transition_task(s, task_id, TaskState.RUNNING, started_at=now):
                if task.state == TaskState.RUNNING.value:
                    return
                raise Conflict(f"task {task_id} is {task.state}; it cannot start")
            self._settle(s, queries.job(s, task.job_id), now)
            self._event(s, "task_started", job_id=task.job_id, task_id=task_id, worker_id=worker_id)

    def append_logs(self, task_id: str, *, worker_id: str, chunks: Sequence[tuple[LogStream, str]]) -> None:
        now = self.clock()
        with self.store.write(lock=False) as s:
            task = self._own_task(s, task_id, worker_id)
            for stream, _ in chunks:
                if stream not in ("stdout", "stderr", "system"):
                    raise InvalidInput(f"log stream {stream!r}: expected stdout, stderr or system")
            queries.add_logs(s, (LogRow(job_id=task.job_id, task_id=task_id, node_rank=task.node_rank,
                                        stream=stream, data=mapping.stored_log_text(data), ts=now)
                                 for stream, data in chunks))
        self._changed()

    def finish_task(
        self, task_id: str, *, worker_id: str, state: TaskState, exit_code: int | None = None,
        result: Any = None, error: JobError | None = None,
    ) -> None:
        """A worker's final report. A report for a task that already ended (superseded,
        cancelled) is refused with :class:`Conflict` and changes nothing; one for a task
        marked lost is accepted while no newer attempt superseded it."""
        state = TaskState(state)
        if not state.terminal:
            raise InvalidInput(f"state {state.value!r}: a finished task reports a terminal state")
        now = self.clock()
        with self.store.write() as s:
            task = self._own_task(s, task_id, worker_id)
            job = queries.job(s, task.job_id)
            stored_result = _result_json(result, mapping.spec(job.spec))  # the bare spec: no arguments needed
            if not queries.transition_task(s, task_id, state, ended_at=now, exit_code=exit_code, error=error):
                revived = (task.state == TaskState.LOST.value
                           and lifecycle.late_report_accepted(_view(job), task.attempt)
                           and queries.revive_lost_task(s, task_id, state, ended_at=now, exit_code=exit_code,
                                                        error=error))
                if not revived:
                    raise Conflict(f"task {task_id} is already {task.state}; a late report from a superseded "
                                   "attempt is refused")
                # the loss was only a silence: the job is back to this attempt, settled below
                job.state = JobState.RUNNING.value
                self._event(s, "late_report_accepted", job_id=task.job_id, task_id=task_id, worker_id=worker_id,
                            message="the task was marked lost, but its worker finished it")
            if task.attempt == job.attempt and task.node_rank == 0:
                if state is TaskState.SUCCEEDED and stored_result is not None:
                    job.result = stored_result
                job.exit_code = exit_code
            self._settle(s, job, now, reported=error)
            self._event(s, "task_finished", job_id=task.job_id, task_id=task_id, worker_id=worker_id,
                        message=f"{state.value} {error.message if error else ''}".strip())
        self._changed()
        self.schedule()

    # ------------------------------------------------------------------ tokens (admin)

    def create_token(self, *, scope: str, ttl: float | None = None, uses: int | None = None,
                     description: str = "") -> NewToken:
        info, secret = self.tokens.create(scope, ttl=ttl, uses=uses, description=description)
        return NewToken(**info.model_dump(), token=secret)

    def list_tokens(self) -> list[TokenInfo]:
        return self.tokens.list()

    def revoke_token(self, token_id: str) -> TokenInfo:
        return self.tokens.revoke(token_id)

    # ------------------------------------------------------------------ housekeeping (admin)

    def prune_workers(self, *, older_than: float = 0.0, worker_ids: Sequence[str] | None = None) -> list[str]:
        """Forget offline workers silent for at least ``older_than`` seconds (only those of
        ``worker_ids`` when given); their credentials are revoked. Tasks keep naming them."""
        self.expire_workers()
        with self.store.write() as s:
            gone = queries.offline_workers_silent_since(s, self.clock() - older_than)
            if worker_ids is not None:
                gone = [w for w in gone if w in set(worker_ids)]
            for wid in gone:
                queries.revoke_worker_tokens(s, wid)
                self._event(s, "worker_pruned", worker_id=wid)
            queries.delete_workers(s, gone)
        if gone:
            self.tokens.forget()
        return gone

    # ------------------------------------------------------------------ placement

    def schedule(self) -> None:
        """One placement pass over the whole queue, written in one transaction."""
        started = time.perf_counter()
        now = self.clock()
        with self.store.write() as s:
            result = placement.run(s, now, reserve_after=self.reserve_after, event=self._event)
        if result is None:  # nothing queued
            return
        seconds = time.perf_counter() - started
        workers = frozenset(n.worker_id for a in result.assignments for n in a.nodes)
        for o in self._observers:
            o.on_placement(seconds)
            if workers:
                o.on_assigned(workers)
        self._changed()

    # ------------------------------------------------------------------ internals

    def _own_task(self, s: Session, task_id: str, worker_id: str) -> TaskRow:
        task = queries.task(s, task_id)
        if task.worker_id != worker_id:
            raise Conflict(f"task {task_id} is assigned to {task.worker_id}, not {worker_id}")
        return task

    def _lose(self, s: Session, t: TaskRow, now: float, why: str) -> None:
        """The task's worker is gone (or going): the task is lost. One that never started
        goes back to the queue without spending the job's retry budget."""
        unstarted = t.state == TaskState.ASSIGNED.value
        error = JobError.lost(f"{why} (never started)" if unstarted else why)
        if not queries.transition_task(s, t.id, TaskState.LOST, ended_at=now, error=error):
            return
        if not unstarted:
            self._event(s, "task_lost", job_id=t.job_id, task_id=t.id, worker_id=t.worker_id, message=why)
        job = queries.find_job(s, t.job_id)
        if job is not None:
            if unstarted:
                job.max_attempts = lifecycle.release_unstarted(_view(job))
            self._settle(s, job, now)
        if unstarted:
            self._event(s, "task_released", job_id=t.job_id, task_id=t.id, worker_id=t.worker_id, message=why)

    def _settle(self, s: Session, job: JobRow, now: float, reported: JobError | None = None) -> None:
        """Apply :func:`lifecycle.settle` to the job's current attempt."""
        s.flush()
        tasks = queries.tasks_of(s, job.id, job.attempt)
        views = [lifecycle.TaskView(id=t.id, state=TaskState(t.state), error=mapping.error_of(t.error))
                 for t in tasks]
        out = lifecycle.settle(_view(job), views, reported=reported)
        for task_id in out.cancel:
            queries.transition_task(s, task_id, TaskState.CANCELLED, ended_at=now,
                                    error=JobError.cancelled(lifecycle.OTHER_NODE_ENDED))
        if out.state is None:
            return
        if out.state.terminal or out.retry:  # a running or assigned job keeps its last error
            job.error = out.error.model_dump_json() if out.error else None
        job.state = out.state.value
        job.updated_at = now
        s.add(job)
        if out.retry:
            self._event(s, "retry", job_id=job.id, message=out.note)

    def _event(self, s: Session, kind: str, *, job_id: str | None = None, task_id: str | None = None,
               worker_id: str | None = None, message: str = "") -> None:
        """Record an event of the history ``gpulayer jobs show`` and ``events`` read."""
        queries.add_event(s, EventRow(ts=self.clock(), kind=kind, job_id=job_id, task_id=task_id,
                                      worker_id=worker_id, message=message))

    def _changed(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()
        for o in self._observers:
            o.on_change()

    def counts(self) -> dict[str, Any]:
        """Figures for metrics: jobs by state, workers online, queue depth."""
        with self.store.read() as s:
            by_state = queries.job_counts(s)
            online = queries.online_worker_count(s)
        return {"jobs": by_state, "workers_online": online, "queue_depth": by_state.get("queued", 0)}


def _check_arguments(function: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    """A function job's arguments within the documented limits (the same embedded and on a
    server), counted with an early stop so that a huge list is refused in bounded time."""
    env = config.settings()
    budget = env.max_args_values
    stack: list[Any] = [args, kwargs]
    while stack:
        value = stack.pop()
        budget -= 1
        if budget < 0:
            raise InvalidArgument(f"arguments of {function}: more than {env.max_args_values} values "
                                  "(GPULAYER_MAX_ARGS_VALUES); pass large data as a file in the bundle or a URL")
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    size = len(json.dumps([args, kwargs]).encode("utf-8", "surrogatepass"))
    if size > env.max_args_mb * 1024 * 1024:
        raise InvalidArgument(f"arguments of {function}: {size} bytes of JSON, over the limit of "
                              f"{env.max_args_mb:g} MB (GPULAYER_MAX_ARGS_MB); pass large data as a file in "
                              "the bundle or a URL")


def _result_json(result: Any, spec: JobSpec) -> str | None:
    """A function's result as stored, or InvalidInput when it is not JSON or over the limit
    (the same embedded and on a server; the worker then fails the task with this message)."""
    if result is None:
        return None
    what = f"the result of {spec.function}" if spec.kind == "function" else "the result"
    try:
        text = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what} is not JSON ({exc})") from None
    limit = config.settings().max_result_mb
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit * 1024 * 1024:
        raise InvalidInput(f"{what} is {size} bytes of JSON, over the limit of {limit:g} MB "
                           "(GPULAYER_MAX_RESULT_MB); return a path or a URL to large data instead")
    return text


def _view(job: JobRow) -> lifecycle.JobView:
    return lifecycle.JobView(state=JobState(job.state), attempt=job.attempt, max_attempts=job.max_attempts,
                             cancel_requested=job.cancel_requested, error=mapping.error_of(job.error))


def _pid_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return bool(p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


if TYPE_CHECKING:
    from gpulayer.api import ControlAPI

    def _implements(plane: ControlPlane) -> ControlAPI:
        return plane  # mypy checks here that ControlPlane offers every operation of the API


__all__ = ["ControlObserver", "ControlPlane", "new_id"]
