"""The control plane's records: workers, jobs, tasks, their states and placement decisions.

These are what the control plane stores and what the API returns; users read them
(``JobRecord`` from ``gpulayer.get_job(...).record()``), plugins never need them.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import Field

from gpulayer._base import Record
from gpulayer.hookrecords import Capabilities, Rendezvous
from gpulayer.specs import JobSpec

ORIGIN_FOR_TARGET = {"local": "local", "remote": "existing", "cloud": "provider"}
TARGET_FOR_ORIGIN = {v: k for k, v in ORIGIN_FOR_TARGET.items()}

# --------------------------------------------------------------------------- stored states


class TaskState(str, enum.Enum):
    ASSIGNED = "assigned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self not in (TaskState.ASSIGNED, TaskState.RUNNING)


class JobState(str, enum.Enum):
    QUEUED = "queued"
    ASSIGNED = "assigned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    UNSCHEDULABLE = "unschedulable"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                        JobState.TIMED_OUT, JobState.UNSCHEDULABLE)


class Reason(Record):
    """Why one worker cannot run one job, as data; ``message`` is the seed's wording."""

    worker: str
    code: str
    wanted: str | None = None
    have: str | None = None
    message: str

    def render(self) -> str:
        return f"{self.worker}: {self.message}"


class PlacementDecision(Record):
    """The last placement pass's word on a job."""

    outcome: Literal["assigned", "waiting", "unschedulable"]
    summary: str
    reasons: list[Reason] = Field(default_factory=list)
    at: float = 0.0

    def render(self) -> str:
        lines = [self.summary]
        lines.extend(r.render() for r in self.reasons)
        return "\n".join(lines)


class WorkerRecord(Record):
    id: str
    name: str
    origin: Literal["local", "existing", "provider"] = "local"
    capabilities: Capabilities
    cpu_slots: int = 1
    online: bool = True
    draining: bool = False
    last_heartbeat: float = 0.0
    registered_at: float = 0.0
    pid: int | None = None

    @property
    def target(self) -> str:
        return TARGET_FOR_ORIGIN[self.origin]


class TaskRecord(Record):
    id: str
    job_id: str
    attempt: int
    node_rank: int = 0
    worker_id: str
    devices: list[int] = Field(default_factory=list)
    accelerator: str | None = None
    state: TaskState
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    rendezvous: Rendezvous | None = None


class JobRecord(Record):
    id: str
    spec: JobSpec
    state: JobState
    created_at: float
    updated_at: float
    attempt: int = 0
    exit_code: int | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    decision: PlacementDecision | None = None
    cancel_requested: bool = False
    tasks: list[TaskRecord] = Field(default_factory=list)


