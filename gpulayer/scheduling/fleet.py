"""The fleet as one pass sees it: workers with their free capacity, grouped into classes."""

from __future__ import annotations

from typing import Any

from gpulayer.hookrecords import MachineOffer
from gpulayer.records import TARGET_FOR_ORIGIN, WorkerRecord
from gpulayer.scheduling.model import Offer, WorkerState
from gpulayer.scheduling.shapes import ClassKey, class_key


class WorkerClass:
    """Workers with one :class:`ClassKey`: ``check`` gives them all the same answer."""

    __slots__ = ("active", "first_pos", "key", "n_devices", "rep", "target", "usable")

    def __init__(self, key: ClassKey, rep: WorkerRecord, pos: int) -> None:
        self.key = key
        self.rep = rep  # the first worker of the class, which ``check`` runs on
        self.target = TARGET_FOR_ORIGIN[rep.origin]
        self.active: list[Worker] = []  # online, not draining (paused ones too: see Worker); in fleet order
        self.first_pos = pos
        self.n_devices = len(rep.capabilities.devices)
        #: (kind, index) of the usable devices: the class key holds each device's kind, index
        #: and usability, so every worker of the class has these
        self.usable = [(d.kind, d.index) for d in rep.capabilities.devices if d.usable]


class Worker:
    """One worker and what it has free; capacity only shrinks during a pass."""

    __slots__ = ("cls", "free", "free_cpu", "id", "pos", "reserved", "state")

    def __init__(self, ws: WorkerState, pos: int, cls: WorkerClass, state: str | None) -> None:
        rec = ws.record
        self.id = rec.id
        self.pos = pos  # position in the fleet
        self.cls = cls
        #: None (active), "offline", "draining" or "paused" (active: it counts as able to run
        #: what it is compatible with, so such jobs wait; but it has no room, so it gets none)
        self.state = state
        #: what is reserved on it in this pass: the room of one kind (a device kind, or None
        #: for its CPU slots; :func:`room_of`) -> the id of the job that reserved it
        self.reserved: dict[str | None, str] = {}
        busy = ws.busy_devices
        free: dict[str, set[int]] = {}
        for kind, index in cls.usable:
            if (kind, index) not in busy:
                f = free.get(kind)
                if f is None:
                    free[kind] = {index}
                else:
                    f.add(index)
        self.free = free  # kind -> free usable device indices
        self.free_cpu = max(0, rec.cpu_slots - ws.busy_cpu_slots)
        if state == "paused":
            self.free, self.free_cpu = {}, 0


def room_of(kind: str | None, k: int) -> str | None:
    """Which room of a worker a job needing ``k`` devices of ``kind`` per node takes: the
    devices of that kind, or (``k == 0``) a CPU slot (None). A reservation holds one room."""
    return kind if k else None


class Fleet:
    """Every worker of a pass in fleet order, its classes in order of first appearance, and
    how many workers (in any state) each target has."""

    __slots__ = ("classes", "registered", "workers")

    def __init__(self, states: list[WorkerState]) -> None:
        by_key: dict[ClassKey, WorkerClass] = {}
        # the same, by the key object's id: a caller that passes one key object for equal keys
        # (the control plane's cache) saves hashing the nested tuple of every worker's key
        # (the states hold their keys for the whole loop, so no id is reused)
        by_id: dict[int, WorkerClass] = {}
        self.workers: list[Worker] = []
        self.registered: dict[str, int] = {"local": 0, "remote": 0, "cloud": 0}
        for pos, ws in enumerate(states):
            rec = ws.record
            key = ws.class_key
            cls = None if key is None else by_id.get(id(key))
            if cls is None:
                if key is None:
                    key = class_key(rec)
                cls = by_key.get(key)
                if cls is None:
                    cls = by_key[key] = WorkerClass(key, rec, pos)
                if ws.class_key is not None:
                    by_id[id(key)] = cls
            state = "offline" if not rec.online else ("draining" if rec.draining else ("paused" if rec.paused else None))
            w = Worker(ws, pos, cls, state)
            self.workers.append(w)
            self.registered[cls.target] = self.registered.get(cls.target, 0) + 1
            if state is None or state == "paused":
                cls.active.append(w)
        self.classes = list(by_key.values())


def offer_record(offer: Offer) -> WorkerRecord:
    """A provider offer as a worker-to-be of origin ``provider`` (the cloud target)."""
    caps_like: Any
    if isinstance(offer, MachineOffer):
        # (its region too: a shape offered in two regions is two offers, and each is told apart)
        oid, caps_like = f"{offer.provider}:{offer.shape}" + (f" in {offer.region}" if offer.region else ""), offer
    else:
        oid, caps_like = offer
    if isinstance(caps_like, (MachineOffer, WorkerRecord)):
        caps = caps_like.capabilities
    else:
        caps = caps_like
    return WorkerRecord(id=oid, name=oid, origin="provider", capabilities=caps)
