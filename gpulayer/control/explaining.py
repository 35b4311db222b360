"""The I/O of ``explain``: load what a placement pass would see, ask the pure scheduler what
it would decide for one job and what comes closest (:mod:`gpulayer.scheduling.nearest`),
and add what only the store knows: what busy workers are running and until when, the job's
place in the queue, and the provider offers that would fit. Nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpulayer import provisioning, scheduling
from gpulayer.control import placement
from gpulayer.control.jobs import refuse_cloud_only
from gpulayer.hookrecords import MachineOffer
from gpulayer.records import (
    Explanation,
    JobState,
    OfferFit,
    RunningTask,
    TaskState,
    WorkerExplanation,
    WorkerRecord,
)
from gpulayer.scheduling import nearest
from gpulayer.scheduling.fleet import offer_record
from gpulayer.specs import CHECKED, JobSpec
from gpulayer.store import JobRow, MachineRow, TaskRow, mapping, queries

if TYPE_CHECKING:
    from gpulayer.control import ControlPlane

#: the id of the job a placement pass is asked about (never stored)
EXPLAINED = "(explained)"


def explain(plane: ControlPlane, spec: JobSpec | None, *, job_id: str | None = None, owner: str | None = None,
            prospective: Sequence[WorkerRecord] = ()) -> Explanation:
    """What placement would say about ``spec`` now, or about the stored job ``job_id``'s spec.
    ``owner``: the caller's token id (None: admin or in-process), whose jobs alone are named
    on busy workers; ``prospective``: workers the caller would start before submitting."""
    now = plane.clock()
    with plane.store.read() as s:
        job = queries.job(s, job_id) if job_id is not None else None
        fleet = placement.fleet(s)
        tasks = queries.active_tasks(s)
        holders = queries.jobs_by_id(s, (t.job_id for t in tasks))
        queue = queries.queued_jobs(s)
        machines = queries.machines(s, live_only=True) if plane.providers is not None else []
    if job is not None:
        spec = mapping.spec(job.spec)
    if spec is None:
        raise TypeError("explain needs a spec or a job id")
    if job is None:
        refuse_cloud_only(plane.serving, spec)  # (as submit refuses it: explain must not say "would fail")
    fleet.extend(scheduling.WorkerState(record=r) for r in prospective)
    offers = provider_offers(plane, spec)
    fitting = [o for o in offers or [] if not scheduling.check(spec, offer_record(o))]
    fitting.sort(key=lambda o: (o.price_per_hour is None, o.price_per_hour or 0.0, o.boot_seconds or 0.0))
    barred = {id(o): plane.providers.barred(o) for o in fitting} if plane.providers is not None else {}
    job_id = job.id if job is not None else EXPLAINED
    result = scheduling.place([scheduling.QueuedJob(id=job_id, spec=spec, seq=0, queued_at=now)], fleet, now,
                              reserve_after=None, offers=provisioning.waited_for(
                                  [o for o in fitting if barred.get(id(o)) is None],
                                  plane.providers.blocks.active(now) if plane.providers is not None else {}, now),
                              offer_rooms=plane.providers.offer_rooms() if plane.providers is not None else None)
    survey = nearest.survey(spec, fleet)
    by_worker: dict[str, list[TaskRow]] = {}
    for t in tasks:
        if not t.lent:  # (a task that waits lent its slot: it holds nothing, see .lending)
            by_worker.setdefault(t.worker_id, []).append(t)
    states = {w.record.id: w for w in fleet}
    for view in survey.workers:
        held = by_worker.get(view.worker, [])
        view.running = [_running(t, holders.get(t.job_id), owner) for t in held]
        if view.status == "busy":
            view.frees_at = frees_at(view, states[view.worker], spec, view.running)
    # (the spec was validated already, stored or from the caller: see specs.CHECKED)
    return Explanation.model_validate(dict(
        job_id=job.id if job is not None else None,
        state=JobState(job.state) if job is not None else None,
        spec=spec,
        decision=result.decisions[job_id],
        stored_decision=mapping.decision_of(job.decision) if job is not None else None,
        queue_position=queue_position(queue, spec, job),
        workers=survey.workers,
        offers=None if offers is None else [_held_back(plane, _fit(o, barred.get(id(o))), o, now, machines)
                                            for o in fitting],
        unfit_offers=_unfit(plane, spec, fitting), providers_down=_down(plane),
        closest=survey.closest,
        relaxations=survey.relaxations,
        at=now,
    ), context=CHECKED)


def provider_offers(plane: ControlPlane, spec: JobSpec) -> list[MachineOffer] | None:
    """The provider offers for the job's requirements (from the offers cache); None when
    this control plane has no providers to ask."""
    if plane.providers is None:
        return None
    return list(plane.offers(spec.requirements, barred=True))


def _fit(o: MachineOffer, never: str | None, unfit: str | None = None) -> OfferFit:
    return OfferFit(provider=o.provider, shape=o.shape, region=o.region, price_per_hour=o.price_per_hour,
                    spot=o.spot, availability=o.availability, never_launched=never, unfit=unfit)


def _held_back(plane: ControlPlane, fit: OfferFit, offer: MachineOffer, now: float,
               machines: Sequence[MachineRow]) -> OfferFit:
    """``fit`` with what keeps ``offer`` from being launched now though it fits the job: a
    failure that blocked its scope (until when, and why), or no room (its provider's
    ``max_machines`` reached, or its own ``capacity``), read from the machines not ended."""
    ps = plane.providers
    assert ps is not None
    update: dict[str, Any] = {}
    until = ps.blocks.active(now).get(offer.scope)
    if until is not None:
        update.update(blocked_until=until, blocked_why=ps.blocks.why.get(offer.scope) or None)
    configured = ps.configured.get(offer.provider)
    if configured is not None:
        cap = configured.limits.max_machines
        up = sum(1 for m in machines if m.provider == offer.provider)
        in_scope = sum(1 for m in machines if m.provider == offer.provider and m.shape == offer.shape
                       and m.region == offer.region)
        if 0 < cap <= up:
            update["no_room"] = (f"provider {offer.provider} has {up} of its max_machines = {cap} machines up; "
                                 "a machine is launched once one of them ends")
        elif offer.capacity is not None and in_scope >= offer.capacity:
            update["no_room"] = (f"{in_scope} machine(s) of it are up, its capacity; a machine is launched once "
                                 "one of them ends")
    return fit.model_copy(update=update) if update else fit


def _unfit(plane: ControlPlane, spec: JobSpec, fitting: list[MachineOffer]) -> list[OfferFit]:
    """Every cached offer that is not one of ``fitting``, with the first reason it could never
    run the job (the reasons a placement pass gives against it)."""
    if plane.providers is None:
        return []
    fit = {(o.provider, o.shape, o.region) for o in fitting}
    out = []
    for o in plane.providers.cached_offers(barred=True):
        if (o.provider, o.shape, o.region) in fit:
            continue
        reasons = scheduling.check(spec, offer_record(o))
        if reasons:
            out.append(_fit(o, plane.providers.barred(o), unfit=reasons[0].message))
    return out


def _down(plane: ControlPlane) -> list[str]:
    """The providers that offer nothing now, each with why."""
    return [] if plane.providers is None else plane.providers.down()


def _running(t: TaskRow, job: JobRow | None, owner: str | None) -> RunningTask:
    """A task holding room on a worker; another owner's job is not named (a client token
    sees only its own jobs, here as everywhere)."""
    mine = job is not None and (owner is None or job.owner == owner)
    timeout = mapping.spec(job.spec).timeout if job is not None else None
    ends_by = t.started_at + timeout if t.started_at is not None and timeout is not None else None
    return RunningTask(job_id=t.job_id if mine else None, task_id=t.id if mine else None, state=TaskState(t.state),
                       accelerator=t.accelerator, devices=json.loads(t.devices), started_at=t.started_at,
                       ends_by=ends_by)


def frees_at(view: WorkerExplanation, state: scheduling.WorkerState, spec: JobSpec,
             running: list[RunningTask]) -> float | None:
    """When the busy worker has room for the job at the latest: tasks end by their timeouts,
    earliest first, until enough devices of the job's kind (or one CPU slot) are free. None
    when a task that would have to end has no limit (or has not started)."""
    kind = spec.requirements.accelerator
    need = spec.requirements.device_count
    rec = state.record
    if need == 0:
        missing = 1 - max(0, rec.cpu_slots - state.busy_cpu_slots)
        releases = [(t.ends_by, 1) for t in running if not t.devices]
    else:
        usable = sum(1 for d in rec.capabilities.devices if d.kind == kind and d.usable)
        free = usable - sum(1 for k, _ in state.busy_devices if k == kind)
        missing = need - free
        releases = [(t.ends_by, len(t.devices)) for t in running if t.accelerator == kind and t.devices]
    if missing <= 0:
        return None
    releases.sort(key=lambda r: (r[0] is None, r[0] or 0.0))
    for ends_by, units in releases:
        if ends_by is None:
            return None
        missing -= units
        if missing <= 0:
            return ends_by
    return None


def position_of(plane: ControlPlane, job_id: str) -> int | None:
    """The stored job's :func:`queue_position`, from one read of the queue."""
    with plane.store.read() as s:
        job = queries.job(s, job_id)
        return queue_position(queries.queued_jobs(s), mapping.spec(job.spec), job)


def queue_position(queue: Sequence[JobRow], spec: JobSpec, job: JobRow | None) -> int | None:
    """Where the job stands in placement order (priority, then first come): 1 is next. A job
    not stored yet stands behind every queued job of its priority or higher."""
    if job is None:
        return 1 + sum(1 for r in queue if r.priority >= spec.priority)
    if job.state != JobState.QUEUED.value:
        return None
    order = sorted(range(len(queue)), key=lambda i: (-queue[i].priority, i))
    for pos, i in enumerate(order, start=1):
        if queue[i].id == job.id:
            return pos
    return None


__all__ = ["EXPLAINED", "explain", "frees_at", "position_of", "provider_offers", "queue_position"]
