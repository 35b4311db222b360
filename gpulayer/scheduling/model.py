"""What goes into a placement pass and what comes out of it (see :mod:`gpulayer.scheduling`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulayer.hookrecords import Capabilities, MachineOffer
from gpulayer.records import PlacementDecision, WorkerRecord
from gpulayer.scheduling.shapes import ClassKey
from gpulayer.specs import JobSpec

NO_ELIGIBLE_WORKER = "scheduling: no eligible worker"


@dataclass
class WorkerState:
    """A worker as the scheduler sees it: its record plus what is in use right now."""

    record: WorkerRecord
    busy_devices: set[tuple[str, int]] = field(default_factory=set)  # (kind, index) in use
    busy_cpu_slots: int = 0  # CPU-only tasks running
    #: ``shapes.class_key(record)``, when the caller keeps it with the record (the control
    #: plane's cache does, so a pass does not compute it for every worker again); None: the
    #: pass computes it
    class_key: ClassKey | None = None


@dataclass
class QueuedJob:
    id: str
    spec: JobSpec  # requirements already resolved (profile applied)
    seq: int  # FIFO order: smaller = submitted earlier
    queued_at: float  # seconds (same clock as ``now``)


@dataclass
class NodeGrant:
    worker_id: str
    node_rank: int
    accelerator: str | None
    devices: list[int]  # device indices of ``accelerator`` on that worker


@dataclass
class Assignment:
    job_id: str
    nodes: list[NodeGrant]


@dataclass
class PlacementResult:
    assignments: list[Assignment]
    decisions: dict[str, PlacementDecision]  # every job of the queue -> its decision
    #: job id -> ids of the workers it reserved in this pass (starvation rule)
    reservations: dict[str, list[str]] = field(default_factory=dict)
    #: job id -> id of a provider offer that could run it once booted (job is "waiting")
    offer_requests: dict[str, str] = field(default_factory=dict)


#: A provider offer standing in for a worker-to-be: ``(offer_id, capabilities)``, where the
#: capabilities may be given as :class:`Capabilities`, a :class:`WorkerRecord` or a
#: :class:`MachineOffer`; a bare :class:`MachineOffer` is named ``provider:shape``.
Offer = tuple[str, Capabilities | WorkerRecord | MachineOffer] | MachineOffer
