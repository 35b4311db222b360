"""What workers do with the control plane: register or join, heartbeat, take tasks, report
them; and how silent or departed workers are written off."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlmodel import Session

from gpulayer import lifecycle, provisioning, tokens
from gpulayer.api import (
    HeartbeatReply,
    JoinReply,
    LogStream,
    TaskAssignment,
    WorkerUsage,
    WorkPoll,
)
from gpulayer.control import after, placement, retention
from gpulayer.control.core import Core, _assigned, _view
from gpulayer.control.jobs import _result_json
from gpulayer.control.pauses import pause_limit
from gpulayer.errors import Conflict, InvalidInput
from gpulayer.hookrecords import Capabilities, Rendezvous
from gpulayer.logtext import stored_log_text
from gpulayer.pids import pid_alive
from gpulayer.records import JobError, JobState, TaskState, TaskUsage, WorkerRecord, new_id
from gpulayer.specs import CHECKED
from gpulayer.store import WorkerRow, mapping, plain, queries

log = logging.getLogger(__name__)

ORIGINS = ("local", "existing", "provider")
#: the name of the worker a script or `gpulayer submit` runs in its own process: its row is
#: forgotten when it stops (it is started afresh by the next one)
IN_PROCESS_NAME = "in-process"


#: how soon a worker's waiting poll looks at the database again on its own: it bounds how
#: late it sees a change that no nudge announced (:mod:`gpulayer.store.nudges`)
POLL_LOOK = 0.2


class WorkerOps(Core):
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
        self.schedule_queue()
        return self.get_worker(wid)

    def schedule_queue(self) -> None:
        """A placement pass, if a job waits in the queue: a pass reads the whole fleet before
        it looks at the queue, which made each of a thousand joins cost more than the last.
        A change before it that ended jobs (a worker lost with its tasks) is announced here,
        if the pass did not."""
        with self.store.read() as s:
            queued = queries.has_queued_jobs(s)
        if queued:
            self.schedule()
        if self.store.ended_pending():
            self._changed()

    def _register(self, s: Session, capabilities: Capabilities, *, worker_id: str | None, name: str | None,
                  cpu_slots: int, pid: int | None, origin: str | None, token_id: str | None = None) -> str:
        now = self.clock()
        row = queries.find_worker(s, worker_id) if worker_id else None
        if row is None:
            row = WorkerRow(id=worker_id or new_id("wkr"), name=name or socket.gethostname(),
                            origin=origin or "local", capabilities="{}", registered_at=now)
        capabilities = capabilities.storable()  # (a path that is not UTF-8 as its escape)
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
                    cpu_slots: int = 1, pid: int | None = None, machine_id: str | None = None) -> JoinReply:
        """Spend a join or bootstrap token, register a new worker and issue its credential,
        all in one transaction: a failure part-way burns nothing.

        A bootstrap token makes the worker's origin ``provider`` and binds it to the machine
        the token was made for (``machine_id``, when the worker gives it, must be that one)."""
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
            bound = self._bind_machine(s, joined.id, wid, machine_id) if joined.scope == "bootstrap" else None
            self._register(s, capabilities, worker_id=wid, name=name or bound, cpu_slots=cpu_slots, pid=pid,
                           origin=origin, token_id=cred.id)
        self.tokens.remember(secret, cred)  # committed: the worker's first calls need no read
        self.schedule_queue()
        return JoinReply(worker_id=wid, token=secret, token_id=cred.id, worker=self.get_worker(wid))

    def _bind_machine(self, s: Session, token_id: str, worker_id: str, machine_id: str | None) -> str | None:
        """A worker joining with a bootstrap token: bind it to the token's machine (in the
        join's transaction). Returns the machine id; refuses a join for another machine."""
        row = queries.machine_by_token(s, token_id)
        if row is None:
            return None
        if machine_id and machine_id != row.id:
            raise InvalidInput(f"machine_id {machine_id!r}: this bootstrap token was made for machine {row.id}")
        if row.state not in provisioning.PENDING_STATES:
            raise InvalidInput(f"machine {row.id} is {row.state}: it can no longer join")
        now = self.clock()
        row.state, row.worker_id, row.joined_at, row.idle_since, row.updated_at = "idle", worker_id, now, now, now
        s.add(row)
        if row.job_id:
            self._event(s, "cloud_joined", job_id=row.job_id, worker_id=worker_id, message=f"joined as {worker_id}")
        return row.id

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
        reports is lost: its report went missing (see :meth:`_reconcile`). A worker that
        left (offline and draining: deregistered, its machine gone, silent while it drained)
        is not brought back: a stopping worker's heartbeat, sent before its deregistration
        and written after, had it listed as draining for good. It is told to end what it
        still runs (its tasks were lost as it left).

        The hottest call of a large fleet, so the server batches what arrives together and
        this uses plain statements, not ORM objects.
        """
        now = self.clock()
        with self.store.write(lock=False, synced=False) as s:  # (liveness: see Store.write)
            flags = queries.worker_flags(s, reports)
            # (online, or offline but not draining: a silent one comes back; not one that left)
            alive = {wid: online for wid, (online, draining) in flags.items() if online or not draining}
            back = not all(alive.values())
            if back:  # a worker comes back online: see Store.lock_writers
                self.store.lock_writers(s)
            queries.touch_workers(s, alive, now)
            to_end = self._to_end(s, {wid: reports[wid] for wid in flags})
        with self._reports_lock:
            for wid in alive:  # what each worker says it runs, for the periodic reconciliation
                self._reports[wid] = (now, frozenset(reports[wid]))
        replies = {wid: HeartbeatReply(known=True, cancel=to_end[wid]) if wid in flags else HeartbeatReply(known=False)
                   for wid in reports}
        if back:
            self.schedule_queue()  # a worker came back: jobs waiting for it may be placed now
        # every heartbeat would otherwise rescan the fleet; once per third of the timeout
        # is enough to notice a silent worker (or a lost report) in time (and at once
        # after the clock stepped back past the last pass)
        if not 0 <= now - self._last_expiry <= self.heartbeat_timeout / 3:
            self.expire_workers()
            retention.when_due(self)  # (GPULAYER_KEEP_JOBS: where heartbeats are heard, not in every command)
        return replies

    def heartbeats_heard(self, heard: dict[str, float]) -> set[str]:
        """Heartbeats a server answered before writing them (worker id -> when it arrived):
        from workers it knew, running nothing, so the reply needed no read (known, nothing
        to end). Written here in one transaction, at most ``HEARTBEAT_WRITE_WINDOW`` after
        they arrived; a worker that went silent and came back is online again. Returns the
        ids of workers this did not write: those that no longer exist, and those that left
        (offline and draining: deregistered) between their heartbeat and this write, which
        it must not bring back. Their next heartbeat goes the long way (:meth:`heartbeats`)
        and hears it."""
        with self.store.write(lock=False, synced=False) as s:  # (liveness: see Store.write)
            flags = queries.worker_flags(s, heard)
            kept = {wid for wid, (online, draining) in flags.items() if online or not draining}
            back = any(not flags[wid][0] for wid in kept)
            if back:  # one comes back online: see Store.lock_writers
                self.store.lock_writers(s)
            queries.touch_workers_at(s, {wid: heard[wid] for wid in kept}, ahead_by=self.heartbeat_timeout)
        with self._reports_lock:
            for wid in kept:
                self._reports[wid] = (heard[wid], frozenset())
        if back:
            self.schedule_queue()  # a worker came back: jobs waiting for it may be placed now
        return set(heard) - kept

    def _to_end(self, s: Session, reports: dict[str, Sequence[str]]) -> dict[str, list[str]]:
        """Per worker, which of the tasks it says it runs it must end (:func:`lifecycle.must_end`)."""
        rows = queries.heartbeat_view(s, {t for running in reports.values() for t in running})
        doomed = queries.attempts_ended_badly(s, {r[3] for r in rows})
        tasks = {r[0]: r for r in rows}
        out: dict[str, list[str]] = {}
        for wid, running in reports.items():
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
            out[wid] = sorted(cancel)
        return out

    def _reconcile(self, now: float) -> None:
        """Running tasks that their worker, alive and reporting, no longer lists are lost:
        their final report went missing. Only reports this process received count, and a
        task must have started well before them (twice the heartbeat timeout)."""
        with self._reports_lock:
            for wid in [w for w, (at, _) in self._reports.items() if not 0 <= now - at < self.heartbeat_timeout]:
                del self._reports[wid]  # stale: its worker is silent or gone (or the clock stepped back)
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
        self.schedule_queue()

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
        self.schedule_queue()

    def deregister_worker(self, worker_id: str) -> None:
        """A worker leaving on purpose: offline now, its unfinished tasks lost, its
        credential revoked."""
        self._take_offline(worker_id, "worker stopped", "worker_left", online_only=False)

    def worker_credential_revoked(self, worker_id: str) -> None:
        """An admin revoked the worker's credential: it can no longer report, so it is
        offline now (no job is placed on it meanwhile) and its unfinished tasks are lost
        (one it had not started yet goes back to the queue at no cost to its job)."""
        self._take_offline(worker_id, "its credential was revoked", "worker_revoked", online_only=True)

    def worker_gone(self, worker_id: str, why: str) -> None:
        """The worker no longer runs (its machine ended): offline now, its unfinished tasks
        lost (``why``); one already offline, or pruned, is left as it is."""
        self._take_offline(worker_id, why, "worker_gone", online_only=True)

    def _take_offline(self, worker_id: str, why: str, event: str, *, online_only: bool) -> None:
        """Offline now, its unfinished tasks lost (``why``), its credentials revoked; with
        ``online_only`` a worker already offline (or gone) is left as it is."""
        now = self.clock()
        with self.store.write() as s:
            row = queries.find_worker(s, worker_id) if online_only else queries.worker(s, worker_id)
            if row is None or (online_only and not row.online):
                return
            row.online = False
            row.draining = True
            s.add(row)
            for t in queries.active_tasks_of_worker(s, worker_id):
                self._lose(s, t, now, why)
            self._event(s, event, worker_id=worker_id)
            queries.revoke_worker_tokens(s, worker_id)
        self.tokens.forget(worker_id=worker_id)
        self.schedule_queue()

    def begin_grace(self) -> None:
        """A server that just started (maybe after being down a while) has heard nobody
        yet: for one heartbeat timeout no worker is offline for its silence, so workers that
        kept running through the outage reconnect and report instead of being written off."""
        self._grace_until = self.clock() + self.heartbeat_timeout

    def seen(self, worker_ids: Iterable[str]) -> None:
        """Signs of life other than heartbeats (any call a worker made): they count the same."""
        with self.store.write(lock=False, synced=False) as s:  # (liveness: see Store.write)
            # only workers still online: a late call of a worker that left (or was written
            # off) must not bring it back
            alive = [w for w, online in queries.online_flags(s, worker_ids).items() if online]
            queries.touch_workers(s, alive, self.clock())

    def expire_workers(self) -> list[str]:
        """Mark silent workers offline and their tasks lost; returns their ids. (And the
        jobs after those an older GPUlayer ended are released: :meth:`release_overdue`.)"""
        self.release_overdue()
        now = self.clock()
        self._last_expiry = now
        self._reconcile(now)
        cutoff, ahead = now - self.heartbeat_timeout, now + self.heartbeat_timeout
        here = socket.gethostname()
        gone = self._death_test(now, here)

        def dead(w: WorkerRow) -> bool:
            return gone(w.origin, w.hostname, w.pid, w.last_heartbeat)

        with self.store.read() as s:
            stale = [wid for wid, origin, host, pid, heard in queries.expiry_candidates(s, cutoff, ahead, here)
                     if gone(origin, host, pid, heard)]
        if not stale:
            return []
        scripts: list[str] = []  # the in-process workers of scripts that died
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
                       and row.pid and not pid_alive(row.pid) else f"worker {wid} stopped sending heartbeats")
                for t in queries.active_tasks_of_worker(s, wid):
                    self._lose(s, t, now, why, last_heard=row.last_heartbeat)
                self._event(s, "worker_offline", worker_id=wid)
                if row.name == IN_PROCESS_NAME and row.origin == "local":
                    scripts.append(wid)
        self.schedule_queue()
        if scripts:
            # a script's own worker is not worth a row once gone; only after the pass, which
            # names it (with its pid) to the jobs that waited for it and now cannot run
            with self.store.write() as s:
                queries.delete_workers(s, scripts)
        return stale

    def _death_test(self, now: float, here: str) -> Callable[[str, str, int | None, float], bool]:
        """Whether a worker (origin, hostname, pid, last heartbeat) is dead at ``now``: silent
        past the heartbeat timeout, or last heard more than a timeout in the future (from
        before a step back of the clock), once this control plane's grace is over (one timeout
        after it was made, after a server's start, or after a pause of this process or a step
        of its clock: see :mod:`gpulayer.control.pauses`); or a local worker of this machine
        (``here``) whose process is gone."""
        paused = self.pauses.look(pause_limit(self.heartbeat_timeout))
        if paused is not None:
            log.info("this process was paused, or its clock stepped, by %.0f s: no worker is offline for its "
                     "silence for %g s", paused, self.heartbeat_timeout)
            self.begin_grace()
        cutoff, ahead = now - self.heartbeat_timeout, now + self.heartbeat_timeout
        silence_counts = now >= self._grace_until

        def dead(origin: str, hostname: str, pid: int | None, last_heartbeat: float) -> bool:
            pid_gone = origin == "local" and hostname == here and bool(pid) and not pid_alive(pid or 0)
            # a heartbeat from the future is from before the clock stepped back: the grace
            # that the step began gave the worker time to heartbeat since
            return (silence_counts and not cutoff <= last_heartbeat <= ahead) or pid_gone

        return dead

    def live_local_workers(self) -> list[str]:
        """The ids of the local workers that are online, not draining and alive: what a
        submit of a local job looks for before it starts a worker of its own. One plain
        read (a submit made this check on every call, and the whole fleet's records and an
        expiry pass were two thirds of a submitting process's CPU); when it finds one dead
        it marks the dead offline first (:meth:`expire_workers`), as that pass would."""
        now = self.clock()
        with self.store.read() as s:
            found = plain.local_workers(s)
        dead = self._death_test(now, socket.gethostname())
        if any(dead("local", hostname, pid, beat) for _id, hostname, pid, beat, _draining in found):
            self.expire_workers()  # (a draining one too: killed during its stop, its tasks are lost)
            with self.store.read() as s:
                found = plain.local_workers(s)
        return [wid for wid, hostname, pid, beat, draining in found
                if not draining and not dead("local", hostname, pid, beat)]

    # ------------------------------------------------------------------ tasks (worker side)

    def poll_tasks(self, worker_id: str, *, wait: float = 0.0) -> list[TaskAssignment]:
        """Tasks assigned to this worker and not started yet; waits up to ``wait`` seconds."""
        return self.poll_work(worker_id, wait=wait).tasks

    def poll_work(self, worker_id: str, *, running: Sequence[str] = (), wait: float = 0.0) -> WorkPoll:
        """Tasks assigned to this worker, not started and not in ``running``, and which of
        ``running`` it must end; waits up to ``wait`` seconds for either. In this process a placement or a cancel
        wakes it at once, and so does one another process on the same SQLite file commits (it
        nudges this one); other changes are seen within :data:`POLL_LOOK` seconds."""
        deadline = time.monotonic() + wait
        ends_seen: int | None = None  # the worker's own count when its tasks to end were last read
        # the poll that follows one which returned tasks (the worker has them now) waits
        # before it looks when no news came since that one looked: the worker's next poll
        # comes at once, while its new task starts, and its look would only compete with it
        # (only where another process's changes are heard at once: see Core._hear_nudges)
        last = self._polled.pop(worker_id, None)
        if wait > 0 and last is not None:
            self._hear_nudges()
        seen = self._work_of(worker_id)
        heard = self.store.nudges is not None and self.store.nudges.listening
        skip = wait > 0 and last is not None and heard and last[0] == seen and last[1] <= frozenset(running)
        out: list[TaskAssignment] = []
        cancel: list[str] = []
        while True:
            if skip:
                skip = False
            else:
                seen = self._work_of(worker_id)
                with self.store.read() as s:
                    out = self._assignments(s, worker_id, running)
                    # first look, then only when news for this worker came (a cancel wakes it):
                    # a look at the database every POLL_LOOK (for other processes' changes) need not
                    if running and ends_seen != seen[0] + seen[2]:
                        cancel = self._to_end(s, {worker_id: running})[worker_id]
                        ends_seen = seen[0] + seen[2]
            remaining = deadline - time.monotonic()
            if out or cancel or remaining <= 0:
                if out and not cancel:
                    self._polled[worker_id] = (seen, frozenset(a.task_id for a in out))
                return WorkPoll(tasks=out, cancel=cancel)
            self._wait_work(worker_id, seen, min(remaining, POLL_LOOK))

    def _assignments(self, s: Session, worker_id: str, running: Sequence[str]) -> list[TaskAssignment]:
        """The tasks assigned to the worker and not started, but those in ``running`` (the
        worker has them already: it is starting them)."""
        taken = set(running)
        return [TaskAssignment.model_validate(dict(
            task_id=t.id, job_id=t.job_id, attempt=t.attempt, node_rank=t.node_rank,
            accelerator=t.accelerator, devices=json.loads(t.devices), spec=mapping.worker_spec(spec, args),
            rendezvous=Rendezvous.model_validate_json(t.rendezvous) if t.rendezvous else None,
        ), context=CHECKED) for t, spec, args in plain.assigned_of_worker(s, worker_id) if t.id not in taken]

    def look_for_work(self, polls: Mapping[str, Sequence[str]]) -> dict[str, WorkPoll]:
        """:meth:`poll_work` without waiting, for many workers' polls at once (worker id ->
        the task ids it runs), in one read: a server gathers the polls that arrive together."""
        with self.store.read() as s:
            with_tasks = {wid for tid, wid in queries.assigned_task_workers(s)
                          if wid in polls and tid not in polls[wid]}
            tasks = {wid: self._assignments(s, wid, polls[wid]) for wid in with_tasks}
            busy = {wid: running for wid, running in polls.items() if running}
            cancel = self._to_end(s, busy) if busy else {}
        nothing = WorkPoll()  # most polls of a large fleet: one reply shared, not to be changed
        return {wid: WorkPoll(tasks=tasks.get(wid, []), cancel=cancel.get(wid, []))
                if wid in tasks or cancel.get(wid) else nothing for wid in polls}

    def work_news(self, polls: Mapping[str, Sequence[str]]) -> set[str]:
        """Of these waiting polls (worker id -> the task ids it runs), the workers that have
        news: a task to start, or one of theirs to end. One read for all of them: how a
        server notices what another server on the same database did for its waiting polls."""
        with self.store.read() as s:
            news = {wid for tid, wid in queries.assigned_task_workers(s)
                    if wid in polls and tid not in polls[wid]}
            busy = {wid: running for wid, running in polls.items() if running and wid not in news}
            if busy:
                news.update(wid for wid, cancel in self._to_end(s, busy).items() if cancel)
        return news

    def start_task(self, task_id: str, *, worker_id: str, how: str = "") -> None:
        """Idempotent: starting a task its worker already started is success (the first
        answer may have been lost), so a worker can retry this through an outage."""
        now = self.clock()
        with self.store.write() as s:
            task = self._own_task(s, task_id, worker_id)
            if not queries.transition_task(s, task_id, TaskState.RUNNING, started_at=now):
                if task.state == TaskState.RUNNING.value:
                    return
                raise Conflict(f"task {task_id} is {task.state}; it cannot start")
            self._settle(s, plain.job(s, task.job_id), now)
            self._event(s, "task_started", job_id=task.job_id, task_id=task_id, worker_id=worker_id, message=how)
        # the job runs: what shows it as it runs looks again here; a wait for its end need
        # not (nor need other processes: a nudge for each task costs the fleet's throughput,
        # and their followers see the start at their next look, or with its first output)
        self._progressed(task.job_id, output=False)

    def append_logs(self, task_id: str, *, worker_id: str, chunks: Sequence[tuple[LogStream, str]],
                    offset: int | None = None) -> None:
        """Store an upload of the task's output. With ``offset`` (where in the output it
        begins), an upload sent again is stored once (:func:`~gpulayer.store.plain.claim_output`)."""
        now = self.clock()
        if offset is not None and offset < 0:
            raise InvalidInput(f"offset {offset}: expected a count of characters, 0 or more")
        with self.store.write(lock=False) as s:
            task = self._own_task(s, task_id, worker_id)
            for stream, _ in chunks:
                if stream not in ("stdout", "stderr", "system"):
                    raise InvalidInput(f"log stream {stream!r}: expected stdout, stderr or system")
            if offset is not None:
                chunks = plain.claim_output(s, task, offset, chunks)
                if not chunks:
                    return  # (stored before: its answer was lost)
            plain.add_logs(s, [(task.job_id, task_id, task.node_rank, stream, stored_log_text(data), now)
                               for stream, data in chunks])
        # heard as progress, by the waits for this job's logs (here, and by a nudge in other
        # processes) and the observers (a server's followers, its dashboard's live logs): no
        # job or task changed, so the waits for jobs and the polls are not woken (a task
        # that wrote fast woke each of them every 64 kB to read a state)
        self._progressed(task.job_id)

    def finish_task(
        self, task_id: str, *, worker_id: str, state: TaskState, exit_code: int | None = None,
        result: Any = None, error: JobError | None = None, usage: TaskUsage | None = None,
    ) -> list[TaskAssignment]:
        """A worker's final report. A report for a task that already ended (superseded,
        cancelled) is refused with :class:`Conflict` and changes nothing; one for a task
        marked lost is accepted while no newer attempt superseded it. Answers the tasks
        that the placement after it gave the worker (with any others assigned to it and not
        started), which it may start at once; its poll is not woken for them."""
        state = TaskState(state)
        if not state.terminal:
            raise InvalidInput(f"state {state.value!r}: a finished task reports a terminal state")
        now = self.clock()
        started = time.perf_counter()
        with self.store.write() as s:
            task = self._own_task(s, task_id, worker_id)
            job = plain.job(s, task.job_id)
            # the bare spec (no arguments needed), parsed only when there is a result to check
            stored_result = None if result is None else _result_json(result, mapping.spec(job.spec))
            changes: dict[str, Any] = {}
            if state is TaskState.CANCELLED and lifecycle.ended_with_its_group(_view(job), task.attempt, [
                    TaskState(t.state) for t in plain.tasks_of(s, job.id, task.attempt) if t.id != task_id]):
                error = JobError.cancelled(lifecycle.OTHER_NODE_ENDED)  # its worker knew only "cancelled"
            if not queries.transition_task(s, task_id, state, ended_at=now, exit_code=exit_code, error=error,
                                           usage=usage):
                revived = (task.state == TaskState.LOST.value
                           and lifecycle.late_report_accepted(_view(job), task.attempt, state)
                           and queries.revive_lost_task(s, task_id, state, ended_at=now, exit_code=exit_code,
                                                        error=error, usage=usage))
                if not revived:
                    raise Conflict(f"task {task_id} is already {task.state}; a late report from a superseded "
                                   "attempt is refused")
                # the loss was only a silence: the job is back to this attempt, settled below
                changes["state"] = JobState.RUNNING.value
                if job.state in plain.ENDED_STATES:  # (its loss failed the jobs after it: control.after)
                    after.note_revived(s, job.id)
                self._event(s, "late_report_accepted", job_id=task.job_id, task_id=task_id, worker_id=worker_id,
                            message="the task was marked lost, but its worker finished it")
            if task.attempt == job.attempt and task.node_rank == 0:
                if state is TaskState.SUCCEEDED and stored_result is not None:
                    changes["result"] = stored_result
                changes["exit_code"] = exit_code
            job_state = self._settle(s, job._replace(**changes), now, also=changes)
            self._event(s, "task_finished", job_id=task.job_id, task_id=task_id, worker_id=worker_id,
                        message=f"{state.value} {error.message if error else ''}".strip())
            # what the task held is free: placed in the same transaction (one commit per report)
            # (a retry back in the queue gets its new decision from a whole pass)
            result = self._place_too(s, until_full=job_state != JobState.QUEUED.value)
            # what the pass gave this worker is the answer: it starts it without waiting for
            # its poll to be woken and to read it
            answer = self._assignments(s, worker_id, ()) if worker_id in _assigned(result) else []
        self._changed()
        self._placed(result, started, answered=worker_id if answer else None)
        return answer

