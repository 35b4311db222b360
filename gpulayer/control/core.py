"""The control plane's shared state and the steps every operation uses: the placement
pass, losing a task, settling a job, recording an event, telling observers.

The operations themselves are in :mod:`.jobs` (what clients ask), :mod:`.workers` (what
workers report) and :mod:`gpulayer.control` (admin); :class:`gpulayer.control.ControlPlane`
puts them together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlmodel import Session

from gpulayer import config, lifecycle, scheduling, tokens
from gpulayer.control import after, placement
from gpulayer.control.pauses import Pauses
from gpulayer.errors import Forbidden
from gpulayer.records import MAX_ERROR_MESSAGE, JobError, JobState, TaskState
from gpulayer.store import JobRow, Store, TaskRow, mapping, plain, queries
from gpulayer.store.nudges import MAX_NEWS

log = logging.getLogger("gpulayer.control")

#: what a nudge says (gpulayer.store.nudges): jobs changed (their waits look again); jobs
#: changed, and "x:ID" names each job that ended (every one: the waits need not look, see
#: JobOps.ended_news); every worker's poll looks again; and "w:ID" / "e:ID": that worker has
#: tasks to start / to end. (Nudges that come together are heard as one: "j" in any of them
#: makes the whole unnamed, so a nudge that names the jobs it ended says "J" alone.)
_JOBS = "j"
_JOBS_NAMED = "J"
_ENDED = "x:"
_ANY_WORKER = "W"
#: where a transaction's session keeps the pass that placed the jobs it released (Core._on_ended)
_PLACED = "gl_after_placed"
#: and "p:ID": that job has new output (what a wait for its logs looks again for)
_PROGRESS = "p:"
#: how many changes a control plane remembers the ended jobs of (see JobOps.ended_news),
#: and how many jobs it counts the progress of (see Core._progress_of)
ENDED_KEPT = 4096
if TYPE_CHECKING:
    from gpulayer.control.providers import ProviderSet


class ControlObserver:
    """Hears about the control plane's changes; override what you need. Called on the
    thread that made the change, after its transaction committed: return quickly."""

    def on_change(self) -> None:
        """Something changed (a job, a task, a worker)."""

    def on_progress(self, job_id: str, *, output: bool) -> None:
        """The job made progress that only what shows it as it runs looks again for: new
        output (log chunks; ``output``), or its task started (what a list of jobs shows as
        running). What waits for a job's end or a worker's work need not look again (no
        :meth:`on_change` comes with it)."""

    def on_placement(self, seconds: float) -> None:
        """A placement pass took ``seconds``."""

    def on_assigned(self, worker_ids: frozenset[str]) -> None:
        """A placement pass handed tasks to these workers."""

    def on_cancel(self, worker_ids: frozenset[str]) -> None:
        """These workers run tasks they must end now (a cancel): wake their long polls."""


@dataclass(frozen=True)
class Look:
    """What a wait for many jobs knew after a look: of ``job_ids`` (all ``owner``'s, or
    anyone's when None), those in ``ended`` had ended, as of the change count
    ``generation`` (read before the database was) and the news of the changes up to it;
    ``at``: when the database was last read for it (``time.monotonic()``)."""

    job_ids: frozenset[str]
    owner: str | None
    generation: int
    ended: frozenset[str]
    at: float


@dataclass
class Core:
    """The state every operation shares; the operations are the mixins that extend it."""

    store: Store
    heartbeat_timeout: float = field(default_factory=lambda: config.settings().heartbeat_timeout)
    reserve_after: float = 60.0
    clock: Callable[[], float] = time.time
    #: the lock of the counts below, and its three conditions: the waits for a job's change
    #: (:meth:`_wait_change`), the polls for work (:meth:`_wait_work`) and the waits for a
    #: job's output (:meth:`_wait_progress`) are woken apart, so a commit wakes no poll that
    #: has nothing new, work for a worker wakes no job's wait (in a worker process every
    #: commit of every process woke its poll, for nothing), and a job's output or start wakes
    #: only its followers
    _news_lock: threading.Lock = field(default_factory=threading.Lock)
    _job_news: threading.Condition = field(init=False)
    _work_news: threading.Condition = field(init=False)
    _progress_news: threading.Condition = field(init=False)
    #: counts the changes :meth:`_changed` announced: a waiter that read it before looking
    #: at the database cannot miss a change made between its look and its wait
    _generation: int = 0
    #: the same, for changes a worker's poll cares about (tasks assigned, tasks to end):
    #: one count for changes that concern any worker, one per worker for its own
    _work_generation: int = 0
    _worker_generation: dict[str, int] = field(default_factory=dict)
    #: job id -> how often it made progress that this process heard of (:meth:`_progressed`),
    #: for the ENDED_KEPT jobs that made it last, the latest last
    _progress_count: dict[str, int] = field(default_factory=dict)
    #: worker id -> (its counts, the task ids) as its last poll returned them here: a poll
    #: that follows with nothing new need not look before it waits (see poll_work)
    _polled: dict[str, tuple[tuple[int, int, int], frozenset[str]]] = field(default_factory=dict)
    _observers: list[ControlObserver] = field(default_factory=list)
    _placement_cache: placement.Cache = field(default_factory=placement.Cache)
    _last_expiry: float = 0.0
    #: when (monotonic) the scheduled prune of GPULAYER_KEEP_JOBS may run next (control.retention)
    _retention_next: float = 0.0
    #: worker id -> (when, task ids it said it runs), from heartbeats this process received;
    #: written by heartbeat batches and read by reconciliation on other threads
    _reports: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)
    _reports_lock: threading.Lock = field(default_factory=threading.Lock)
    _tokens: tokens.TokenStore | None = None
    #: until when silence counts for nothing: one heartbeat timeout after this control plane
    #: was made, a server's start or a pause of this process (see begin_grace, control.pauses)
    _grace_until: float = 0.0
    #: notices this process's own pauses and its wall clock's steps (control.pauses)
    pauses: Pauses = field(default_factory=Pauses)
    #: the providers of providers.toml (the cloud target); None: none configured
    providers: ProviderSet | None = None
    #: served by ``gpulayer server start`` (machines can reach it); False: embedded
    serving: bool = False
    #: job records give a result as its stored JSON text (:class:`~gpulayer.wire.ResultJSON`),
    #: for a server that writes it into its answers as it is (``gpulayer.server.app``'s
    #: renderer) instead of parsing it to write it again; in-process callers want the value
    results_as_text: bool = False
    #: the label of this control plane's machines (read from the database once)
    _label: str | None = None
    #: woken by other processes' changes (see :mod:`gpulayer.store.nudges`) since its first wait
    _nudged_too: bool = False
    #: per thread: the polls a change in progress will wake in other processes, sent with
    #: the nudge of its :meth:`_changed` (after the commit)
    _pending: threading.local = field(default_factory=threading.local)
    #: (count, the jobs it ended, or None where that is not known) of each of the last
    #: :data:`ENDED_KEPT` changes counted in ``_generation`` (see JobOps.ended_news)
    _ended_log: deque[tuple[int, frozenset[str] | None]] = field(
        default_factory=lambda: deque(maxlen=ENDED_KEPT))
    #: the last look of a wait for many jobs (see JobOps.first_look): a wait that follows on
    #: the same jobs or fewer starts from it
    _last_look: Look | None = None

    def __post_init__(self) -> None:
        # it has heard no heartbeat yet: silence it did not watch counts for nothing (control.pauses)
        self._grace_until = self.clock() + self.heartbeat_timeout
        self._job_news = threading.Condition(self._news_lock)
        self._work_news = threading.Condition(self._news_lock)
        self._progress_news = threading.Condition(self._news_lock)
        # the jobs that run after those a transaction ended (control.after), in that transaction
        self.store.on_ended = self._on_ended
        self.store.after_ended = self._after_ended

    def observe(self, observer: ControlObserver) -> None:
        self._observers.append(observer)

    def unobserve(self, observer: ControlObserver) -> None:
        self._observers.remove(observer)

    @property
    def tokens(self) -> tokens.TokenStore:
        if self._tokens is None:
            self._tokens = tokens.TokenStore(self.store, clock=self.clock)
        return self._tokens

    # ------------------------------------------------------------------ placement

    def schedule(self, *, new_job: str | None = None) -> None:
        """One placement pass over the whole queue, written in one transaction (after a
        submit of ``new_job`` into a full fleet, over that job alone: see :func:`placement.run`)."""
        started = time.perf_counter()
        with self.store.write() as s:
            result = self._place(s, new_job=new_job)
        self._placed(result, started)

    def _place(self, s: Session, *, new_job: str | None = None,
               until_full: bool = False) -> scheduling.PlacementResult | None:
        """A placement pass in the caller's transaction; call :meth:`_placed` after it committed."""
        return placement.run(s, self.clock(), reserve_after=self.reserve_after, event=self._event,
                             cache=self._placement_cache, new_job=new_job, until_full=until_full,
                             offers=self.providers.placement_offers(self.clock()) if self.providers else (),
                             offer_rooms=self.providers.offer_rooms() if self.providers else None,
                             providers_down=self.providers.down if self.providers else None)

    def _place_too(self, s: Session, *, new_job: str | None = None,
                   until_full: bool = False) -> scheduling.PlacementResult | None:
        """:meth:`_place` after a change the caller must keep (a submit, a report): in a
        savepoint, so a pass that fails is undone alone and the change still commits (the
        next pass, at the latest the server's periodic one, places the queue). (A plain
        SAVEPOINT: the pass writes plain statements, and SQLAlchemy's nested transaction
        cost as much as the pass's own reads.)"""
        s.flush()  # what the caller changed goes before the savepoint: it is kept
        ended = set(plain.ended_in(s))
        plain.control(s, "SAVEPOINT gl_place")
        try:
            result = self._place(s, new_job=new_job, until_full=until_full)
            s.flush()
            plain.control(s, "RELEASE SAVEPOINT gl_place")
            return result
        except Exception:
            log.exception("a placement pass failed; the change before it is kept")
            # (not flushed first: the failure may be the flush's, or the transaction aborted)
            plain.control(s, "ROLLBACK TO SAVEPOINT gl_place")
            # a job the pass found unschedulable is queued again: not ended (the jobs that run
            # after it would fail, and the waits for it would hear that it ended)
            plain.undo_ended(s, ended)
            for obj in list(s.new):  # rows the pass added and never wrote
                s.expunge(obj)
            s.expire_all()  # rows the session loaded may hold what was undone
            return None

    def _on_ended(self, s: Session) -> None:
        """Before a transaction that ended jobs commits: the jobs that run after them are
        released (and placed, in the same transaction) or fail in turn (:mod:`.after`)."""
        released = after.resolve(s, self.clock(), self._event)
        if released:
            started = time.perf_counter()
            self.store.lock_writers(s)  # (a transaction begun without the writers' lock: a heartbeat's)
            result = self._place_too(s, new_job=released[0] if len(released) == 1 else None)
            after.resolve(s, self.clock(), self._event)  # (those the pass found unschedulable)
            s.info[_PLACED] = (result, started)

    def release_overdue(self) -> None:
        """Do for the jobs an older GPUlayer ended what their ends do here (:func:`after.overdue`):
        the jobs after them are released and placed, or fail in turn."""
        with self.store.read() as s:
            if not after.overdue(s):
                return
        with self.store.write() as s:
            for job_id in after.overdue(s):
                plain.note_ended(s, job_id)  # (the commit resolves them: _on_ended)

    def _after_ended(self, info: dict[str, Any]) -> None:
        """Once that transaction committed: wake the workers its pass gave tasks to."""
        placed = info.pop(_PLACED, None)
        if placed is not None:
            self._placed(*placed)

    def _placed(self, result: scheduling.PlacementResult | None, started: float,
                answered: str | None = None) -> None:
        """Tell workers and observers what a committed pass (begun at ``started``) did; the
        poll of worker ``answered`` is not woken (its report's answer handed it its tasks)."""
        if result is None:  # nothing queued
            return
        seconds = time.perf_counter() - started
        workers = _assigned(result) - {answered}
        if workers:
            self._work_changed(workers)
        for o in self._observers:
            o.on_placement(seconds)
            if workers:
                o.on_assigned(workers)
        self._changed()

    # ------------------------------------------------------------------ internals

    def _own_task(self, s: Session, task_id: str, worker_id: str) -> plain.Task:
        task = plain.task(s, task_id)
        if task.worker_id != worker_id:
            # another worker's task: refused without naming who holds it
            raise Forbidden(f"task {task_id} is not assigned to worker {worker_id}")
        return task

    def _lose(self, s: Session, t: TaskRow, now: float, why: str, last_heard: float | None = None) -> None:
        """The task's worker is gone (or going): the task is lost. One that never started
        goes back to the queue without spending the job's retry budget. ``last_heard``: the
        worker died, last heard from then; the task ended then as far as anyone knows (so a
        peer that its death cut off, which failed before the loss was found, is not taken
        for the group's root cause)."""
        unstarted = t.state == TaskState.ASSIGNED.value
        error = JobError.lost(f"{why} (never started)" if unstarted else why)
        ended = now if last_heard is None else min(now, max(last_heard, t.started_at or t.created_at))
        if not queries.transition_task(s, t.id, TaskState.LOST, ended_at=ended, error=error):
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

    def _settle(self, s: Session, job: JobRow | plain.Job, now: float, also: dict[str, Any] | None = None) -> str:
        """Apply :func:`lifecycle.settle` to the job's current attempt; the job's state after.

        A row of the session (:class:`JobRow`) is changed in the session; a plain row
        (:class:`plain.Job`, the hot path) is written with one UPDATE, together with the
        columns in ``also``, which the caller changed before (``job`` already holds them)."""
        tasks = plain.tasks_of(s, job.id, job.attempt)
        views = [lifecycle.TaskView(id=t.id, state=TaskState(t.state), error=mapping.error_of(t.error),
                                    ended_at=t.ended_at) for t in tasks]
        out = lifecycle.settle(_view(job), views)
        if out.cancel:  # the other nodes of a group end: their workers' polls hear it
            self._work_changed()
        for task_id in out.cancel:
            queries.transition_task(s, task_id, TaskState.CANCELLED, ended_at=now,
                                    error=JobError.cancelled(lifecycle.OTHER_NODE_ENDED))
        values: dict[str, Any] = dict(also or {})
        if out.state is not None:
            if out.state.terminal or out.retry:  # a running or assigned job keeps its last error
                error = out.error
                root = next((t for t in tasks if t.id == out.root), None)
                if error is not None and root is not None and len(tasks) > 1 and not job.cancel_requested:
                    error = _on_node(error, root.node_rank, root.worker_id)
                values["error"] = error.model_dump_json() if error else None
            if out.state in (JobState.FAILED, JobState.TIMED_OUT) and out.root is not None:
                # the exit code of the node it ended because of, not node 0's (which may be
                # the signal that ended it with its group)
                values["exit_code"] = next(t.exit_code for t in tasks if t.id == out.root)
            elif out.retry:  # the job's exit code is its outcome's: the attempt's stays with its tasks
                values["exit_code"] = None
            values["state"] = out.state.value
            values["updated_at"] = now
        if isinstance(job, JobRow):
            for name, value in values.items():
                setattr(job, name, value)
            s.add(job)
            if values.get("state") in plain.ENDED_STATES:
                plain.note_ended(s, job.id)
        elif values:
            plain.update_job(s, job.id, **values)
        if out.retry:
            self._event(s, "retry", job_id=job.id, message=out.note)
        return str(values.get("state", job.state))

    def _event(self, s: Session, kind: str, *, job_id: str | None = None, task_id: str | None = None,
               worker_id: str | None = None, message: str = "") -> None:
        """Record an event of the history ``gpulayer jobs show`` and ``events`` read."""
        queries.add_event(s, ts=self.clock(), kind=kind, job_id=job_id, task_id=task_id,
                          worker_id=worker_id, message=message)

    def _changed(self) -> None:
        """Announce what this thread committed: to the waits of this process (with the jobs
        its transactions ended: :meth:`Store.take_ended`), and by a nudge to those of others."""
        ended = self.store.take_ended()
        with self._news_lock:
            self._generation += 1
            self._ended_log.append((self._generation, ended))
            self._job_news.notify_all()
            self._progress_news.notify_all()  # (a follower answers when its job's state changed)
        for o in self._observers:
            o.on_change()
        if self.store.nudges is not None:  # and the waits of other processes on this database
            news: set[str] = getattr(self._pending, "news", set())
            self._pending.news = set()
            size = sum(len(n) + 1 for n in news)
            if size > MAX_NEWS - 2:  # (and "j")
                news, size = {_ANY_WORKER}, 2  # (more polls than a nudge names: all of them look)
            named = [_ENDED + job_id for job_id in ended]
            if size + sum(len(n) + 1 for n in named) > MAX_NEWS - 2:  # (and "J")
                news.add(_JOBS)  # (more than a nudge names: their waits look)
            else:
                news.update((_JOBS_NAMED, *named))
            self.store.nudges.send(news, self._nudged)

    def _nudged(self, news: set[str]) -> None:
        """Another process (or control plane) committed a change: the waits its news concern
        look again (job waits; the polls of the workers named, or of all)."""
        with self._news_lock:
            g = self._worker_generation
            jobs = work = progress = False
            ended: set[str] = set()
            for item in news:
                if item in (_JOBS, _JOBS_NAMED):
                    jobs = True
                elif item.startswith(_ENDED):
                    ended.add(item[len(_ENDED):])
                elif item.startswith(_PROGRESS):
                    self._count_progress(item[len(_PROGRESS):])
                    progress = True
                elif item == _ANY_WORKER:
                    self._work_generation += 1
                    work = True
                elif item.startswith(("w:", "e:")):
                    key = item[2:] if item[0] == "w" else f"{item[2:]}:end"
                    g[key] = g.get(key, 0) + 1
                    work = True
            if jobs:
                self._generation += 1
                self._ended_log.append((self._generation, None if _JOBS in news else frozenset(ended)))
                self._job_news.notify_all()
            if jobs or progress:
                self._progress_news.notify_all()
            if work:
                self._work_news.notify_all()

    def _progressed(self, job_id: str, *, output: bool = True) -> None:
        """Announce the job's progress (new ``output`` committed, or else its task started):
        to the waits for its logs in this process and the observers
        (ControlObserver.on_progress), and for output to the waits of other processes (no
        job's wait, no poll; a task's start is not sent to them: see start_task)."""
        with self._news_lock:
            self._count_progress(job_id)
            self._progress_news.notify_all()
        for o in self._observers:
            o.on_progress(job_id, output=output)
        if output and self.store.nudges is not None:
            self.store.nudges.send({_PROGRESS + job_id}, self._nudged)

    def _count_progress(self, job_id: str) -> None:
        """(With ``_news_lock`` held.) Count the job's progress; the count of the job whose
        progress is the oldest goes past :data:`ENDED_KEPT` jobs (a wait for its logs then
        takes it for news, and looks once for nothing)."""
        counts = self._progress_count
        counts[job_id] = counts.pop(job_id, 0) + 1
        if len(counts) > ENDED_KEPT:
            del counts[next(iter(counts))]

    def _progress_of(self, job_id: str) -> tuple[int, int]:
        """What a wait for the job's logs compares to see whether it has news: the changes
        (the job's state may have), and its progress."""
        return self._generation, self._progress_count.get(job_id, 0)

    def _ended_since(self, generation: int) -> frozenset[str] | None:
        """The jobs that the changes counted after ``generation`` ended; None when one of
        them did not say, or is no longer remembered."""
        with self._news_lock:
            if self._generation == generation:
                return frozenset()
            out: set[str] = set()
            for counted, ended in reversed(self._ended_log):
                if counted <= generation:
                    return frozenset(out)
                if ended is None:
                    return None
                out |= ended
            return None  # (the first of them is no longer remembered)

    def _hear_nudges(self) -> None:
        """Before a wait: from now on other processes' changes end it at once, not at its
        next look (:mod:`gpulayer.store.nudges`)."""
        if not self._nudged_too and self.store.nudges is not None:
            self._nudged_too = True
            self.store.nudges.subscribe(self._nudged)

    def _work_changed(self, worker_ids: frozenset[str] | None = None, *, ends: bool = False) -> None:
        """Wake the polls of these workers (None: of every worker); ``ends``: they have
        tasks to end (else: tasks to start)."""
        with self._news_lock:
            if worker_ids is None:
                self._work_generation += 1
            else:
                for wid in worker_ids:
                    key = f"{wid}:end" if ends else wid
                    self._worker_generation[key] = self._worker_generation.get(key, 0) + 1
            self._work_news.notify_all()
        if self.store.nudges is not None:  # the polls of other processes, at the next _changed
            pending = getattr(self._pending, "news", None)
            if pending is None:
                pending = self._pending.news = set()
            if worker_ids is None:
                pending.add(_ANY_WORKER)
            else:
                pending.update(("e:" if ends else "w:") + wid for wid in worker_ids)

    def _work_of(self, worker_id: str) -> tuple[int, int, int]:
        """What a poll of ``worker_id`` compares to see whether it has news: changes for every
        worker, tasks for it to start, tasks for it to end."""
        g = self._worker_generation
        return self._work_generation, g.get(worker_id, 0), g.get(f"{worker_id}:end", 0)

    def _wait_change(self, generation: int, timeout: float) -> None:
        """Sleep until a change after ``generation`` (read before the caller's last look at
        the database) or ``timeout`` seconds: waiters in this process wake at once, and the
        timeout bounds how late a change made by another process that cannot nudge this one
        is noticed."""
        self._hear_nudges()
        with self._news_lock:
            self._job_news.wait_for(lambda: self._generation != generation, timeout)

    def _wait_work(self, worker_id: str, seen: tuple[int, int, int], timeout: float) -> None:
        """:meth:`_wait_change` for a worker's poll: only news for ``worker_id`` wakes it."""
        self._hear_nudges()
        with self._news_lock:
            self._work_news.wait_for(lambda: self._work_of(worker_id) != seen, timeout)

    def _wait_progress(self, job_id: str, seen: tuple[int, int], timeout: float) -> None:
        """:meth:`_wait_change` for a wait for the job's logs: a change, or its progress,
        after ``seen`` (:meth:`_progress_of` read before the caller's last look) wakes it."""
        self._hear_nudges()
        with self._news_lock:
            self._progress_news.wait_for(lambda: self._progress_of(job_id) != seen, timeout)

    def _cancelled_on(self, worker_ids: frozenset[str]) -> None:
        """Tell the long polls of these workers that they have tasks to end."""
        if not worker_ids:
            return
        self._work_changed(worker_ids, ends=True)
        for o in self._observers:
            o.on_cancel(worker_ids)

    def counts(self) -> dict[str, Any]:
        """Figures for metrics: jobs by state, workers online, queue depth."""
        with self.store.read() as s:
            by_state = queries.job_counts(s)
            online = queries.online_worker_count(s)
        return {"jobs": by_state, "workers_online": online, "queue_depth": by_state.get("queued", 0)}


def _assigned(result: scheduling.PlacementResult | None) -> frozenset[str]:
    """The workers a placement pass gave tasks to."""
    if result is None:
        return frozenset()
    return frozenset(n.worker_id for a in result.assignments for n in a.nodes)


def _view(job: JobRow | plain.Job) -> lifecycle.JobView:
    return lifecycle.JobView(state=JobState(job.state), attempt=job.attempt, max_attempts=job.max_attempts,
                             cancel_requested=job.cancel_requested, error=mapping.error_of(job.error))


def _on_node(error: JobError, node_rank: int, worker_id: str) -> JobError:
    """A group's error: its root node's, saying which node and worker it came from (the
    node's own words say "this worker", "exit code 1"); the task keeps them as they were."""
    where = f"node {node_rank} (worker {worker_id}): "
    return error.model_copy(update={"message": (where + error.message)[:MAX_ERROR_MESSAGE]})
