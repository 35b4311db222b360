"""The cloud target's decisions, as pure functions: no I/O, no clock, no provider calls.

The control plane (:mod:`gpulayer.control.machines`) loads the inputs, calls these, writes
each decision to the database, and only then calls the provider. A machine goes through

    requested -> launching -> booting -> idle <-> busy -> terminating -> terminated
                                  \\-> failed (the launch failed, or it did not join in time)

Rules
-----
* Demand (:func:`demand`): every queued job that lists ``cloud`` among its targets (as its
  target or a fallback) and that the placement pass could not place, with the offers that
  fit it (the same ``check`` as against a worker). A job needs one machine per node; a job
  that has machines on the way (requested, launching, booting) needs none more.
* Offer order (:func:`order_offers`): the job's preference first, when it gives one (a list
  of provider names or scopes); then available before limited before unknown, then cheapest
  (capacity you own, priced None, first), then fastest to boot.
* Launches (:func:`plan`): one machine per unit of demand, in queue order, never more than a
  provider's ``max_machines`` (machines not yet ended count), never more of one offer than its
  ``capacity`` (machines not ended in its scope count), and never an offer priced above its
  ``max_price_per_hour``. A distributed job gets all of its N machines at once, under one
  join deadline: from one offer that can hold them, else from several offers of one provider
  (the hosts of a pool, one machine each), else none. An offer whose scope
  (``provider/region/shape``) is blocked is skipped, as is a provider that is disabled.
* Failover: a launch that fails with ``NoCapacity``, ``QuotaExceeded`` or ``SkipOffer``, and
  a machine that does not join before its deadline, block their scope for
  :data:`BLOCK_SECONDS` for every job; the next pass (or the same one, for a failed launch)
  tries the next offer.
* Housekeeping (:func:`housekeeping`): a machine booting for a job that is no longer queued
  (cancelled, or placed elsewhere) is withdrawn: terminated, no scope blocked; a machine
  whose worker holds no task for its provider's ``idle_timeout`` is drained and terminated; one whose worker stopped sending
  heartbeats is terminated after ``grace`` seconds; one past its join deadline is terminated
  (and its scope blocked); one left ``terminating`` is terminated again (terminate is
  idempotent).
* Orphans (:func:`orphans`): a live machine a provider lists with this control plane's label
  and that the records do not know (or know as ended) is terminated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpulayer import scheduling
from gpulayer.hookrecords import LiveMachine, MachineOffer
from gpulayer.provider_config import Limits
from gpulayer.scheduling.candidates import preference_rank
from gpulayer.scheduling.fleet import offer_record
from gpulayer.scheduling.shapes import Shape, shape_of
from gpulayer.specs import JobSpec

#: how long a scope whose launch failed (or whose machine did not join) is skipped, seconds
BLOCK_SECONDS = 300.0
#: how long offers are cached, seconds
OFFER_TTL = 30.0
#: machine states that count against a provider's cap and are not ended
LIVE_STATES = ("requested", "launching", "booting", "idle", "busy", "terminating")
#: machines on their way to joining (their job needs no more)
PENDING_STATES = ("requested", "launching", "booting")
JOINED_STATES = ("idle", "busy")
_AVAILABILITY_RANK = {"available": 0, "limited": 1, "unknown": 2, "unavailable": 3}


# --------------------------------------------------------------------------- offers


def order_offers(offers: Iterable[MachineOffer], preference: Sequence[str] = ()) -> list[MachineOffer]:
    """Offers in the order they are tried (see the module doc). ``preference`` entries name a
    provider (``ec2``), a provider and region (``ec2/us-east-1``) or a whole scope."""

    def rank(o: MachineOffer) -> tuple[int, int, float, float]:
        return (preference_rank(o.scope, preference), _AVAILABILITY_RANK.get(o.availability, 2), o.price_per_hour or 0.0,
                o.boot_seconds if o.boot_seconds is not None else float("inf"))

    return sorted(offers, key=rank)


def waited_for(offers: Iterable[MachineOffer], blocked: Mapping[str, float], now: float) -> list[MachineOffer]:
    """Offers in the order placement names the one a job waits for (``offer X could run it
    once booted``): as :func:`order_offers` tries them, those of a scope ``blocked`` at
    ``now`` last (a launch skips them); placement puts a job's ``prefer`` first."""
    return sorted(order_offers(offers), key=lambda o: blocked.get(o.scope, 0.0) > now)


def within_price(offer: MachineOffer, limits: Limits) -> bool:
    cap = limits.max_price_per_hour
    return cap is None or offer.price_per_hour is None or offer.price_per_hour <= cap


def never_launched(offer: MachineOffer, limits: Limits) -> str | None:
    """Why the offer is never launched whatever the demand (its section's limits rule it
    out), or None. Such an offer is no offer to wait for: a job only it fits is unschedulable."""
    if not within_price(offer, limits):
        return f"priced over its section's max_price_per_hour (${limits.max_price_per_hour:.2f}/h)"
    if limits.max_machines <= 0:
        return "its section's max_machines is 0"
    return None


def fitting(spec: JobSpec, offers: Sequence[MachineOffer]) -> list[MachineOffer]:
    """The offers a job could run on once booted (the scheduler's ``check``)."""
    return [o for o in offers if not scheduling.check(spec, offer_record(o))]


# --------------------------------------------------------------------------- demand and launches


@dataclass(frozen=True)
class DemandJob:
    """A queued cloud job no worker could take, and what could run it."""

    job_id: str
    #: machines it needs at once (a distributed job's nodes)
    nodes: int
    #: the offers that fit it, in the order they are tried
    offers: list[MachineOffer]
    #: machines on their way for it (requested, launching, booting)
    pending: int = 0


@dataclass(frozen=True)
class QueuedCloudJob:
    """A queued job as :func:`demand` reads it, in queue order."""

    job_id: str
    spec: JobSpec
    preference: tuple[str, ...] = ()


def demand(queue: Sequence[QueuedCloudJob], offers: Sequence[MachineOffer],
           pending: Mapping[str, int]) -> list[DemandJob]:
    """The jobs of ``queue`` (queued after a placement pass, in queue order) that may run on
    the cloud target, with the offers that fit each. ``pending``: job id -> machines on their
    way for it. ``check`` runs once per job shape."""
    fits: dict[Shape, list[MachineOffer]] = {}
    out = []
    for q in queue:
        if "cloud" not in q.spec.placement.targets:
            continue
        shape = shape_of(q.spec)
        if shape not in fits:
            fits[shape] = fitting(q.spec, offers)
        nodes = q.spec.nodes if q.spec.kind == "distributed" else 1
        out.append(DemandJob(job_id=q.job_id, nodes=nodes, offers=order_offers(fits[shape], q.preference),
                             pending=pending.get(q.job_id, 0)))
    return out


@dataclass(frozen=True)
class Launch:
    """Bring up ``count`` machines of ``offer`` for ``job_id`` (count > 1: a gang, together);
    ``parts``, for a gang from several offers of one provider: ``(offer, machines)`` each."""

    job_id: str
    offer: MachineOffer
    count: int
    parts: tuple[tuple[MachineOffer, int], ...] = ()

    @property
    def pieces(self) -> tuple[tuple[MachineOffer, int], ...]:
        """Each offer of the launch with its number of machines."""
        return self.parts or ((self.offer, self.count),)


@dataclass
class ProviderView:
    """A provider instance as a pass sees it."""

    limits: Limits
    #: machines not ended (they count against ``max_machines``)
    live: int = 0
    enabled: bool = True
    #: machines not ended, by scope (they count against their offer's ``capacity``)
    in_scope: dict[str, int] = field(default_factory=dict)

    @property
    def room(self) -> int:
        return max(0, self.limits.max_machines - self.live)

    def free(self, offer: MachineOffer) -> int:
        """Machines of ``offer`` this provider may still bring up now."""
        if offer.capacity is None:
            return self.room
        return max(0, min(self.room, offer.capacity - self.in_scope.get(offer.scope, 0)))

    def take(self, offer: MachineOffer, count: int) -> None:
        self.live += count
        self.in_scope[offer.scope] = self.in_scope.get(offer.scope, 0) + count


def plan(jobs: Sequence[DemandJob], providers: Mapping[str, ProviderView], blocked: Mapping[str, float],
         now: float, *, tried: Iterable[tuple[str, str]] = ()) -> list[Launch]:
    """The launches of one pass (see the module doc). ``blocked``: scope -> blocked until;
    ``tried``: ``(job id, scope)`` pairs not to try again in this pass. ``providers`` is
    updated with the machines planned (``live``)."""
    skip = set(tried)
    out = []
    for job in jobs:
        if job.pending > 0:
            continue
        usable = []
        for offer in job.offers:
            p = providers.get(offer.provider)
            if (p is None or not p.enabled or offer.availability == "unavailable"
                    or blocked.get(offer.scope, 0.0) > now or (job.job_id, offer.scope) in skip
                    or not within_price(offer, p.limits)):
                continue
            usable.append((offer, p))
        whole = next(((o, p) for o, p in usable if p.free(o) >= job.nodes), None)
        if whole is not None:
            offer, p = whole
            p.take(offer, job.nodes)
            out.append(Launch(job_id=job.job_id, offer=offer, count=job.nodes))
            continue
        parts = _gang_of_offers(job.nodes, usable) if job.nodes > 1 else None
        if parts:
            for offer, n in parts:
                providers[offer.provider].take(offer, n)
            out.append(Launch(job_id=job.job_id, offer=parts[0][0], count=job.nodes, parts=tuple(parts)))
    return out


def _gang_of_offers(nodes: int, usable: Sequence[tuple[MachineOffer, ProviderView]]
                    ) -> list[tuple[MachineOffer, int]] | None:
    """``nodes`` machines from several offers of one provider, in the order they are tried
    (the first provider that can give them all), or None."""
    for provider in dict.fromkeys(o.provider for o, _ in usable):
        picked: list[tuple[MachineOffer, int]] = []
        in_scope: dict[str, int] = {}  # (two offers of one scope, spot and not, share its capacity)
        need = nodes
        for offer, p in usable:
            if offer.provider != provider or need == 0:
                continue
            n = min(need, p.free(offer) - in_scope.get(offer.scope, 0), p.room - (nodes - need))
            if n > 0:
                picked.append((offer, n))
                in_scope[offer.scope] = in_scope.get(offer.scope, 0) + n
                need -= n
        if need == 0:
            return picked
    return None


# --------------------------------------------------------------------------- machines already there


@dataclass(frozen=True)
class MachineView:
    """A stored machine, with its worker's facts, as :func:`housekeeping` reads it."""

    id: str
    provider: str
    scope: str
    state: str
    join_deadline: float
    #: since when it holds no task: its join, or its worker's last task's end, the later
    idle_since: float | None = None
    worker_id: str | None = None
    #: its worker holds an assigned or running task
    busy: bool = False
    worker_online: bool = True
    #: when its worker was last heard from
    last_heartbeat: float = 0.0
    #: the machines of one gang share a group: one that fails ends them all
    gang: str | None = None
    #: why the job it was launched for no longer wants it (None: it does, or it has none)
    unwanted: str | None = None


ActionKind = Literal["busy", "idle", "terminate", "fail", "withdraw"]


@dataclass(frozen=True)
class Action:
    """What to do with one machine: mark it ``busy``/``idle``, ``terminate`` it (it served),
    ``fail`` it (terminate, and it counts as a failed attempt: its scope is blocked), or
    ``withdraw`` it (terminate one that has not joined and is no longer wanted: not a failure)."""

    machine_id: str
    kind: ActionKind
    reason: str = ""
    block: str | None = None  # the scope to block
    #: ``idle``: since when (its worker's last task ended)
    since: float | None = None


def housekeeping(machines: Sequence[MachineView], limits: Mapping[str, Limits], now: float, *,
                 grace: float) -> list[Action]:
    """What each machine needs now (see the module doc); machines that need nothing are left out."""
    out: list[Action] = []
    failed_groups: set[str] = set()
    for m in machines:
        lim = limits.get(m.provider, Limits())
        if m.state == "booting" and m.unwanted:  # (requested and launching: a launch under way)
            out.append(Action(m.id, "withdraw", m.unwanted))
        elif m.state in PENDING_STATES and now > m.join_deadline:
            out.append(Action(m.id, "fail", f"did not join within {lim.join_timeout:g} s", block=m.scope))
            if m.gang:
                failed_groups.add(m.gang)
        elif m.state == "terminating":
            out.append(Action(m.id, "terminate", "terminate again (the last call did not finish)"))
        elif m.state in JOINED_STATES:
            if not m.worker_online:
                # a worker that is gone is not idle: a machine the provider ended under it
                # (a cancelled or timed-out Slurm pilot) ends for that, after the grace
                if now - m.last_heartbeat > grace:
                    out.append(Action(m.id, "terminate", f"its worker {m.worker_id} stopped sending heartbeats"))
            elif m.busy and m.state == "idle":
                out.append(Action(m.id, "busy"))
            elif not m.busy and m.state == "busy":
                out.append(Action(m.id, "idle", since=m.idle_since if m.idle_since is not None else now))
            elif not m.busy and m.idle_since is not None and now - m.idle_since >= lim.idle_timeout:
                out.append(Action(m.id, "terminate", f"idle for {lim.idle_timeout:g} s"))
    if failed_groups:  # a gang joins together or not at all
        done = {a.machine_id for a in out}
        out.extend(Action(m.id, "fail", "another machine of its group did not join in time")
                   for m in machines if m.gang in failed_groups and m.id not in done
                   and m.state in PENDING_STATES)
    return out


def orphans(live: Iterable[LiveMachine], known: Mapping[str, str]) -> list[LiveMachine]:
    """Machines a provider lists with our label that the records (``machine id -> state``) do
    not know, or know as ended: they are terminated."""
    return [m for m in live if known.get(m.machine_id, "terminated") in ("terminated", "failed")]


# --------------------------------------------------------------------------- what jobs show


#: event kinds of a job's cloud history; a continuation (a join, another machine of the same
#: gang's launch) joins the attempt before it with ", "
HISTORY_KINDS = ("cloud", "cloud_joined", "cloud_gang")
_CONTINUATIONS = ("cloud_joined", "cloud_gang")


def history(events: Iterable[tuple[str, str]]) -> str | None:
    """A job's cloud attempts as one line: ``slurm/gpu-a100: launched m-3f2a (4.1 s), joined
    as wkr-...`` or ``ec2/us-east-1/p5.48xlarge: quota exceeded -> ec2/us-west-2/...``, from its
    ``(kind, message)`` events in order. The same failure again and again (a provider that
    is down, tried every 30 s) is one attempt with its count: ``... launch failed (...) (x12)``."""
    parts: list[list[Any]] = []  # [text, times]
    for kind, message in events:
        if kind in _CONTINUATIONS and parts:
            parts[-1][0] += ", " + message
        elif kind in HISTORY_KINDS:
            if parts and parts[-1][0] == message:
                parts[-1][1] += 1
            else:
                parts.append([message, 1])
    return " -> ".join(text if n == 1 else f"{text} (x{n})" for text, n in parts) if parts else None


@dataclass
class Blocks:
    """Scopes blocked until a time, for every job (kept by the control plane between passes)."""

    until: dict[str, float] = field(default_factory=dict)
    #: scope -> why it is blocked (the failure that blocked it last), for ``explain``
    why: dict[str, str] = field(default_factory=dict)

    def block(self, scope: str, now: float, seconds: float = BLOCK_SECONDS, reason: str = "") -> None:
        self.until[scope] = max(self.until.get(scope, 0.0), now + seconds)
        self.why[scope] = reason

    def active(self, now: float) -> dict[str, float]:
        for scope in [s for s, t in self.until.items() if t <= now]:
            del self.until[scope]
            self.why.pop(scope, None)
        return dict(self.until)


__all__ = [
    "BLOCK_SECONDS", "JOINED_STATES", "LIVE_STATES", "OFFER_TTL", "PENDING_STATES", "Action", "Blocks",
    "DemandJob", "Launch", "MachineView", "ProviderView", "QueuedCloudJob", "demand", "fitting", "history",
    "housekeeping", "never_launched", "order_offers", "orphans", "plan", "waited_for",
    "within_price",
]
