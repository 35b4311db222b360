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
import secrets
from collections.abc import Callable, Sequence

from sqlmodel import Session

from gpulayer import config, scheduling
from gpulayer.hookrecords import MachineOffer, Rendezvous
from gpulayer.records import JobError, JobState, PlacementDecision, TaskState, closest_line, new_id
from gpulayer.scheduling import nearest
from gpulayer.scheduling.shapes import Shape, shape_of
from gpulayer.specs import JobSpec
from gpulayer.store import JobRow, TaskRow, mapping, queries

#: records an event in the transaction: ``event(s, kind, job_id=..., message=...)``
EventSink = Callable[..., None]

#: where rendezvous ports are drawn from by default: below the ephemeral ranges of Linux
#: (32768-60999) and macOS (49152-65535), so an outgoing connection on rank 0's host cannot
#: hold the port
RENDEZVOUS_PORTS = (20000, 32767)


def run(s: Session, now: float, *, reserve_after: float, event: EventSink,
        offers: Sequence[MachineOffer] = ()) -> scheduling.PlacementResult | None:
    """One pass over the whole queue; None when nothing is queued. ``offers``: the providers'
    cached offers (a cloud job that fits one waits for its machine)."""
    rows = queries.queued_jobs(s)
    if not rows:
        return None
    specs = {r.id: mapping.spec(r.spec) for r in rows}
    queue = [scheduling.QueuedJob(id=r.id, spec=specs[r.id], seq=i, queued_at=r.updated_at or r.created_at)
             for i, r in enumerate(rows)]
    workers = fleet(s)
    result = scheduling.place(queue, workers, now, reserve_after=reserve_after, offers=offers)
    by_id = {r.id: r for r in rows}
    addresses = {w.record.id: w.record.capabilities.host.address for w in workers}
    for a in result.assignments:
        assign(s, by_id[a.job_id], specs[a.job_id], a, addresses, result.decisions.get(a.job_id), now, event)
    assigned = {a.job_id for a in result.assignments}
    hints = Hints(workers)
    for job_id, decision in result.decisions.items():
        if job_id not in assigned:
            record_decision(s, by_id[job_id], specs[job_id], decision, now, event, hints=hints)
    return result


class Hints:
    """What the message of an unschedulable job ends with: the nearest miss in this pass's
    fleet (once per job shape) and the command that explains the rest."""

    def __init__(self, workers: list[scheduling.WorkerState]) -> None:
        self._workers = workers
        self._closest: dict[Shape, str | None] = {}

    def __call__(self, job_id: str, spec: JobSpec) -> list[str]:
        shape = shape_of(spec)
        if shape not in self._closest:
            self._closest[shape] = closest_line(nearest.closest(spec, self._workers))
        line = self._closest[shape]
        return [*([line] if line else []), f"run: gpulayer jobs explain {job_id}"]


def fleet(s: Session) -> list[scheduling.WorkerState]:
    """The online workers with what their active tasks hold (devices, CPU slots)."""
    states = {w.id: scheduling.WorkerState(record=mapping.worker_record(w))
              for w in queries.workers(s, online_only=True)}
    for t in queries.active_tasks(s):
        ws = states.get(t.worker_id)
        if ws is None:
            continue
        devices = json.loads(t.devices)
        if t.accelerator and devices:
            ws.busy_devices.update((t.accelerator, i) for i in devices)
        else:
            ws.busy_cpu_slots += 1
    return list(states.values())


def assign(s: Session, job: JobRow, spec: JobSpec, a: scheduling.Assignment, addresses: dict[str, str],
           decision: PlacementDecision | None, now: float, event: EventSink) -> None:
    job.attempt += 1
    job.state = JobState.ASSIGNED.value
    job.updated_at = now
    rdzv = None
    if spec.kind == "distributed":
        rank0 = next(n for n in a.nodes if n.node_rank == 0)
        rdzv = Rendezvous(master_addr=addresses.get(rank0.worker_id, "127.0.0.1"),
                          master_port=rendezvous_port(), nnodes=len(a.nodes),
                          run_id=f"{job.id}-{job.attempt}")
    for n in a.nodes:
        queries.add_task(s, TaskRow(
            id=new_id("tsk"), job_id=job.id, attempt=job.attempt, node_rank=n.node_rank,
            worker_id=n.worker_id, accelerator=n.accelerator, devices=json.dumps(n.devices),
            state=TaskState.ASSIGNED.value, created_at=now,
            rendezvous=rdzv.model_dump_json() if rdzv else None,
        ))
    job.decision = decision.model_dump_json() if decision else None
    s.add(job)
    event(s, "assigned", job_id=job.id, message=", ".join(f"{n.worker_id}{n.devices or ''}" for n in a.nodes))


def record_decision(s: Session, job: JobRow, spec: JobSpec, decision: PlacementDecision, now: float,
                    event: EventSink, *, hints: Hints | None = None) -> None:
    if decision.outcome == "unschedulable" and spec.placement.on_unschedulable == "fail" and job.attempt == 0:
        job.state = JobState.UNSCHEDULABLE.value
        job.updated_at = now
        job.decision = decision.model_dump_json()
        job.error = JobError.unschedulable(decision, hints(job.id, spec) if hints else ()).model_dump_json()
        s.add(job)
        event(s, "unschedulable", job_id=job.id, message=decision.summary)
        return
    if decision.outcome == "unschedulable" and job.attempt > 0:  # it waits (see above): say so
        decision = decision.model_copy(update={
            "outcome": "waiting",
            "summary": f"waiting for a worker: attempt {job.attempt} ran, but {decision.summary.removeprefix('scheduling: ')}"})
    # rewrite the stored decision only when it says something new (not just a new time)
    stored = mapping.decision_of(job.decision)
    if stored is None or stored.model_copy(update={"at": decision.at}) != decision:
        job.decision = decision.model_dump_json()
        s.add(job)


def rendezvous_port() -> int:
    """A port for rank 0 of a distributed job, from ``GPULAYER_RENDEZVOUS_PORTS``."""
    low, high = config.settings().rendezvous_ports
    return low + secrets.randbelow(high - low + 1)


__all__ = ["RENDEZVOUS_PORTS", "Hints", "assign", "fleet", "record_decision", "rendezvous_port", "run"]
