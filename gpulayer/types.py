"""The typed records GPUlayer's parts exchange.

Plugins return the hook records (:class:`AcceleratorDetector`, :class:`FrameworkProbe`,
:class:`RuntimeProfile`, :class:`ProviderAdapter`, :class:`DistributedLauncher`); the core
turns what they report into :class:`Capabilities`; users describe jobs with
:class:`Requirements`, :class:`Placement` and the job specs (:class:`CommandJob`,
:class:`FunctionJob`, :class:`DistributedJob`); the control plane stores
:class:`JobRecord`, :class:`TaskRecord` and :class:`WorkerRecord`.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer.errors import InvalidRequirement

# --------------------------------------------------------------------------- devices


class SupportLevel(str, enum.Enum):
    """How far a kind of work on a device has been checked, as ``resources detect`` shows it."""

    HARDWARE_VALIDATED = "hardware-validated"
    FIXTURE_TESTED = "fixture-tested"
    UNTESTED = "untested"
    UNSUPPORTED = "unsupported"


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class Device(Record):
    """One accelerator as a detector sees it."""

    kind: str = Field(description="accelerator kind: cuda, rocm, mps, or a plugin's own")
    index: int = Field(ge=0, description="index the vendor's runtime uses for it")
    name: str
    memory_bytes: int | None = Field(default=None, ge=0)
    unified_memory: bool = False
    compute_capability: str | None = Field(default=None, description='e.g. "9.0" for CUDA')
    architecture: str | None = Field(default=None, description='e.g. "gfx90a", "arm64"')
    uuid: str | None = None
    driver_version: str | None = None
    usable: bool = True
    unusable_reason: str | None = None
    independent: SupportLevel = SupportLevel.UNTESTED
    distributed: SupportLevel = SupportLevel.UNTESTED

    @property
    def memory_gb(self) -> float | None:
        return None if self.memory_bytes is None else self.memory_bytes / 1e9

    def describe(self) -> str:
        """The seed's line: ``[0] mps Apple arm64 GPU (Metal) (32.0 GB unified) ...``."""
        parts = [f"[{self.index}] {self.kind} {self.name}"]
        if self.memory_bytes is not None:
            # Binary gigabytes, as vendors label memory: a 32 GB Mac shows "32.0 GB".
            gib = self.memory_bytes / 1024**3
            parts.append(f"({gib:.1f} GB{' unified' if self.unified_memory else ''})")
        if self.compute_capability:
            parts.append(f"cc={self.compute_capability}")
        if not self.usable:
            parts.append(f"unusable ({self.unusable_reason or 'no reason given'})")
        parts.append(f"independent={self.independent.value} distributed={self.distributed.value}")
        return " ".join(parts)


class DetectionResult(Record):
    """What one detector found: devices, and diagnostic lines when something went wrong."""

    devices: list[Device] = Field(default_factory=list)
    diagnostics: list[str] = Field(default_factory=list)


class HostInfo(Record):
    os: str = Field(description="platform.system().lower(): linux, darwin, windows")
    os_release: str = ""
    arch: str = Field(description="platform.machine(): x86_64, arm64, aarch64")
    hostname: str = ""
    cpu_count: int = Field(ge=0)
    memory_bytes: int = Field(ge=0)
    disk_free_bytes: int = Field(default=0, ge=0)
    python_version: str
    python_path: str = ""
    address: str = Field(default="127.0.0.1", description="the address peers can reach")


class Capabilities(Record):
    """Everything a worker reports: host facts, devices, frameworks, backends."""

    host: HostInfo
    devices: list[Device] = Field(default_factory=list)
    frameworks: dict[str, str] = Field(default_factory=dict)
    distributed_backends: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    diagnostics: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- hook records

DetectFn = Callable[[float], DetectionResult]


class HookRecord(BaseModel):
    """Base of every record a hook returns: a ``name`` unique across all plugins."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(min_length=1)


class AcceleratorDetector(HookRecord):
    """Finds the devices of one accelerator kind.

    ``detect(timeout)`` returns a :class:`DetectionResult`; it must finish within about
    ``timeout`` seconds (run vendor tools with that timeout) and report trouble as a
    diagnostic instead of raising. ``name`` is the accelerator kind it reports.
    """

    description: str = ""
    detect: Callable[[float], DetectionResult]


class DeviceEnvironment(HookRecord):
    """Environment a job needs to see exactly the devices it was granted; ``name`` is the kind."""

    env: dict[str, str]


class SubProbe(BaseModel):
    """A capability of a framework that can only be read by importing it.

    ``code`` is the body of a Python function run in the job Python; it must ``return``
    a version string when the capability is present and ``None`` otherwise.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description='e.g. "torch.cuda"')
    code: str


class FrameworkProbe(HookRecord):
    """A GPU/ML framework and how to read its version.

    The version is read from the installed distribution's metadata (``distributions``,
    first one found wins; a name may end in ``*``, e.g. ``cupy-cuda*``) without importing
    the framework. ``subprobes`` run in one
    subprocess of the job Python. ``backends_code``, when given, is a function body that
    returns a list of distributed backends (torch: nccl, gloo, mpi).
    """

    distributions: list[str] = Field(default_factory=list)
    subprobes: list[SubProbe] = Field(default_factory=list)
    backends_code: str | None = None


class RuntimeProfile(HookRecord):
    """A named shorthand that fills in accelerator and frameworks."""

    description: str = ""
    accelerator: str | None = None
    frameworks: dict[str, str] = Field(default_factory=dict)


class MachineOffer(Record):
    """A machine a provider could boot; it can stand in for a worker-to-be when placing."""

    provider: str
    shape: str
    capabilities: Capabilities
    price_per_hour: float | None = None
    region: str | None = None


class ProvisionedMachine(Record):
    provider: str
    machine_id: str
    shape: str
    address: str | None = None


class ProviderAdapter(HookRecord):
    """A cloud or cluster that boots workers for ``cloud`` jobs.

    ``offers(requirements)`` lists machine shapes that could run a job;
    ``launch(offer, control_url, bootstrap_token)`` boots one whose worker joins with the
    single-use token; ``terminate(machine_id)`` ends it.
    """

    description: str = ""
    offers: Callable[[Requirements], list[MachineOffer]]
    launch: Callable[[MachineOffer, str, str], ProvisionedMachine]
    terminate: Callable[[str], None]


class Rendezvous(Record):
    """Facts every node of a distributed job shares."""

    master_addr: str
    master_port: int
    nnodes: int
    run_id: str


class LaunchCommand(Record):
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)


class DistributedLauncher(HookRecord):
    """Turns a distributed job plus rendezvous facts into one node's command.

    ``build(job, rendezvous, node_rank, python)`` returns a :class:`LaunchCommand`.
    """

    description: str = ""
    build: Callable[[DistributedJob, Rendezvous, int, str], LaunchCommand]


# --------------------------------------------------------------------------- requirements

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def parse_framework_spec(spec: str) -> tuple[str, str]:
    """``'torch>=2.2'`` -> ``('torch', '>=2.2')``; ``'jax'`` -> ``('jax', '')``.

    Raises :class:`InvalidRequirement` naming the spec and why when it cannot be parsed.
    """
    text = spec.strip()
    m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", text)
    if not m:
        raise InvalidRequirement(
            f"framework requirement {spec!r}: expected NAME or NAME followed by a PEP 440 "
            "version specifier, e.g. 'torch>=2.2' or 'jax'"
        )
    name, rest = m.group(1), m.group(2).strip()
    return name, check_specifier(rest, what=f"framework requirement {spec!r}")


def check_specifier(spec: str, *, what: str) -> str:
    """Return ``spec`` normalised, or raise :class:`InvalidRequirement` naming ``what``."""
    text = spec.strip()
    if not text:
        return ""
    try:
        SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise InvalidRequirement(
            f"{what}: {text!r} is not a PEP 440 version specifier ({exc}); "
            "accepted: comma-separated clauses such as '>=2.2', '==2.3.*', '>=1.0,<2'"
        ) from None
    if re.search(r"(==|!=|<=|>=|~=|===|<|>)\s*(,|$)", text) or text.endswith(","):
        raise InvalidRequirement(
            f"{what}: {text!r} has an operator with no version; "
            "accepted: clauses such as '>=2.2', '==2.3.*'"
        )
    return text


class Requirements(Record):
    """What a job needs from a worker. Every field is optional; empty means "anything"."""

    accelerator: str | None = Field(
        default=None, description="accelerator kind (cuda, rocm, mps, ...); None or 'cpu' = none"
    )
    gpus: int | None = Field(default=None, ge=0, description="devices per node; default 1 with an accelerator")
    min_gpu_memory_gb: float | None = Field(default=None, gt=0)
    compute_capability: str | None = Field(default=None, description="specifier, e.g. '>=8.0'")
    frameworks: dict[str, str] = Field(default_factory=dict)
    python: str | None = Field(default=None, description="specifier, e.g. '>=3.10'")
    os: str | None = None
    cpus: int | None = Field(default=None, ge=0)
    memory_gb: float | None = Field(default=None, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    profile: str | None = Field(default=None, description="runtime profile applied at submit time")

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().lower()
        if not _NAME_RE.match(v):
            raise ValueError(f"accelerator {v!r}: expected a kind such as 'cuda', 'rocm', 'mps' or 'cpu'")
        return None if v == "cpu" else v

    @field_validator("frameworks", mode="before")
    @classmethod
    def _frameworks(cls, v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            out: dict[str, str] = {}
            for item in v:
                name, spec = parse_framework_spec(str(item))
                out[name] = spec
            return out
        if isinstance(v, Mapping):
            out = {}
            for name, spec in v.items():
                if not isinstance(name, str) or not _NAME_RE.match(name):
                    raise ValueError(f"framework name {name!r}: expected a name such as 'torch' or 'torch.cuda'")
                out[name] = check_specifier(str(spec or ""), what=f"framework requirement {name!r}")
            return out
        return v

    @field_validator("compute_capability", "python")
    @classmethod
    def _spec(cls, v: str | None, info: Any) -> str | None:
        if v is None:
            return None
        if re.match(r"^\d+(\.\d+)*$", v.strip()):
            v = ">=" + v.strip()
        return check_specifier(v, what=f"{info.field_name} requirement") or None

    @field_validator("os")
    @classmethod
    def _os(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip().lower()
        aliases = {"macos": "darwin", "mac": "darwin", "osx": "darwin"}
        return aliases.get(v, v)

    @property
    def device_count(self) -> int:
        """Devices the job needs on each node."""
        if self.accelerator is None:
            return 0
        return 1 if self.gpus is None else self.gpus

    def merged(self, other: Requirements) -> Requirements:
        """``self`` with the fields ``other`` sets filled in where ``self`` leaves them empty."""
        data = self.model_dump(exclude_unset=True)
        for key, value in other.model_dump(exclude_unset=True).items():
            if key == "frameworks":
                data["frameworks"] = {**value, **data.get("frameworks", {})}
            elif key == "labels":
                data["labels"] = {**value, **data.get("labels", {})}
            elif data.get(key) is None:
                data[key] = value
        return Requirements.model_validate(data)


Target = Literal["local", "remote", "cloud"]
TARGETS: tuple[str, ...] = ("local", "remote", "cloud")


class Placement(Record):
    target: Target = "local"
    fallback_targets: list[Target] = Field(default_factory=list)
    on_unschedulable: Literal["fail", "wait"] = "fail"

    @model_validator(mode="after")
    def _distinct(self) -> Placement:
        seen = [self.target]
        for t in self.fallback_targets:
            if t in seen:
                raise ValueError(f"placement.fallback_targets: {t!r} is listed twice (with target {self.target!r})")
            seen.append(t)
        return self

    @property
    def targets(self) -> list[str]:
        return [self.target, *self.fallback_targets]


ORIGIN_FOR_TARGET = {"local": "local", "remote": "existing", "cloud": "provider"}
TARGET_FOR_ORIGIN = {v: k for k, v in ORIGIN_FOR_TARGET.items()}


# --------------------------------------------------------------------------- job specs


class _JobBase(Record):
    name: str | None = Field(default=None, max_length=200)
    requirements: Requirements = Field(default_factory=Requirements)
    placement: Placement = Field(default_factory=Placement)
    timeout: float | None = Field(default=None, gt=0, description="seconds per attempt")
    retries: int = Field(default=0, ge=0, le=100, description="extra attempts after a failure or loss")
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher runs first")
    env: dict[str, str] = Field(default_factory=dict)
    bundle: str | None = Field(
        default=None,
        description="directory to send as a source bundle (a path on the submitting machine)",
    )
    bundle_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"env: {key!r} is not a valid environment variable name")
        return v


class CommandJob(_JobBase):
    """Run a command (an argv list), inside the source bundle when one is given."""

    kind: Literal["command"] = "command"
    command: list[str] = Field(min_length=1)

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError("command: expected a list of arguments such as ['python', 'train.py'], not a string")
        return v


FUNCTION_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class FunctionJob(_JobBase):
    """Call ``module:function(*args, **kwargs)``; arguments and result are JSON."""

    kind: Literal["function"] = "function"
    function: str = Field(description="'package.module:function'")
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    python: str | None = Field(default=None, description="interpreter to run it; default: the worker's job Python")

    @field_validator("function")
    @classmethod
    def _function(cls, v: str) -> str:
        if not FUNCTION_RE.match(v):
            raise ValueError(f"function: {v!r} is not 'module:function' (e.g. 'train:main' or 'pkg.mod:fn')")
        return v

    @model_validator(mode="after")
    def _json_args(self) -> FunctionJob:
        check_json(self.args, "args")
        check_json(self.kwargs, "kwargs")
        return self


class DistributedJob(_JobBase):
    """One coordinated workload over ``nodes`` workers, launched by a launcher plugin."""

    kind: Literal["distributed"] = "distributed"
    nodes: int = Field(default=1, ge=1, le=1024)
    nproc_per_node: int = Field(default=1, ge=1, le=1024)
    entry: str = Field(min_length=1, description="'train.py' or 'package.module:function'")
    args: list[str] = Field(default_factory=list)
    launcher: str = "torchrun"


JobSpec = Annotated[CommandJob | FunctionJob | DistributedJob, Field(discriminator="kind")]


def check_json(value: Any, path: str) -> None:
    """Raise :class:`~gpulayer.errors.InvalidArgument` at the first value that is not JSON.

    The message names the path of the offending value (``args[1]["weights"]``).
    """
    from gpulayer.errors import InvalidArgument

    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(
                f"{path}: {value!r} is not JSON (NaN and infinities are not allowed); "
                "accepted: None, bool, int, finite float, str, list, dict with str keys"
            )
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgument(
                    f"{path}: key {key!r} is not a string; JSON objects have string keys"
                )
            check_json(item, f"{path}[{key!r}]".replace("'", '"'))
        return
    hint = ""
    if callable(value):
        hint = " (functions, lambdas and closures cannot be sent: see docs/adr/0002-json-only-arguments.md)"
    raise InvalidArgument(
        f"{path}: a {type(value).__name__} is not JSON{hint}; "
        "accepted: None, bool, int, finite float, str, list, dict with str keys"
    )


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


def job_spec_from_dict(data: Mapping[str, Any]) -> CommandJob | FunctionJob | DistributedJob:
    """Validate a job spec given as a plain mapping (from JSON)."""
    from pydantic import TypeAdapter

    spec: CommandJob | FunctionJob | DistributedJob = TypeAdapter(JobSpec).validate_python(data)
    return spec


__all__ = [
    "TARGETS",
    "AcceleratorDetector",
    "Capabilities",
    "CommandJob",
    "DetectionResult",
    "Device",
    "DeviceEnvironment",
    "DistributedJob",
    "DistributedLauncher",
    "FrameworkProbe",
    "FunctionJob",
    "HookRecord",
    "HostInfo",
    "JobRecord",
    "JobSpec",
    "JobState",
    "LaunchCommand",
    "MachineOffer",
    "Placement",
    "PlacementDecision",
    "ProviderAdapter",
    "ProvisionedMachine",
    "Reason",
    "Rendezvous",
    "Requirements",
    "RuntimeProfile",
    "SubProbe",
    "SupportLevel",
    "TaskRecord",
    "TaskState",
    "WorkerRecord",
    "check_json",
    "job_spec_from_dict",
    "parse_framework_spec",
]
ProviderAdapter.model_rebuild()
DistributedLauncher.model_rebuild()
