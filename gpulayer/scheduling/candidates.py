"""Per-shape state of a pass: ``check`` results per class and the candidate workers per target."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from operator import attrgetter

from gpulayer.records import Reason, WorkerRecord
from gpulayer.scheduling.compat import Compat, bind, compat
from gpulayer.scheduling.fleet import Fleet, Worker, WorkerClass
from gpulayer.scheduling.shapes import BlankedKey, Shape, blank_unread


class Candidate:
    """One compatible class for one shape: the class's workers that may still fit jobs of it.

    Capacity only shrinks during a pass, so a worker dropped from ``workers`` (because it no
    longer fits) never comes back.
    """

    __slots__ = ("all_usable", "cls", "eligible", "workers")

    def __init__(self, cls: WorkerClass, eligible: tuple[int, ...], all_usable: bool) -> None:
        self.cls = cls
        self.eligible = eligible  # device indices that pass the shape's filters
        self.all_usable = all_usable  # ... and they are all the usable devices of the kind
        self.workers = list(cls.active)


class ShapeState:
    """What a pass knows about one shape; built once, by :func:`build_shape_state`."""

    __slots__ = (
        "_compatible",
        "by_class",
        "eligible_of",
        "max_in_target",
        "n_compat",
        "n_in_target",
        "offer_reasons",
        "offers_fit",
        "per_target",
        "pools",
        "reserve_fail_n",
        "shape",
    )
    pools: dict[str, list[tuple[int, int, Worker]]]

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.by_class: dict[WorkerClass, Compat] = {}  # every class -> its check result
        self.eligible_of: dict[WorkerClass, Candidate] = {}  # compatible classes on a listed target
        #: (target, candidates) in the shape's target order, candidates smallest first;
        #: ``pick`` drops workers (and emptied candidates) from these lists as they fill up
        self.per_target: list[tuple[str, list[Candidate]]] = []
        self.n_in_target: dict[str, int] = {}  # target -> compatible active workers
        self.n_compat = 0  # compatible active workers on all listed targets
        self.max_in_target = 0  # the most of them on one target (the largest gang that fits)
        self.offer_reasons: list[Reason] = []  # why each other offer does not fit
        #: (id, the most machines its provider brings up for one job) of each offer that fits
        self.offers_fit: list[tuple[str, float]] = []
        self.pools = {}  # target -> max-heap of (-free units, pos, worker) for reservations
        self.reserve_fail_n = math.inf  # fewest nodes a reservation failed for in this pass
        self._compatible: list[Worker] | None = None

    @property
    def offer(self) -> str | None:
        """The id of the first provider offer that fits."""
        return self.offers_fit[0][0] if self.offers_fit else None

    def offer_for(self, nodes: int, prefer: Sequence[str] = (), scopes: Mapping[str, str] | None = None) -> str | None:
        """The first offer that fits whose provider brings up ``nodes`` machines for one job
        (a gang bigger than a pool of hosts waits for no offer: none could ever hold it);
        with the job's ``prefer``, the first of those it prefers most (:func:`preference_rank`
        of its scope in ``scopes``, offer id -> scope), as provisioning tries them."""
        fits = (oid for oid, room in self.offers_fit if nodes <= room)
        if not prefer:
            return next(fits, None)
        scopes = scopes or {}
        return min(fits, key=lambda oid: preference_rank(scopes.get(oid, oid), prefer), default=None)

    def compatible_workers(self) -> list[Worker]:
        """The compatible active workers on listed targets, in fleet order."""
        if self._compatible is None:
            ws = [w for c in self.eligible_of.values() for w in c.cls.active]
            if len(self.eligible_of) > 1:  # each class's workers are in fleet order already
                ws.sort(key=attrgetter("pos"))
            self._compatible = ws
        return self._compatible


def preference_rank(scope: str, prefer: Sequence[str]) -> int:
    """Where an offer's ``scope`` (``provider/region/shape``) comes in a job's ``prefer``
    list (a provider, a provider and region, or a whole scope); ``len(prefer)`` when it is
    not there. Provisioning tries offers in this order first, and placement names the offer
    a job waits for by it."""
    return next((i for i, p in enumerate(prefer) if scope == p or scope.startswith(p + "/")), len(prefer))


def _smallest_first(kind: str | None, cands: list[Candidate]) -> None:
    """Fewest eligible devices of the kind, then fewest devices, then fleet order: one-GPU
    jobs fill one-GPU boxes before they break into an eight-GPU box."""
    if kind is None:
        cands.sort(key=lambda c: (c.cls.n_devices, c.cls.first_pos))
    else:
        cands.sort(key=lambda c: (len(c.eligible), c.cls.n_devices, c.cls.first_pos))


class OfferRooms:
    """How many machines the offers that fit a job can give it at once, by provider: at
    most the provider's ``max_machines`` (``limits``), and at most what the capacities of
    those offers add up to, each scope once (``offers``: id, provider, scope, capacity; a
    capacity of None has no bound)."""

    def __init__(self, limits: Mapping[str, float], offers: list[tuple[str, str, str, int | None]]) -> None:
        self.limits = limits
        self.of = {oid: (provider, scope, capacity) for oid, provider, scope, capacity in offers}

    def rooms(self, fitting: list[str]) -> dict[str, float]:
        """Offer id -> the machines its provider can give a job that ``fitting`` fit."""
        scopes: dict[str, dict[str, float]] = {}
        for oid in fitting:
            provider, scope, capacity = self.of.get(oid, ("", oid, None))
            held = scopes.setdefault(provider, {})
            held[scope] = max(held.get(scope, 0.0), math.inf if capacity is None else float(capacity))
        room = {p: min(self.limits.get(p, math.inf), sum(held.values())) for p, held in scopes.items()}
        return {oid: room[self.of.get(oid, ("",))[0]] for oid in fitting}


def build_shape_state(shape: Shape, classes: list[WorkerClass], offers: list[WorkerRecord],
                      rooms: OfferRooms | None = None) -> ShapeState:
    """Run ``check`` once per class (once per blanked class key) and once per offer;
    ``rooms``: what the offers that fit can give one job (none given: no bound)."""
    st = ShapeState(shape)
    by_target: dict[str, list[Candidate]] = {t: [] for t in shape.targets}
    seen: dict[BlankedKey, Compat] = {}
    blank = blank_unread(shape)
    for cls in classes:
        blanked = blank(cls.key)
        res = seen.get(blanked)
        if res is None:
            res = seen[blanked] = compat(shape, cls.rep)
        st.by_class[cls] = res
        if res.reasons or cls.target not in by_target:
            continue
        cand = Candidate(cls, res.eligible, res.all_usable)
        st.eligible_of[cls] = cand
        if cand.workers:
            by_target[cls.target].append(cand)
    for t in shape.targets:
        cands = by_target[t]
        _smallest_first(shape.accelerator, cands)
        count = sum(len(c.workers) for c in cands)
        st.n_in_target[t] = count
        st.n_compat += count
        st.max_in_target = max(st.max_in_target, count)
        st.per_target.append((t, cands))
    for orec in offers:
        reasons = compat(shape, orec).reasons
        if not reasons:
            st.offers_fit.append((orec.id, math.inf))
        else:
            st.offer_reasons.extend(bind(orec.id, reasons))
    if rooms is not None and st.offers_fit:
        room = rooms.rooms([oid for oid, _ in st.offers_fit])
        st.offers_fit = [(oid, room[oid]) for oid, _ in st.offers_fit]
    return st


class ShapeStates(dict[Shape, ShapeState]):
    """The :class:`ShapeState` of every shape seen so far in a pass, built on first lookup
    (``states[shape]``; a dict, so that a hit costs no Python-level call)."""

    def __init__(self, fleet: Fleet, offers: list[WorkerRecord], rooms: OfferRooms | None = None) -> None:
        super().__init__()
        self._classes = fleet.classes
        self._offers = offers
        self._rooms = rooms

    def __missing__(self, shape: Shape) -> ShapeState:
        st = self[shape] = build_shape_state(shape, self._classes, self._offers, self._rooms)
        return st
