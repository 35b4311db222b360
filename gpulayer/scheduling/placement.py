"""``place``: one placement pass over the whole queue (rules in :mod:`gpulayer.scheduling`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from operator import attrgetter

from gpulayer.hookrecords import MachineOffer
from gpulayer.records import PlacementDecision, Reason
from gpulayer.scheduling.candidates import OfferRooms, ShapeState, ShapeStates
from gpulayer.scheduling.capacity import grant, pick, reserve
from gpulayer.scheduling.collector import collection_paused
from gpulayer.scheduling.fleet import Fleet, offer_record, room_of
from gpulayer.scheduling.model import (
    NO_ELIGIBLE_WORKER,
    Assignment,
    NodeGrant,
    Offer,
    PlacementResult,
    QueuedJob,
    WorkerState,
)
from gpulayer.scheduling.reasons import UnschedulableReasons, WaitingReasons, too_few_workers
from gpulayer.scheduling.shapes import shape_of


def place(
    queue: list[QueuedJob],
    fleet: list[WorkerState],
    now: float,
    *,
    reserve_after: float | None = 60.0,
    offers: Sequence[Offer] = (),
    offer_rooms: Mapping[str, float] | None = None,
    reason_limit: int = 50,
    until_full: bool = False,
) -> PlacementResult:
    """One placement pass: decide every queued job against the fleet.

    ``reserve_after``: seconds a blocked multi-unit job waits before it reserves workers
    (``None`` or ``math.inf``: never). ``offers``: provider machines that could be booted;
    a job that fits one and is not assigned waits (``offer_requests`` names the offer).
    ``offer_rooms``: provider -> the most machines it brings up at once (its
    ``max_machines``): a distributed job of more nodes than that, or than the capacities of
    the provider's offers that fit it add up to (each scope once), waits for none of them.
    ``reason_limit``: most workers listed in one decision's reasons.
    ``until_full``: stop once no active worker has a free CPU slot or device left (the
    jobs not reached get no decision: the caller keeps their last one). Right after a task
    ended, when only capacity changed, that decides the same as a whole pass, in time that
    does not grow with the queue behind the first job that fits.
    See :mod:`gpulayer.scheduling` for the rules.

    Decisions are shared: jobs of one shape that are not assigned for the same reasons get
    the same :class:`PlacementDecision` object (read-only, like its reasons; copy one with
    ``model_copy`` to change it). Automatic garbage collection is paused during the pass
    (:mod:`gpulayer.scheduling.collector`).
    """
    with collection_paused():
        return _place(queue, fleet, now, reserve_after=reserve_after, offers=offers, offer_rooms=offer_rooms,
                      reason_limit=reason_limit, until_full=until_full)


def _place(queue: list[QueuedJob], fleet: list[WorkerState], now: float, *, reserve_after: float | None,
           offers: Sequence[Offer], offer_rooms: Mapping[str, float] | None, reason_limit: int,
           until_full: bool) -> PlacementResult:
    if reserve_after is None:
        reserve_after = math.inf
    limit = max(1, reason_limit)
    workers = Fleet(fleet)
    offer_records = [offer_record(o) for o in offers]
    rooms = None if offer_rooms is None else OfferRooms(offer_rooms, [
        (r.id, o.provider, o.scope, o.capacity) for o, r in zip(offers, offer_records, strict=True)
        if isinstance(o, MachineOffer)])
    shapes = ShapeStates(workers, offer_records, rooms)
    scopes = {r.id: o.scope for o, r in zip(offers, offer_records, strict=True) if isinstance(o, MachineOffer)}
    unschedulable = UnschedulableReasons(workers, has_offers=bool(offer_records), limit=limit)
    waiting = WaitingReasons(limit=limit)
    shared = SharedDecisions(now)

    result = PlacementResult(assignments=[], decisions={})
    decisions, assignments = result.decisions, result.assignments
    # spec object id -> its shape's state: jobs that share one spec object (the control
    # plane's parsed-spec cache, a batch of identical submits) skip ``shape_of``; the queue
    # holds every spec for the whole pass, so no id is reused
    by_spec: dict[int, ShapeState] = {}
    room = (sum(w.free_cpu + sum(len(f) for f in w.free.values()) for w in workers.workers if w.state is None)
            if until_full else 1)  # (only until_full counts it down)
    for qj in queue_order(queue):
        if until_full and room <= 0:
            break
        spec = qj.spec
        st = by_spec.get(id(spec))
        if st is None:
            st = by_spec[id(spec)] = shapes[shape_of(spec)]
        nodes = spec.nodes if spec.kind == "distributed" else 1
        if st.n_compat == 0 or st.max_in_target < nodes:
            decisions[qj.id] = shared.unplaceable(st, nodes, unschedulable)
        else:
            grants, target_index, best_partial = assign(st, nodes)
            if grants is not None:
                assignments.append(Assignment(job_id=qj.id, nodes=grants))
                room -= sum(max(1, len(g.devices)) for g in grants)
                decisions[qj.id] = assigned_decision(st, grants, target_index, nodes, now)
                continue
            # blocked: compatible workers exist, none (or too few) has room
            reasons = waiting.of(st, nodes, qj.id)  # before the job reserves anything
            held: Sequence[str] = ()
            if wants_reservation(qj, st, nodes, now, reserve_after):
                held = hold(st, nodes, qj.id, waiting)
                if held:
                    result.reservations[qj.id] = held
            if held:
                decisions[qj.id] = waiting_decision(st, nodes, best_partial, reasons, held, reserve_after, now)
            else:
                decisions[qj.id] = shared.waiting(st, nodes, best_partial, reasons)
        offer = st.offer_for(nodes)
        if offer is not None and spec.placement.prefer:  # the offer it prefers, not its shape's first
            preferred = st.offer_for(nodes, spec.placement.prefer, scopes)
            if preferred is not None and preferred != offer:
                decisions[qj.id] = offer_named(decisions[qj.id], offer, preferred)
                offer = preferred
        if offer is not None:  # not assigned, and an offer fits: the job waits for it
            result.offer_requests[qj.id] = offer
    return result


def offer_named(decision: PlacementDecision, offer: str, preferred: str) -> PlacementDecision:
    """``decision`` (shared by the jobs of a shape) naming ``preferred`` where it named
    ``offer``, the shape's first: for a job whose ``placement.prefer`` puts another first."""
    tail = f"offer {offer} could run it once booted"
    summary = decision.summary.removesuffix(tail) + f"offer {preferred} could run it once booted"
    return decision.model_copy(update={"summary": summary})


def queue_order(queue: list[QueuedJob]) -> list[QueuedJob]:
    """The queue in placement order: higher ``spec.priority`` first, then FIFO by ``seq``.

    Two stable sorts with C-level keys: the same order as one sort by ``(-priority, seq)``,
    without a Python call per job (and nearly free when the queue comes in ``seq`` order).
    """
    order = sorted(queue, key=attrgetter("seq"))
    order.sort(key=attrgetter("spec.priority"), reverse=True)  # reverse=True keeps ties in order
    return order


def assign(st: ShapeState, nodes: int) -> tuple[list[NodeGrant] | None, int, int]:
    """Grant the job ``nodes`` distinct workers on its first target that has room for all of
    them, or nothing (gangs are all or nothing).

    Returns the grants (None: no target had room), the index of the target in the shape's
    targets, and the most nodes one target could take. (A plain tuple: this runs per job.)
    """
    kind, k = st.shape.accelerator, st.shape.device_count
    best_partial = 0
    for ti, (_, cands) in enumerate(st.per_target):
        if not cands:
            continue
        picked, ok = pick(cands, kind, k, nodes)
        if ok:
            return grant(picked, kind, k), ti, best_partial
        best_partial = max(best_partial, len(picked))
    return None, -1, best_partial


def wants_reservation(qj: QueuedJob, st: ShapeState, nodes: int, now: float, reserve_after: float) -> bool:
    """The starvation rule: a blocked job that needs more than one unit and has been queued
    longer than ``reserve_after`` reserves workers, unless a job of its shape needing at most
    as many nodes already failed to in this pass."""
    return (now - qj.queued_at > reserve_after and (st.shape.device_count > 1 or nodes > 1)
            and nodes < st.reserve_fail_n)


def hold(st: ShapeState, nodes: int, job_id: str, waiting: WaitingReasons) -> list[str]:
    """Reserve workers for a blocked job (:func:`~gpulayer.scheduling.capacity.reserve`):
    mark the room it needs on them (the devices of its kind, or the CPU slots: the rest of
    the worker stays free for later jobs), drop the cached waiting reasons that show them as
    busy, return their ids (empty when too few could be had)."""
    held = reserve(st, nodes) or []
    room = room_of(st.shape.accelerator, st.shape.device_count)
    for w in held:
        w.reserved[room] = job_id
        waiting.forget(w)
    return [w.id for w in held]


class SharedDecisions:
    """The decisions of one pass that many jobs share: a job that is not assigned (and
    reserved nothing) gets the decision of an earlier job of its shape that was not
    assigned for the same reasons, instead of a copy of it."""

    __slots__ = ("_now", "_unplaceable", "_waiting")

    def __init__(self, now: float) -> None:
        self._now = now
        self._unplaceable: dict[tuple[ShapeState, int], PlacementDecision] = {}
        #: (shape, nodes, best partial) -> (the reasons list it was built from, decision)
        self._waiting: dict[tuple[ShapeState, int, int], tuple[list[Reason], PlacementDecision]] = {}

    def unplaceable(self, st: ShapeState, nodes: int, unschedulable: UnschedulableReasons) -> PlacementDecision:
        key = (st, nodes)
        d = self._unplaceable.get(key)
        if d is None:
            d = self._unplaceable[key] = unplaceable_decision(st, nodes, self._now, unschedulable)
        return d

    def waiting(self, st: ShapeState, nodes: int, best_partial: int, reasons: list[Reason]) -> PlacementDecision:
        # the reasons list is compared by identity: WaitingReasons hands out its cached list
        # until a reservation makes it stale, and builds a new one then (gangs: every time)
        key = (st, nodes, best_partial)
        known = self._waiting.get(key)
        if known is not None and known[0] is reasons:
            return known[1]
        d = waiting_decision(st, nodes, best_partial, reasons, (), math.inf, self._now)
        self._waiting[key] = (reasons, d)
        return d


def _describe_grant(worker_id: str, kind: str | None, devices: list[int]) -> str:
    if devices:
        return f"{worker_id} ({kind} {','.join(map(str, devices))})"
    return f"{worker_id} (CPU slot)"


def assigned_decision(st: ShapeState, grants: list[NodeGrant], target_index: int, nodes: int,
                      now: float) -> PlacementDecision:
    kind = st.shape.accelerator
    if nodes == 1:
        summary = f"assigned to {_describe_grant(grants[0].worker_id, kind, grants[0].devices)}"
    else:
        shown = [_describe_grant(g.worker_id, kind, g.devices) for g in grants[:8]]
        if len(grants) > 8:
            shown.append(f"+{len(grants) - 8} more")
        summary = f"assigned to {nodes} workers: {', '.join(shown)}"
    if target_index > 0:
        targets = st.shape.targets
        summary += f" on {targets[target_index]}, fallback from {targets[0]}"
    return PlacementDecision(outcome="assigned", summary=summary, at=now)


def unplaceable_decision(st: ShapeState, nodes: int, now: float,
                         unschedulable: UnschedulableReasons) -> PlacementDecision:
    """No target has ``nodes`` compatible workers: waiting for an offer that fits, or
    unschedulable (the reason lists are built once per shape)."""
    offer = st.offer_for(nodes)
    if offer is not None:
        return PlacementDecision(
            outcome="waiting", at=now,
            summary=f"waiting: no compatible worker registered yet; offer {offer} could run it once booted",
        )
    if st.n_compat == 0:
        summary = NO_ELIGIBLE_WORKER
        reasons = list(unschedulable.of(st))
    else:
        summary = f"scheduling: needs {nodes} eligible workers on one target, found {st.max_in_target}"
        reasons = too_few_workers(st, nodes)
        reasons.extend(unschedulable.of(st))
    # offers that fit, whose providers never bring up so many machines for one job
    reasons.extend(Reason(worker=oid, code="machines", wanted=str(nodes), have=f"{room:g}",
                          message=f"needs {nodes} machines at once, its provider brings up {room:g} at most")
                   for oid, room in st.offers_fit)
    return PlacementDecision(outcome="unschedulable", summary=summary, reasons=reasons, at=now)


def waiting_decision(st: ShapeState, nodes: int, best_partial: int, reasons: list[Reason],
                     held: Sequence[str], reserve_after: float, now: float) -> PlacementDecision:
    """A compatible job without room: ``held`` names the workers it just reserved."""
    if nodes > 1:
        summary = (f"waiting: needs {nodes} workers at once, {best_partial} of "
                   f"{st.n_compat} compatible worker(s) free")
    else:
        summary = f"waiting: {st.n_compat} compatible worker(s) busy"
    if held:
        names = ", ".join(held[:5]) + (f" +{len(held) - 5} more" if len(held) > 5 else "")
        summary += f"; reserved {names} for it (queued longer than reserve_after={reserve_after:g}s)"
    offer = st.offer_for(nodes)
    if offer is not None:
        summary += f"; offer {offer} could run it once booted"
    return PlacementDecision(outcome="waiting", summary=summary, reasons=reasons, at=now)
