"""The control plane's records: workers, jobs, tasks, their states and placement decisions.

These are what the control plane stores and what the API returns; users read them
(``JobRecord`` from ``gpulayer.get_job(...).record()``), plugins never need them.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, PrivateAttr

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


#: the longest a :class:`JobError`'s type, message and traceback may be, in characters
MAX_ERROR_TYPE = 200
MAX_ERROR_MESSAGE = 1_000_000
MAX_ERROR_TRACEBACK = 10_000_000


class JobError(Record):
    """Why a job or a task did not succeed, as data.

    ``type`` says what kind of end it was (``cancelled``, ``lost``, ``unschedulable``,
    ``timed_out``, ``failed``, ``dependency``, ``bundle``, ``launcher``, ``plugin``, ``worker``, or the exception type a
    function raised); ``message`` is for people; ``traceback`` is set when a function raised.
    Build them with the named constructors, so the same end always reads the same.
    """

    type: str = Field(min_length=1, max_length=MAX_ERROR_TYPE)
    message: str = Field(default="", max_length=MAX_ERROR_MESSAGE)
    traceback: str | None = Field(default=None, max_length=MAX_ERROR_TRACEBACK)

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
    def unschedulable(cls, decision: PlacementDecision, hints: Sequence[str] = ()) -> JobError:
        """The decision's lines (summary, one per rejected worker), then ``hints``: the
        nearest miss and the ``explain`` command to run."""
        return cls(type="unschedulable", message="\n".join([decision.render(), *hints]))

    @classmethod
    def ended(cls, state: TaskState, message: str) -> JobError:
        """The task's process ended as ``state`` (failed, timed_out, cancelled)."""
        return cls(type=state.value, message=message)

    @classmethod
    def raised_by(cls, type_name: str, message: str, traceback: str) -> JobError:
        """A function job raised ``type_name``."""
        return cls(type=type_name, message=message, traceback=traceback)

    @classmethod
    def dependency(cls, message: str) -> JobError:
        """It never ran: a job it runs after (``spec.after``) ended without success."""
        return cls(type="dependency", message=message)

    @classmethod
    def bundle(cls, message: str) -> JobError:
        return cls(type="bundle", message=message)

    @classmethod
    def launcher(cls, message: str) -> JobError:
        return cls(type="launcher", message=message)

    @classmethod
    def plugin(cls, message: str) -> JobError:
        """A plugin the task needed failed (it names the plugin and its hook)."""
        return cls(type="plugin", message=message)

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
    #: an admin paused it (``gpulayer worker pause``): no new work; the jobs only it could run wait.
    #: Written only when true: a client older than the lenient read of records (docs/server.md,
    #: "Upgrading") refuses an answer with a field it does not know
    paused: bool = Field(default=False, exclude_if=lambda paused: not paused)

    @property
    def target(self) -> str:
        return TARGET_FOR_ORIGIN[self.origin]


class TaskUsage(Record):
    """What a task's processes used, as the kernel counted it when the task's main process
    was reaped (``wait4``): that process and every process below it that its parent waited
    for (a shell's commands, torchrun's workers, a ``subprocess.run``); not a process that
    was left running, nor one that detached itself (docs/concepts.md, "Resource usage")."""

    #: seconds of CPU in user mode, and in the kernel on their behalf
    cpu_user: float = Field(ge=0, le=1e12)
    cpu_system: float = Field(ge=0, le=1e12)
    #: bytes: the largest resident set of one of those processes (not their sum), the pages it
    #: shares counted (a forked task's include its fork server's: the preloads it imported).
    #: None where the count says only ``max_rss_at_most``: Linux carries a process's peak
    #: across ``exec``, so a spawned task's count starts from its worker's own peak, and one
    #: that used less cannot be told from it
    max_rss: int | None = Field(default=None, ge=0, le=2**62)
    #: bytes, where ``max_rss`` is None: its worker's peak, which the task's stayed within
    max_rss_at_most: int | None = Field(default=None, ge=0, le=2**62, exclude_if=lambda v: v is None)

    @property
    def cpu(self) -> float:
        return self.cpu_user + self.cpu_system

    def describe(self) -> str:
        """``CPU 1.23 s (user 1.20 s, system 0.03 s), peak memory 312.4 MB``."""
        from gpulayer.bundles.archive import format_size

        cpu = f"CPU {self.cpu:.2f} s (user {self.cpu_user:.2f} s, system {self.cpu_system:.2f} s)"
        if self.max_rss is not None:
            return f"{cpu}, peak memory {format_size(self.max_rss)}"
        if self.max_rss_at_most is not None:
            return f"{cpu}, peak memory at most {format_size(self.max_rss_at_most)} (counted from its worker's peak)"
        return cpu


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
    #: it waits for jobs, its CPU slot lent to the queue meanwhile (docs/concepts.md, "Jobs
    #: that submit jobs"); only while it runs. Written only when true: a client older than
    #: the lenient read of records (docs/server.md, "Upgrading") refuses an answer with a
    #: field it does not know, and this one was in every answer with a task
    lent: bool = Field(default=False, exclude_if=lambda lent: not lent)
    #: what its processes used, once it ended and where its worker measured it (schema 14).
    #: A server sends it only to a client that reads it (its ``Gpulayer-Reads`` header names
    #: ``usage``): a client older than the lenient read refuses a field it does not know
    usage: TaskUsage | None = Field(default=None, exclude_if=lambda usage: usage is None)


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

    def outcome(self) -> str:
        """``job-... cancelled`` or ``job-... failed: exit code 3``: the state once, then what
        the error adds to it (nothing when it only repeats the state). What ``gpulayer``'s
        commands print as a job ends, and the message of the SDK's :class:`JobFailed`."""
        state = self.state.value
        why = self.error.describe() if self.error else ""
        while why.startswith(f"{state}: "):  # "cancelled: cancelled: ..." says it once
            why = why[len(state) + 2:]
        return f"job {self.id} {state}" if why in ("", state) else f"job {self.id} {state}: {why}"


# --------------------------------------------------------------------------- machines
#
# The cloud target: machines providers bring up (:mod:`gpulayer.provisioning`).

#: a machine's states, in the order it goes through them (``failed`` ends a machine that
#: never worked: its launch failed, or it did not join by its deadline)
MachineState = Literal["requested", "launching", "booting", "idle", "busy", "terminating", "terminated",
                       "failed"]
MACHINE_ENDED = ("terminated", "failed")


class MachineRecord(Record):
    """One machine of a provider, as ``gpulayer machines list`` shows it."""

    id: str
    provider: str
    shape: str
    region: str | None = None
    state: MachineState
    #: why it is in this state (failed, terminating, terminated)
    reason: str = ""
    job_id: str | None = None
    worker_id: str | None = None
    provider_id: str | None = None
    price_per_hour: float | None = None
    created_at: float
    launched_at: float | None = None
    joined_at: float | None = None
    join_deadline: float
    idle_since: float | None = None
    ended_at: float | None = None
    #: what it cost from launch to now (or to its end); None for capacity you own
    cost: float | None = None

    @property
    def scope(self) -> str:
        return "/".join(p for p in (self.provider, self.region, self.shape) if p)


class ProviderInfo(Record):
    """One provider instance (a section of providers.toml), as ``gpulayer providers list`` shows it."""

    name: str
    type: str
    #: the plugin (distribution) the adapter comes from
    plugin: str = ""
    configured: bool = True
    #: None: not checked yet
    credentials_ok: bool | None = None
    #: why the provider is disabled (its credentials failed); None when it is in use
    disabled: str | None = None
    machines_running: int = 0
    max_machines: int
    max_price_per_hour: float | None = None
    idle_timeout: float
    join_timeout: float
    #: the last error of a call to it, if the last call failed
    last_error: str | None = None




# --------------------------------------------------------------------------- explanations
#
# What ``explain`` answers (docs/explain.md documents every field). The control plane
# fills these in; the scheduler's pure half is :mod:`gpulayer.scheduling.nearest`.


class Miss(Record):
    """One requirement a worker fails, and how far it is from meeting it.

    ``distance`` grows with how much would have to change (a framework upgrade is 1, a
    shortfall of devices, CPUs or RAM between 1 and 2, a wrong OS or target 10): see
    :mod:`gpulayer.scheduling.nearest`. ``text`` says it from the worker's side:
    ``has 1 of 2 cuda devices``, ``has torch 2.1.0, needs >=2.2 (one upgrade away)``.
    """

    code: str  # the reason's code (devices, framework_version, ...)
    #: the spec field it is about (``requirements.gpus``, ``requirements.frameworks.torch``),
    #: None when the job cannot change it (a worker without CPU slots)
    field: str | None = None
    wanted: str | None = None
    have: str | None = None
    distance: float
    text: str


class Closest(Record):
    """Rejected workers that fail in the same words, ranked by how little would change."""

    worker: str  # the first of them in fleet order
    #: how many more workers fail in exactly these words
    like: int = 0
    misses: list[Miss]
    distance: float  # the sum of the misses' distances

    def render(self) -> str:
        who = self.worker + (f" (+{self.like} like it)" if self.like else "")
        return f"{who} {' and '.join(m.text for m in self.misses)}"


class Relaxation(Record):
    """One change to the job, and how many workers would then be compatible.

    ``action``: ``relax`` (``field`` to ``value``), ``drop`` (the requirement ``field``,
    whose value is ``was``) or ``add`` (``value`` to ``field``: a fallback target).
    """

    field: str  # spec path: requirements.gpus, requirements.frameworks.jax, placement.fallback_targets
    action: Literal["relax", "drop", "add"]
    was: str | None = None
    value: str | None = None
    fits: int
    workers: list[str] = Field(default_factory=list)  # the first few of them


class RunningTask(Record):
    """A task holding room on a worker, as ``explain`` shows it."""

    job_id: str | None = None  # None: another owner's job
    task_id: str | None = None
    state: TaskState
    accelerator: str | None = None
    devices: list[int] = Field(default_factory=list)
    started_at: float | None = None
    #: when it ends at the latest (its start plus the job's timeout); None: no limit, or not started
    ends_by: float | None = None


class WorkerExplanation(Record):
    """One worker's answer to one job: eligible and free, busy, unavailable, or rejected."""

    worker: str
    name: str
    target: str
    status: Literal["free", "busy", "draining", "offline", "rejected"]
    #: rejected: ``check``'s reasons; busy, draining, offline: the availability reason
    reasons: list[Reason] = Field(default_factory=list)
    misses: list[Miss] = Field(default_factory=list)  # rejected only
    distance: float = 0.0
    running: list[RunningTask] = Field(default_factory=list)
    #: busy: when enough room frees for the job at the latest, if every task that must end has a limit
    frees_at: float | None = None


class OfferFit(Record):
    """A provider's machine that would fit the job, once booted."""

    provider: str
    shape: str
    region: str | None = None
    price_per_hour: float | None = None  # None: capacity you own
    spot: bool = False
    availability: str = "unknown"
    #: why it is never launched for this job (its section's limits), or None
    never_launched: str | None = None
    #: until when it is not tried (a launch of its scope failed, or a machine of it did not
    #: join: see docs/providers.md#failover), or None
    blocked_until: float | None = None
    #: what blocked it (``quota exceeded (...)``, ``m-... did not join within 600 s``)
    blocked_why: str | None = None
    #: why no machine of it is launched now (its provider's ``max_machines`` reached, or
    #: its own ``capacity``), or None
    no_room: str | None = None
    #: why it could never run the job (the first reason, as against a worker): an offer in
    #: :attr:`Explanation.unfit_offers`; None in :attr:`Explanation.offers`
    unfit: str | None = None


class Explanation(Record):
    """Could a job run, where, and if not, what comes closest (``gpulayer explain``)."""

    job_id: str | None = None  # set by explain_job
    state: JobState | None = None  # the stored job's state
    spec: JobSpec
    #: what a placement pass would decide for this job alone, now
    decision: PlacementDecision
    #: explain_job: the last pass's word on the job, with the whole queue in view
    stored_decision: PlacementDecision | None = None
    #: queued jobs a pass would place before it, plus one; None when the job is not queued
    queue_position: int | None = None
    workers: list[WorkerExplanation] = Field(default_factory=list)
    #: provider offers that would fit, cheapest first; None: this control plane has no providers to ask
    offers: list[OfferFit] | None = None
    #: the other offers of the providers, each with why it cannot run the job (``unfit``)
    unfit_offers: list[OfferFit] = Field(default_factory=list)
    #: providers that offer nothing now, and why (disabled, or their offers failing)
    providers_down: list[str] = Field(default_factory=list)
    closest: list[Closest] = Field(default_factory=list)
    relaxations: list[Relaxation] = Field(default_factory=list)
    at: float = 0.0
    #: how the front end that asked names options (a :class:`~gpulayer.wording.Spelling`), for ``str()``
    _spelling: Any = PrivateAttr(default=None)

    def render(self, spelling: Any = None) -> str:
        """The explanation in words, options named as ``spelling`` (a
        :class:`~gpulayer.wording.Spelling`) writes them: see :mod:`gpulayer.explanations`."""
        from gpulayer.explanations import render

        return render(self, spelling or self._spelling)

    def __str__(self) -> str:
        return self.render()

    @property
    def verdict(self) -> str:
        """``assigned`` (would be placed now), ``waiting`` or ``unschedulable``."""
        return self.decision.outcome

    def closest_line(self) -> str | None:
        """``closest: wkr-a has 1 of 2 cuda devices; wkr-b ...``, or None when nothing was rejected."""
        return closest_line(self.closest)


def closest_line(closest: Sequence[Closest]) -> str | None:
    if not closest:
        return None
    return "closest: " + "; ".join(c.render() for c in closest)
