"""The I/O of a placement pass: load the queue and the fleet, call the pure scheduler
(:func:`gpulayer.scheduling.place`), and write what it decided, in the caller's transaction.

Writing a decision: an assigned job gets a new attempt and one ``assigned`` task per node
(with the rendezvous facts a distributed job's nodes share); a job no worker could ever
run and that asked to fail becomes ``unschedulable`` with the scheduler's reasons as its
error, followed by the nearest miss (:mod:`gpulayer.scheduling.nearest`) and the
``gpulayer jobs explain`` command to run; any other job keeps waiting, and its stored
decision is rewritten only when it says something new. A job that was placed before (a
retry after its worker died or failed) never becomes unschedulable: it was runnable, so it
waits for a worker to come (back).
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
from collections.abc import Callable, Collection, Mapping, Sequence

from sqlmodel import Session

from gpulayer import config, scheduling
from gpulayer.control.fleetcache import FleetCache, Holding, add_holdings
from gpulayer.hookrecords import MachineOffer, Rendezvous
from gpulayer.pids import pid_alive
from gpulayer.records import JobError, JobState, PlacementDecision, TaskState, closest_line, new_id
from gpulayer.scheduling import nearest
from gpulayer.scheduling.shapes import Shape, shape_of
from gpulayer.specs import JobSpec
from gpulayer.store import mapping, marks, plain, queries

log = logging.getLogger("gpulayer.control")

#: records an event in the transaction: ``event(s, kind, job_id=..., message=...)``
EventSink = Callable[..., None]

#: where rendezvous ports are drawn from by default: below the ephemeral ranges of Linux
#: (32768-60999) and macOS (49152-65535), so an outgoing connection on rank 0's host cannot
#: hold the port
RENDEZVOUS_PORTS = (20000, 32767)


class Cache:
    """What a placement pass may keep between passes: each queued job's parsed spec (a spec
    never changes once stored), the comparable form of its stored decision, and the fleet
    (:class:`~gpulayer.control.fleetcache.FleetCache`: trusted while the database's change
    marks say it did not change). Entries of jobs that left the queue are dropped at the
    next whole pass. Several control planes sharing one database keep their own; nothing
    here can go stale: a spec or decision entry is used only for the very text it was parsed
    from, and the fleet only while the marks are the ones it was read (or changed) with."""

    def __init__(self) -> None:
        self.specs: dict[str, JobSpec] = {}
        #: job id -> (the stored decision's text, that decision without its time, as JSON)
        self.decisions: dict[str, tuple[str, str]] = {}
        self.workers = FleetCache()

    def fleet(self, s: Session) -> tuple[list[scheduling.WorkerState], bool]:
        """The fleet for a pass, and whether it has room (:func:`has_room`): see
        :meth:`FleetCache.fleet`. These records carry no heartbeat time (0.0): placement
        never reads it, and heartbeats change it every few seconds on every worker."""
        return self.workers.fleet(s)

    def load(self, s: Session, job_ids: list[str], *, keep_others: bool = False) -> dict[str, JobSpec]:
        """The specs of ``job_ids`` (the queue); ``keep_others``: a pass over a part of it."""
        if not keep_others:
            live = set(job_ids)
            self.specs = {k: v for k, v in self.specs.items() if k in live}
            self.decisions = {k: v for k, v in self.decisions.items() if k in live}
        missing = [j for j in job_ids if j not in self.specs]
        if missing:
            for job_id, raw in queries.job_specs(s, missing).items():
                self.specs[job_id] = mapping.spec(raw)
        return self.specs

    def forget(self, job_ids: set[str]) -> None:
        """Jobs that left the queue (a pass over a part of it does not see them go)."""
        for job_id in job_ids:
            self.specs.pop(job_id, None)
            self.decisions.pop(job_id, None)

    def same_decision(self, job_id: str, stored: str | None, decision: PlacementDecision) -> bool:
        """Whether ``decision`` says what the stored one says (its time aside)."""
        if stored is None:
            return False
        known = self.decisions.get(job_id)
        if known is None or known[0] != stored:
            parsed = mapping.decision_of(stored)
            if parsed is None:
                return False
            known = (stored, parsed.model_dump_json(exclude={"at"}))
            self.decisions[job_id] = known
        return known[1] == decision.model_dump_json(exclude={"at"})


def run(s: Session, now: float, *, reserve_after: float, event: EventSink,
        cache: Cache | None = None, new_job: str | None = None,
        offers: Sequence[MachineOffer] = (), offer_rooms: Mapping[str, float] | None = None,
        until_full: bool = False, providers_down: Callable[[], list[str]] | None = None
        ) -> scheduling.PlacementResult | None:
    """One pass over the whole queue; None when nothing is queued.

    Only the jobs it changes are loaded as rows (those assigned, and those whose decision
    says something new): with a long queue that waits, a pass reads a few columns per job.

    ``new_job`` (a submit): when no online worker has a free CPU slot or device, nothing
    can be assigned, and the jobs already queued were decided against this same fleet at
    the last change of its capacity (every such change runs a pass): only the new job is
    decided. Otherwise the whole queue is, as always. ``until_full``: a task ended (only
    capacity changed): the pass stops once the fleet is full (:func:`scheduling.place`),
    and reads only as much of the queue's head as it gets to (:func:`_until_full`).
    The fleet is read only when the database's change marks say it changed
    (:mod:`gpulayer.control.fleetcache`).

    ``offers``: the providers' cached offers (a cloud job that fits one waits for its machine),
    ``offer_rooms`` the most machines each provider brings up for one job; ``providers_down``:
    the providers that offer nothing now, with why (asked only when a cloud job fails)."""
    cache = cache if cache is not None else Cache()
    if until_full and new_job is None:
        head = queries.queue_head(s, HEAD)
        if not head:
            return None
        workers, room = cache.fleet(s)
        keys, specs, result = _until_full(s, cache, workers, now, reserve_after, offers, offer_rooms, head)
    else:
        if new_job is None and not queries.has_queued_jobs(s):
            return None
        workers, room = cache.fleet(s)
        keys = queries.queue_keys(s, new_job if new_job is not None and not room else None)
        if not keys:
            return None
        specs = cache.load(s, [k[0] for k in keys], keep_others=len(keys) == 1 and new_job is not None)
        result = scheduling.place(_queue(keys, specs), workers, now, reserve_after=reserve_after, offers=offers,
                                  offer_rooms=offer_rooms, until_full=until_full)
    assigned = {a.job_id for a in result.assignments}
    waiting = [(job_id, attempt, stored) for job_id, _, _, attempt, stored in keys
               if job_id not in assigned and job_id in result.decisions]
    if until_full and new_job is None and waiting:  # the head's rows came without their decisions
        stored_of = queries.job_decisions(s, [job_id for job_id, _, _ in waiting])
        waiting = [(job_id, attempt, stored_of.get(job_id)) for job_id, attempt, _ in waiting]
    changed = []
    for job_id, attempt, stored in waiting:
        final = settled(specs[job_id], attempt, result.decisions[job_id])
        if final is None or not cache.same_decision(job_id, stored, final):
            changed.append(job_id)
    rows = plain.jobs_by_id(s, [*assigned, *changed]) if assigned or changed else {}
    addresses = ({w.record.id: w.record.capabilities.host.address for w in workers}
                 if any(specs[a.job_id].kind == "distributed" for a in result.assignments) else {})
    added: list[tuple[str, Holding]] = []
    for a in result.assignments:
        added += assign(s, rows[a.job_id], specs[a.job_id], a, addresses, result.decisions.get(a.job_id), now, event)
    hints = Hints(workers, providers_down)
    for job_id in changed:
        record_decision(s, rows[job_id], specs[job_id], result.decisions[job_id], now, event, hints=hints)
    cache.forget(assigned)  # they left the queue
    cache.workers.assigned(s, added)
    return result


#: how many jobs of the queue's head a pass after a task ended reads first (then 16 times
#: as many, and so on, while the fleet still has room after all of them). A task's end
#: frees one slot or a node's devices, which the first job that fits takes: under a long
#: queue of small jobs, a head of 64 read, parsed and built 64 jobs a pass to place one
#: (a quarter of a local worker's Python time a job at 1,000 no-op jobs queued)
HEAD = 8


def _queue(keys: Sequence[tuple[str, float, float | None, int, str | None]],
           specs: dict[str, JobSpec]) -> list[scheduling.QueuedJob]:
    return [scheduling.QueuedJob(id=job_id, spec=specs[job_id], seq=i, queued_at=updated or created)
            for i, (job_id, created, updated, _, _) in enumerate(keys)]


def _until_full(s: Session, cache: Cache, workers: list[scheduling.WorkerState], now: float, reserve_after: float,
                offers: Sequence[MachineOffer], offer_rooms: Mapping[str, float] | None,
                head: list[tuple[str, float, float | None, int, str | None]]
                ) -> tuple[list[tuple[str, float, float | None, int, str | None]], dict[str, JobSpec],
                           scheduling.PlacementResult]:
    """A pass that stops once the fleet is full, over the head of the queue only.

    ``place`` decides each job from the fleet and the jobs before it in placement order
    alone, so a pass over the first ``n`` jobs decides them as a pass over the whole queue
    would; if the fleet still has room after all ``n``, the pass runs again over a longer
    head, up to the whole queue. The rows come in placement order (priority, then
    submission), so ``seq`` keeps it. ``head``: the first :data:`HEAD` rows, read already
    (without their stored decisions: the caller reads those of the jobs that keep waiting)."""
    limit, keys = HEAD, head
    while True:
        specs = cache.load(s, [k[0] for k in keys], keep_others=True)
        result = scheduling.place(_queue(keys, specs), workers, now, reserve_after=reserve_after, offers=offers,
                                  offer_rooms=offer_rooms, until_full=True)
        if len(keys) < limit or len(result.decisions) < len(keys):  # the whole queue, or it filled up
            return keys, specs, result
        limit *= 16
        keys = queries.queue_head(s, limit)


def settled(spec: JobSpec, attempt: int, decision: PlacementDecision) -> PlacementDecision | None:
    """The decision a waiting job keeps; None when the job fails as unschedulable instead."""
    if decision.outcome == "unschedulable" and spec.placement.on_unschedulable == "fail" and attempt == 0:
        return None
    if decision.outcome == "unschedulable" and attempt > 0:  # it waits (see the module doc): say so
        return decision.model_copy(update={
            "outcome": "waiting",
            "summary": f"waiting for a worker: attempt {attempt} ran, but {decision.summary.removeprefix('scheduling: ')}"})
    return decision


class Hints:
    """What the message of an unschedulable job ends with: the workers it waited for that
    left before it started (:func:`departed`), for a job that lists the cloud target the
    providers that offer nothing now and why (``provider q: credentials failed: ...``, as
    ``explain`` lists them), the nearest miss in this pass's fleet (once per job shape) and
    the command that explains the rest."""

    def __init__(self, workers: list[scheduling.WorkerState],
                 providers_down: Callable[[], list[str]] | None = None) -> None:
        self._workers = workers
        self._online = {w.record.id for w in workers}
        self._closest: dict[Shape, str | None] = {}
        self._providers_down = providers_down
        self._down: list[str] | None = None

    def __call__(self, job_id: str, spec: JobSpec, *, s: Session | None = None, stored: str | None = None) -> list[str]:
        shape = shape_of(spec)
        if shape not in self._closest:
            self._closest[shape] = closest_line(nearest.closest(spec, self._workers))
        line = self._closest[shape]
        left = departed(s, mapping.decision_of(stored), self._online) if s is not None and stored else []
        if self._providers_down is not None and "cloud" in spec.placement.targets:
            if self._down is None:
                self._down = [f"provider {down}" for down in self._providers_down()]
            left += self._down
        return [*left, *([line] if line else []), f"run: gpulayer jobs explain {job_id}"]


#: the reasons a waiting job's decision gives for a worker that could run it
_COMPATIBLE = frozenset({"busy", "reserved", "free"})


def departed(s: Session, stored: PlacementDecision | None, online: set[str]) -> list[str]:
    """One line for each worker that ``stored`` (the job's decision before this pass) says
    could run it, and that has left the fleet since: the job waited for it, and it fails as
    unschedulable now because that worker went, not because none was ever there. A local
    worker whose process is gone (a script with its own worker, killed with SIGKILL) is
    named with its pid."""
    if stored is None or stored.outcome != "waiting":
        return []
    lines = []
    here = socket.gethostname()
    for wid in dict.fromkeys(r.worker for r in stored.reasons if r.code in _COMPATIBLE and r.worker not in online):
        row = queries.find_worker(s, wid)
        if row is not None and row.origin == "local" and row.hostname == here and row.pid and not pid_alive(row.pid):
            lines.append(f"{wid}: the worker that would run it, in process {row.pid}, exited before it started")
        else:
            lines.append(f"{wid}: the worker that would run it left before it started")
    return lines


def has_room(workers: list[scheduling.WorkerState]) -> bool:
    """Whether any online worker that takes work has a free CPU slot or device."""
    return any(not (w.record.draining or w.record.paused) and (w.record.cpu_slots > w.busy_cpu_slots
                                          or len(w.record.capabilities.devices) > len(w.busy_devices))
               for w in workers)


def fleet(s: Session) -> list[scheduling.WorkerState]:
    """The online workers with what their active tasks hold (devices, CPU slots)."""
    states = {w.id: scheduling.WorkerState(record=mapping.worker_record(w))
              for w in queries.workers(s, online_only=True)}
    add_holdings(states, [(w, a, d) for _, w, a, d in marks.active_holdings(s)])
    return list(states.values())


def assign(s: Session, job: plain.Job, spec: JobSpec, a: scheduling.Assignment, addresses: dict[str, str],
           decision: PlacementDecision | None, now: float, event: EventSink) -> list[tuple[str, Holding]]:
    """Hand ``job`` its tasks; returns what they hold, by task id."""
    attempt = job.attempt + 1
    rdzv = None
    if spec.kind == "distributed":
        rank0 = next(n for n in a.nodes if n.node_rank == 0)
        master_addr = addresses.get(rank0.worker_id, "127.0.0.1")
        rdzv = Rendezvous(master_addr=master_addr, master_port=rendezvous_port(held_ports(s, master_addr, job.id)),
                          nnodes=len(a.nodes),
                          run_id=f"{job.id}-{attempt}")
    tasks = [plain.Task(
        id=new_id("tsk"), job_id=job.id, attempt=attempt, node_rank=n.node_rank, worker_id=n.worker_id,
        accelerator=n.accelerator, devices=json.dumps(n.devices), state=TaskState.ASSIGNED.value, created_at=now,
        started_at=None, ended_at=None, exit_code=None, error=None,
        rendezvous=rdzv.model_dump_json() if rdzv else None,
    ) for n in a.nodes]
    plain.insert_tasks(s, tasks)
    plain.update_job(s, job.id, attempt=attempt, state=JobState.ASSIGNED.value, updated_at=now,
                     decision=decision.model_dump_json() if decision else None)
    event(s, "assigned", job_id=job.id, message=", ".join(f"{n.worker_id}{n.devices or ''}" for n in a.nodes))
    return [(t.id, (t.worker_id, t.accelerator, t.devices)) for t in tasks]


def record_decision(s: Session, job: plain.Job, spec: JobSpec, decision: PlacementDecision, now: float,
                    event: EventSink, *, hints: Hints | None = None) -> None:
    final = settled(spec, job.attempt, decision)
    if final is None:
        error = JobError.unschedulable(decision, hints(job.id, spec, s=s, stored=job.decision) if hints else ())
        plain.update_job(s, job.id, state=JobState.UNSCHEDULABLE.value, updated_at=now,
                         decision=decision.model_dump_json(), error=error.model_dump_json())
        event(s, "unschedulable", job_id=job.id, message=decision.summary)
        return
    # rewrite the stored decision only when it says something new (not just a new time)
    stored = mapping.decision_of(job.decision)
    if stored is None or stored.model_copy(update={"at": final.at}) != final:
        plain.update_job(s, job.id, decision=final.model_dump_json())


def held_ports(s: Session, master_addr: str, job_id: str) -> set[int]:
    """The rendezvous ports a new attempt of ``job_id`` at ``master_addr`` must not take: those
    of the active groups whose rank 0 is at that address (two groups on one port: the second's
    torchrun fails to listen, or its nodes meet the first's store), and those of the job's
    earlier attempts (what a lost node left running may still hold one)."""
    rows = plain.fetch(s, "SELECT rendezvous, job_id FROM gl_tasks WHERE node_rank = 0 AND rendezvous IS NOT NULL"
                          " AND (state IN (?, ?) OR job_id = ?)",
                       (TaskState.ASSIGNED.value, TaskState.RUNNING.value, job_id))
    held = set()
    for text, owner in rows:
        try:
            rdzv = Rendezvous.model_validate_json(text)
        except ValueError:
            continue
        if owner == job_id or rdzv.master_addr == master_addr:
            held.add(rdzv.master_port)
    return held


def rendezvous_port(held: Collection[int] = ()) -> int:
    """A port for rank 0 of a distributed job, from ``GPULAYER_RENDEZVOUS_PORTS``, at random
    among those not ``held``; when the range has none free, at random among all of them."""
    low, high = config.settings().rendezvous_ports
    taken = {p for p in held if low <= p <= high}
    free = high - low + 1 - len(taken)
    if free <= 0:
        log.warning("every port of GPULAYER_RENDEZVOUS_PORTS=%d-%d is held by a running distributed job at this "
                    "address (or an earlier attempt of this one): one is given twice; widen the range", low, high)
        return low + secrets.randbelow(high - low + 1)
    if free * 2 >= high - low + 1:  # mostly free: a draw or two
        while True:
            port = low + secrets.randbelow(high - low + 1)
            if port not in taken:
                return port
    return secrets.choice([p for p in range(low, high + 1) if p not in taken])


__all__ = ["RENDEZVOUS_PORTS", "Cache", "Hints", "assign", "departed", "fleet", "has_room", "held_ports",
           "record_decision", "rendezvous_port", "run", "settled"]
