"""``place``: one placement pass over the whole queue (rules in :mod:`gpulayer.scheduling`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from gpulayer.records import PlacementDecision, Reason
from gpulayer.scheduling.candidates import ShapeState, ShapeStates
from gpulayer.scheduling.capacity import grant, pick, reserve
from gpulayer.scheduling.fleet import Fleet, offer_record
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
from gpulayer.specs import JobSpec


def place(
    queue: list[QueuedJob],
    fleet: list[WorkerState],
    now: float,
    *,
    reserve_after: float | None = 60.0,
    offers: Sequence[Offer] = (),
    reason_limit: int = 50,
) -> PlacementResult:
    """One placement pass: decide every queued job against the fleet.

    ``reserve_after``: seconds a blocked multi-unit job waits before it reserves workers
    (``None`` or ``math.inf``: never). ``offers``: provider machines that could be booted;
    a job that fits one and is not assigned waits (``offer_requests`` names the offer).
    ``reason_limit``: most workers listed in one decision's reasons.
    See :mod:`gpulayer.scheduling` for the rules.
    """
    if reserve_after is None:
        reserve_after = math.inf
    limit = max(1, reason_limit)
    workers = Fleet(fleet)
    offer_records = [offer_record(o) for o in offers]
    shapes = ShapeStates(workers, offer_records)
    unschedulable = UnschedulableReasons(workers, has_offers=bool(offer_records), limit=limit)
    waiting = WaitingReasons(limit=limit)

    result = PlacementResult(assignments=[], decisions={})
    for qj in sorted(queue, key=queue_order):
        st = shapes.of(qj.spec)
        nodes = nodes_of(qj.spec)
        if st.n_compat == 0 or st.max_in_target < nodes:
            decision = unplaceable_decision(st, nodes, now, unschedulable)
        else:
            attempt = assign(st, nodes)
            if attempt.grants is not None:
                result.assignments.append(Assignment(job_id=qj.id, nodes=attempt.grants))
                result.decisions[qj.id] = assigned_decision(st, attempt, nodes, now)
                continue
            # blocked: compatible workers exist, none (or too few) has room
            reasons = list(waiting.of(st, nodes, qj.id))  # before the job reserves anything
            held: list[str] = []
            if wants_reservation(qj, st, nodes, now, reserve_after):
                for w in reserve(st, nodes) or ():
                    w.reserved_by = qj.id
                    waiting.forget(w)
                    held.append(w.id)
                if held:
                    result.reservations[qj.id] = held
            decision = waiting_decision(st, nodes, attempt.best_partial, reasons, held, reserve_after, now)
        if st.offer is not None and decision.outcome == "waiting":
            result.offer_requests[qj.id] = st.offer
        result.decisions[qj.id] = decision
    return result


def queue_order(qj: QueuedJob) -> tuple[int, int]:
    """Higher ``spec.priority`` first, then FIFO by ``seq``."""
    return -qj.spec.priority, qj.seq


def nodes_of(spec: JobSpec) -> int:
    return spec.nodes if spec.kind == "distributed" else 1


class Attempt(NamedTuple):
    """What :func:`assign` did for one job."""

    grants: list[NodeGrant] | None  # None: no target had room for every node
    target_index: int  # into the shape's targets, when granted
    best_partial: int  # the most nodes one target could take (when not granted)


def assign(st: ShapeState, nodes: int) -> Attempt:
    """Grant the job ``nodes`` distinct workers on its first target that has room for all of
    them, or nothing (gangs are all or nothing)."""
    kind, k = st.shape.accelerator, st.shape.device_count
    best_partial = 0
    for ti, (_, cands) in enumerate(st.per_target):
        if not cands:
            continue
        picked, ok = pick(cands, kind, k, nodes)
        if ok:
            return Attempt(grant(picked, kind, k), ti, best_partial)
        best_partial = max(best_partial, len(picked))
    return Attempt(None, -1, best_partial)


def wants_reservation(qj: QueuedJob, st: ShapeState, nodes: int, now: float, reserve_after: float) -> bool:
    """The starvation rule: a blocked job that needs more than one unit and has been queued
    longer than ``reserve_after`` reserves workers, unless a job of its shape needing at most
    as many nodes already failed to in this pass."""
    return (now - qj.queued_at > reserve_after and (st.shape.device_count > 1 or nodes > 1)
            and nodes < st.reserve_fail_n)


def _describe_grant(worker_id: str, kind: str | None, devices: list[int]) -> str:
    if devices:
        return f"{worker_id} ({kind} {','.join(map(str, devices))})"
    return f"{worker_id} (CPU slot)"


def assigned_decision(st: ShapeState, attempt: Attempt, nodes: int, now: float) -> PlacementDecision:
    grants = attempt.grants or []
    kind = st.shape.accelerator
    shown = [_describe_grant(g.worker_id, kind, g.devices) for g in grants[:8]]
    if len(grants) > 8:
        shown.append(f"+{len(grants) - 8} more")
    summary = (f"assigned to {shown[0]}" if nodes == 1
               else f"assigned to {nodes} workers: {', '.join(shown)}")
    if attempt.target_index > 0:
        targets = st.shape.targets
        summary += f" on {targets[attempt.target_index]}, fallback from {targets[0]}"
    return PlacementDecision(outcome="assigned", summary=summary, at=now)


def unplaceable_decision(st: ShapeState, nodes: int, now: float,
                         unschedulable: UnschedulableReasons) -> PlacementDecision:
    """No target has ``nodes`` compatible workers: waiting for an offer that fits, or
    unschedulable."""
    if st.offer is not None:
        return PlacementDecision(
            outcome="waiting", at=now,
            summary=f"waiting: no compatible worker registered yet; offer {st.offer} could run it once booted",
        )
    if st.n_compat == 0:
        summary = NO_ELIGIBLE_WORKER
        reasons = list(unschedulable.of(st))
    else:
        summary = f"scheduling: needs {nodes} eligible workers on one target, found {st.max_in_target}"
        reasons = too_few_workers(st, nodes)
        reasons.extend(unschedulable.of(st))
    return PlacementDecision(outcome="unschedulable", summary=summary, reasons=reasons, at=now)


def waiting_decision(st: ShapeState, nodes: int, best_partial: int, reasons: list[Reason],
                     held: list[str], reserve_after: float, now: float) -> PlacementDecision:
    """A compatible job without room: ``held`` names the workers it just reserved."""
    if nodes > 1:
        summary = (f"waiting: needs {nodes} workers at once, {best_partial} of "
                   f"{st.n_compat} compatible worker(s) free")
    else:
        summary = f"waiting: {st.n_compat} compatible worker(s) busy"
    if held:
        names = ", ".join(held[:5]) + (f" +{len(held) - 5} more" if len(held) > 5 else "")
        summary += f"; reserved {names} for it (queued longer than reserve_after={reserve_after:g}s)"
    if st.offer is not None:
        summary += f"; offer {st.offer} could run it once booted"
    return PlacementDecision(outcome="waiting", summary=summary, reasons=reasons, at=now)
