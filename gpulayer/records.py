"""The control plane's records: workers, jobs, tasks, their states and placement decisions.

These are what the control plane stores and what the API returns; users read them
(``JobRecord`` from ``gpulayer.get_job(...).record()``), plugins never need them.
"""

from __future__ import annotations

import enum
import secrets
from typing import Any, Literal

from pydantic import Field

from gpulayer._base import Record
from gpulayer.hookrecords import Capabilities, Rendezvous
from gpulayer.specs import JobSpec

ORIGIN_FOR_TARGET = {"local": "local", "remote": "existing", "cloud": "provider"}
TARGET_FOR_ORIGIN = {v: k for k, v in ORIGIN_FOR_TARGET.items()}

# --------------------------------------------------------------------------- stored states


def new_id(prefix: str) -> str:
    """A fresh id such as ``job-3f2a9c1b7e4d`` (48 random bits after the prefix)."""
    return f"{prefix}-{secrets.token_hex(6)}"


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


class JobError(Record):
    """Why a job or a task did not succeed, as data.

    ``type`` says what kind of end it was (``cancelled``, ``lost``, ``unschedulable``,
    ``timed_out``, ``failed``, ``bundle``, ``launcher``, ``worker``, or the exception type a
    function raised); ``message`` is for people; ``traceback`` is set when a function raised.
    Build them with the named constructors, so the same end always reads the same.
    """

    type: str = Field(min_length=1, max_length=200)
    message: str = Field(default="", max_length=1_000_000)
    traceback: str | None = Field(default=None, max_length=10_000_000)

    @property
    def raised(self) -> bool:
        """A function job raised (the type is its exception's, the traceback its own)."""
        return self.traceback is not None

    def describe(self) -> str:
        """``type: message``, or just one of them when the other adds nothing."""
        if not self.message or self.message == self.type:
            return self.type
        if self.message.startswith(self.type):
            return self.message
        return f"{self.type}: {self.message}"

    @classmethod
    def cancelled(cls, message: str = "cancelled") -> JobError:
        return cls(type="cancelled", message=message)

    @classmethod
    def lost(cls, why: str) -> JobError:
        return cls(type="lost", message=why)

    @classmethod
    def unschedulable(cls, decision: PlacementDecision) -> JobError:
        return cls(type="unschedulable", message=decision.render())

    @classmethod
    def ended(cls, state: TaskState, message: str) -> JobError:
        """The task's process ended as ``state`` (failed, timed_out, cancelled)."""
        return cls(type=state.value, message=message)

    @classmethod
    def raised_by(cls, type_name: str, message: str, traceback: str) -> JobError:
        """A function job raised ``type_name``."""
        return cls(type=type_name, message=message, traceback=traceback)

    @classmethod
    def bundle(cls, message: str) -> JobError:
        return cls(type="bundle", message=message)

    @classmethod
    def launcher(cls, message: str) -> JobError:
        return cls(type="launcher", message=message)

    @classmethod
    def worker(cls, message: str) -> JobError:
        """The worker could not run or report the task (not the task's own failure)."""
        return cls(type="worker", message=message)


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
    error: JobError | None = None
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
    error: JobError | None = None
    decision: PlacementDecision | None = None
    cancel_requested: bool = False
    tasks: list[TaskRecord] = Field(default_factory=list)


