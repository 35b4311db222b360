"""Placement, as pure functions: no I/O, no clock, no database.

``check(job, worker)`` says why one worker cannot run one job (a list of reasons, empty
when it can); ``place(queue, fleet, now)`` decides a whole placement pass.
The control plane loads the inputs, calls these, and writes the outcome.
"""
# INTERFACE STUB: implementation in progress (see helper task).
from __future__ import annotations

from dataclasses import dataclass, field

from gpulayer.types import JobSpec, PlacementDecision, Reason, WorkerRecord


@dataclass
class WorkerState:
    """A worker as the scheduler sees it: its record plus what is in use right now."""

    record: WorkerRecord
    busy_devices: set[tuple[str, int]] = field(default_factory=set)  # (kind, index) in use
    busy_cpu_slots: int = 0  # CPU-only tasks running


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


def check(job: JobSpec, worker: WorkerRecord) -> list[Reason]:
    raise NotImplementedError


def place(queue: list[QueuedJob], fleet: list[WorkerState], now: float, *, reserve_after: float = 60.0) -> PlacementResult:
    raise NotImplementedError
