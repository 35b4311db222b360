"""The records plugins exchange with GPUlayer.

Detectors return :class:`DetectionResult` (a list of :class:`Device`); the core turns what
every plugin reports into a worker's :class:`Capabilities`. Every hook that offers something
returns records derived from :class:`HookRecord`, each with a ``name``:
:class:`AcceleratorDetector`, :class:`FrameworkProbe`, :class:`RuntimeProfile`,
:class:`ProviderAdapter` and :class:`DistributedLauncher`. Plugin authors import them from
:mod:`gpulayer.plugin`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_core import PydanticSerializationError

from gpulayer._base import Record
from gpulayer.errors import InvalidRequirement
from gpulayer.logtext import escaped_text
from gpulayer.specs import DistributedJob, Requirements, checked_frameworks
from gpulayer.units import format_gb, gb

# --------------------------------------------------------------------------- devices


class SupportLevel(str, enum.Enum):
    """How far a kind of work on a device has been checked, as ``resources detect`` shows it."""

    HARDWARE_VALIDATED = "hardware-validated"
    FIXTURE_TESTED = "fixture-tested"
    UNTESTED = "untested"
    UNSUPPORTED = "unsupported"


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
    source: str | None = Field(
        default=None, description='how the detector learnt of the device and its memory and compute '
                                  'capability: "NVML", "nvidia-smi", "sysfs", "sysctl", ... (set by the plugin; '
                                  "default: the DetectionResult's source)")
    plugin: str | None = Field(default=None, description="the plugin whose detector reported it (set by GPUlayer)")

    @property
    def memory_gb(self) -> float | None:
        """Memory in GPUlayer's GB (1024**3 bytes, :mod:`gpulayer.units`)."""
        return None if self.memory_bytes is None else gb(self.memory_bytes)

    def describe(self) -> str:
        """The seed's line: ``[0] mps Apple arm64 GPU (Metal) (32.0 GB unified) ...``."""
        parts = [f"[{self.index}] {self.kind} {self.name}"]
        if self.memory_bytes is not None:
            # GPUlayer's GB (1024**3 bytes), as vendors label memory: a 32 GB Mac shows "32.0 GB".
            parts.append(f"({format_gb(self.memory_bytes)} GB{' unified' if self.unified_memory else ''})")
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
    source: str | None = Field(default=None, description="where the devices came from, for those that do "
                                                         "not say it themselves (Device.source)")


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


class Provenance(Record):
    """Where one value of :class:`Capabilities` came from (``resources detect --explain``)."""

    plugin: str | None = Field(default=None, description="the plugin that reported it; None for the core's own facts")
    source: str = Field(description='"NVML", "nvidia-smi", "sysfs", "package metadata (torch)", '
                                    '"sub-probe torch.cuda", "os.cpu_count()", ...')
    override: str | None = Field(default=None, description="the override that set it: "
                                 '"GPULAYER_OVERRIDE_CPU_COUNT" or "PATH/resources.toml: cpu_count"')
    detected: str | None = Field(default=None, description="what detection said, where an override replaced it")


class Capabilities(Record):
    """Everything a worker reports: host facts, devices, frameworks, backends.

    ``provenance`` says where each value came from, keyed ``host.cpu_count``,
    ``host.memory_bytes``, ``host.disk_free_bytes``, ``host.address``, ``host.python_version``,
    ``device.<kind>:<index>``, ``framework.<name>`` and ``backends``; ``overrides`` lists the
    keys an override set, with where it came from. ``hidden_devices`` are
    devices that were detected but hidden by an override; ``detector_problems`` is, per
    accelerator kind, what went wrong detecting it (a timeout, a failure), so that a
    rejection for too few devices can say so.
    """

    host: HostInfo
    devices: list[Device] = Field(default_factory=list)
    frameworks: dict[str, str] = Field(default_factory=dict)
    distributed_backends: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    diagnostics: list[str] = Field(default_factory=list)
    provenance: dict[str, Provenance] = Field(default_factory=dict)
    hidden_devices: list[Device] = Field(default_factory=list)
    detector_problems: dict[str, str] = Field(default_factory=dict)
    #: the framework probe's trouble (a hang, a crash), when it had some
    probe_problems: list[str] = Field(default_factory=list)
    #: provenance key -> the override that set it (the same as its provenance says)
    overrides: dict[str, str] = Field(default_factory=dict)

    def overridden(self, key: str) -> bool:
        """Whether the value at provenance ``key`` was set by an override."""
        return key in self.overrides

    def storable(self) -> Capabilities:
        """This record as it is stored and sent: itself, or, where a text holds a lone
        surrogate, a copy with each as its escape (``\\udcff``, as an error's text shows it).
        A path that is not UTF-8 (a ``$GPULAYER_HOME`` or job Python with the byte 0xff, which
        Python decodes to ``'\\udcff'``) is in it, and neither UTF-8, JSON nor a database can
        hold that; the worker keeps its own record as it is (it runs that Python)."""
        try:
            self.model_dump_json()
        except PydanticSerializationError:
            return Capabilities.model_validate(_escaped(self.model_dump()))
        return self


def _escaped(value: Any) -> Any:
    """``value`` (what ``model_dump`` gives) with every text, keys too, as :func:`escaped_text` writes it."""
    if isinstance(value, str):
        return escaped_text(value)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    return value


# --------------------------------------------------------------------------- hook records

DetectFn = Callable[[float], DetectionResult]
#: an accelerator kind, as a job names it (Requirements.accelerator lowercases what it is given)
_KIND_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def is_kind(name: str) -> bool:
    """Whether ``name`` is an accelerator kind a detector may name and a job ask for."""
    return bool(_KIND_RE.match(name)) and name not in ("cpu", "none")


class HookRecord(BaseModel):
    """Base of every record a hook returns: a ``name`` unique across all plugins."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(min_length=1)


class AcceleratorDetector(HookRecord):
    """Finds the devices of one accelerator kind.

    ``detect(timeout)`` returns a :class:`DetectionResult`; it must finish within about
    ``timeout`` seconds (run vendor tools with that timeout) and report trouble as a
    diagnostic instead of raising. ``name`` is the accelerator kind it reports.

    ``hide_env`` is the environment that leaves a process no device of this kind: a worker
    sets it for every task that was granted none of this kind (a CPU job, a job on another
    accelerator), so a job cannot wander onto a GPU somebody else was granted. Leave it
    empty when there is no such variable (the task then sees the devices the platform
    shows it).

    ``stand_in`` marks a test double (:mod:`gpulayer.fakes`): where another plugin offers
    a detector of the same kind, the stand-in's ``detect`` replaces that one's instead of
    conflicting with it, and everything else (``hide_env``, the device environment hook)
    still comes from the plugin it stands in for, so a job on fake devices sees exactly
    what a job on real ones would.
    """

    description: str = ""
    detect: Callable[[float], DetectionResult]
    hide_env: dict[str, str] = Field(default_factory=dict)
    #: the environment variables ``detect`` reads (``ACME_NPU_DEVICES``), beside the tools it
    #: runs: what a worker reports is cached (docs/cli.md), and a change of one of these
    #: detects again (``GPULAYER_*``, ``PATH`` and ``PYTHONPATH`` always do)
    inputs: list[str] = Field(default_factory=list)
    stand_in: bool = False

    @field_validator("name")
    @classmethod
    def _kind(cls, v: str) -> str:
        # a job names its accelerator in lowercase (Requirements.accelerator), and ``cpu``
        # means none: a kind spelt otherwise could never be asked for
        if not is_kind(v):
            # (the spelling a job would ask for, where there is one: not for 'cpu', which is none)
            hint = f" (jobs ask for a kind in lowercase: --accelerator {v.lower()})" if is_kind(v.lower()) else ""
            raise ValueError(
                f"accelerator kind {v!r}: accepted: lowercase letters, digits, '.', '_' and '-', starting with a "
                f"letter or digit, other than 'cpu' and 'none'{hint}")
        return v

    def standing_in_for(self, real: AcceleratorDetector) -> AcceleratorDetector:
        """``real`` with this stand-in's detection in its place."""
        return real.model_copy(update={"detect": self.detect, "description": self.description,
                                       "inputs": self.inputs, "stand_in": True})


class DeviceEnvironment(HookRecord):
    """Environment a job needs to see exactly the devices it was granted; ``name`` is the kind."""

    env: dict[str, str]


class SubProbe(BaseModel):
    """A capability of a framework that can only be read by importing it.

    ``code`` is the body of a Python function run in the job Python; it must ``return``
    a version string when the capability is present and ``None`` otherwise. ``name`` is
    ``<framework>.<capability>`` (``torch.cuda``); ``accelerator`` names the accelerator
    kind the capability is for, when it is for one.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description='e.g. "torch.cuda"')
    code: str
    accelerator: str | None = Field(
        default=None,
        description="the accelerator kind this capability is for: a job on that accelerator "
                    "that uses the framework needs it (the PyTorch integration adds the "
                    "torch.* one to every torch job on that accelerator)",
    )


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
    """A named shorthand that fills in accelerator and frameworks.

    Both are read as a job's own requirements read them (``cpu`` is no accelerator, a kind
    in any case is its lowercase), and checked here: a profile no job could use fails its
    plugin's hook, naming the plugin, rather than every submit that names it.
    """

    description: str = ""
    accelerator: str | None = None
    frameworks: dict[str, str] = Field(default_factory=dict)

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, v: str | None) -> str | None:
        kind = None if v is None else v.strip().lower()
        if kind is None or kind == "cpu":
            return None
        if not is_kind(kind):
            raise ValueError(f"accelerator kind {v!r}: accepted: lowercase letters, digits, '.', '_' and '-', "
                             "starting with a letter or digit, or None (or 'cpu') for none")
        return kind

    @field_validator("frameworks")
    @classmethod
    def _frameworks(cls, v: dict[str, str]) -> dict[str, str]:
        try:
            return checked_frameworks(v)
        except InvalidRequirement as exc:
            raise ValueError(str(exc)) from None


# --------------------------------------------------------------------------- providers
#
# A provider adapter brings up machines whose workers join the control plane for ``cloud``
# jobs: cloud instances, Slurm allocations, hosts of an SSH pool. The contract follows the
# peers' (Ray's v2 node provider, dstack's Compute, SkyPilot's provision API), kept small:
# offers (side-effect free), launch (with an id the core chose), list (what carries our
# label), terminate (idempotent). See docs/providers.md and docs/plugins.md.

Availability = Literal["available", "limited", "unavailable", "unknown"]


class MachineOffer(Record):
    """A machine a provider could bring up: a worker-to-be the scheduler places against.

    ``capabilities`` is what its worker would report (CPUs, memory, devices with their kind
    and memory, frameworks where the adapter knows them); a job is matched against it with
    the same rules, and reasons, as against a registered worker.
    """

    #: the provider instance (its section name in providers.toml); the core fills it in
    provider: str = ""
    #: instance type, partition shape or host: what the user picks between
    shape: str = Field(min_length=1)
    #: region, zone, partition or pool
    region: str | None = None
    capabilities: Capabilities
    #: price per hour; None for capacity you own (Slurm, your SSH hosts)
    price_per_hour: float | None = Field(default=None, ge=0)
    spot: bool = False
    availability: Availability = "unknown"
    #: expected seconds from launch to the worker joining (orders offers of equal price)
    boot_seconds: float | None = Field(default=None, ge=0)
    #: machines of this offer that can run at once (a host of an SSH pool: 1); None: as many
    #: as the section's max_machines. A distributed job that no one offer can hold gets its
    #: machines from several offers of the provider.
    capacity: int | None = Field(default=None, ge=1)
    #: the adapter's own facts about the offer (JSON), handed back in the launch request
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def scope(self) -> str:
        """``provider/region/shape``: what a failed launch blocks for a while."""
        return "/".join(p for p in (self.provider, self.region, self.shape) if p)


class LaunchRequest(Record):
    """What :meth:`Provider.launch` gets: everything a new machine needs to join.

    The core chose ``machine_id`` before calling (and stored the request): it is the
    idempotency key of the launch (a launch retried with the same id must not bring up a
    second machine) and the value the machine is tagged with, next to ``label``. The
    bootstrap token is single-use, bound to ``machine_id`` and expires at ``join_deadline``;
    it must never appear in a process's argv (pass it through the environment, stdin,
    user-data or a 0600 file): :meth:`worker_environment` has it, :meth:`worker_argv` not.
    """

    machine_id: str = Field(min_length=1)
    #: every machine of this control plane carries it; ``list()`` filters by it
    label: str = Field(min_length=1)
    offer: MachineOffer
    control_url: str
    #: what the worker trusts the server with (a ``sha256:...`` pin or a CA file's PEM text)
    ca: str | None = None
    bootstrap_token: SecretStr
    #: seconds since the epoch by which the worker must have joined, or it is terminated
    join_deadline: float

    def worker_environment(self) -> dict[str, str]:
        """The environment ``gpulayer worker start`` needs on the machine, token included."""
        env = {"GPULAYER_URL": self.control_url, "GPULAYER_TOKEN": self.bootstrap_token.get_secret_value(),
               "GPULAYER_MACHINE_ID": self.machine_id}
        if self.ca:
            env["GPULAYER_CA"] = self.ca
        return env

    def worker_argv(self, python: str = "python3") -> list[str]:
        """The worker's command line (no secret in it)."""
        return [python, "-m", "gpulayer.cli", "worker", "start", "--name", self.machine_id]


class LaunchedMachine(Record):
    """What :meth:`Provider.launch` returns."""

    #: the provider's own handle: an instance id, a Slurm job id, ``host:pid``
    provider_id: str = Field(min_length=1)
    address: str | None = None
    #: the adapter's own facts (JSON), stored with the machine's record; no call gets them back
    #: (``terminate`` gets ``provider_id``: put there what ending the machine needs)
    data: dict[str, Any] = Field(default_factory=dict)


class LiveMachine(Record):
    """One machine :meth:`Provider.list` found carrying this control plane's label."""

    machine_id: str
    provider_id: str
    state: Literal["pending", "running", "stopping", "unknown"] = "unknown"
    data: dict[str, Any] = Field(default_factory=dict)


@runtime_checkable
class Provider(Protocol):
    """One configured provider (a section of providers.toml), made by ``ProviderAdapter.create``.

    Every method may raise the typed errors of :mod:`gpulayer.plugin` (``NoCapacity``,
    ``QuotaExceeded``, ``SkipOffer``, ``ProviderAuthFailed``, ``ProviderTransient``); any
    other exception counts as transient, and so does an answer of another type than the
    method's (checked where the core calls it, and reported naming the provider, its plugin
    and the method). Calls are made from the control plane's threads, bounded by the core's
    timeouts, never in a request handler.
    """

    def check(self) -> None:
        """Raise ``ProviderAuthFailed`` if the credentials or access do not work."""
        ...

    def offers(self, requirements: Requirements) -> list[MachineOffer]:
        """Machines that could run a job needing ``requirements`` (an empty record: every
        shape). Side-effect free; the core caches the answer for a short while."""
        ...

    def launch(self, request: LaunchRequest) -> LaunchedMachine:
        """Start bringing up one machine; return once the provider accepted it (do not wait
        for the worker to join: the core watches the join deadline)."""
        ...

    def list(self, label: str) -> list[LiveMachine]:
        """Every live machine carrying ``label`` (reconciliation, orphan sweep)."""
        ...

    def terminate(self, machine_id: str, provider_id: str | None) -> None:
        """End the machine; idempotent ("already gone" is success). ``provider_id`` is None
        when the launch's answer was lost: find the machine by its ``machine_id`` tag."""
        ...


class ProviderAdapter(HookRecord):
    """A kind of provider; ``name`` is the ``type`` of a providers.toml section.

    ``config`` is the pydantic model a section is validated with (the core takes out its own
    keys first: ``type``, ``max_machines``, ``max_price_per_hour``, ``idle_timeout``,
    ``join_timeout``); ``create(instance_name, config)`` makes the :class:`Provider`.
    """

    description: str = ""
    config: type[BaseModel]
    create: Callable[[str, Any], Provider]


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
    ``check(job)``, optional, runs where the job is submitted, wherever the launcher is
    installed (the embedded control plane, a server, the SDK and CLI): raise
    :class:`ValueError` with a message that names the input to refuse a job the launcher could
    never run (an entry it cannot start), before any node is placed.
    """

    description: str = ""
    build: Callable[[DistributedJob, Rendezvous, int, str], LaunchCommand]
    check: Callable[[DistributedJob], None] | None = None


ProviderAdapter.model_rebuild()
DistributedLauncher.model_rebuild()
