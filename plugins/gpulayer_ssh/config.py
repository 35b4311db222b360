"""The ``ssh`` provider's section of providers.toml, as a pydantic model.

::

    [gpu-boxes]
    type = "ssh"
    max_machines = 2            # the core's keys (type, max_machines, ...) are taken out first
    idle_timeout = "10m"
    user = "ml"                 # defaults for every host; a host may set its own
    key_file = "~/.ssh/gpulayer_ed25519"
    python = "/opt/gpulayer/bin/python"

    [[gpu-boxes.hosts]]
    host = "10.0.0.5"

    [[gpu-boxes.hosts]]
    host = "10.0.0.6"
    port = 2222
    name = "box-b"
    cpus = 32
    memory_gb = 256
    devices = [{ kind = "cuda", count = 4, memory_gb = 80, name = "NVIDIA A100-SXM4-80GB" }]

A key of :data:`SHARED_KEYS` given in the section is validated there (an error names it
where it was written, ``port``, not ``hosts.0.port``) and then copied into every host that
does not set its own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

#: keys a host section may set for every host at once (the pool level)
SHARED_KEYS = ("port", "user", "key_file", "python", "known_hosts", "strict_host_key_checking", "state_dir",
               "environment")
#: what the adapter itself puts in the worker's environment
RESERVED_ENV = ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_CA", "GPULAYER_MACHINE_ID")


def _no_reserved(environment: dict[str, str]) -> dict[str, str]:
    reserved = sorted(set(environment) & set(RESERVED_ENV))
    if reserved:
        raise ValueError(f"{', '.join(reserved)} is set by GPUlayer itself for each machine; "
                         f"leave it out")
    return environment


# the types of the keys a host and the pool both accept (the same checks at either level)
Port = Annotated[int, Field(ge=1, le=65535)]
Text = Annotated[str, Field(min_length=1)]
HostKeyChecking = Literal["yes", "accept-new", "no"]
Environment = Annotated[dict[str, str], AfterValidator(_no_reserved)]


class DeclaredDevices(BaseModel):
    """``count`` devices of one kind a host has, when the host is declared instead of probed."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1, description="accelerator kind: cuda, rocm, ...")
    count: int = Field(default=1, ge=1)
    memory_gb: float | None = Field(default=None, gt=0, description="memory of each device, GB (1024**3 bytes)")
    name: str | None = None
    compute_capability: str | None = None


class HostConfig(BaseModel):
    """One host of the pool."""

    model_config = ConfigDict(extra="forbid")

    host: Text = Field(description="address or DNS name sshd listens on")
    port: Port = 22
    user: Text = Field(description="the user the worker runs as (here or in the section)")
    key_file: Text = Field(description="private key (OpenSSH format, no passphrase); ~ is expanded "
                                       "(here or in the section)")
    python: Text = Field(default="python3",
                         description="the host's Python with GPUlayer installed: runs the worker and its jobs")
    name: str | None = Field(default=None, min_length=1, description="what offers and machines call the host")
    known_hosts: str | None = Field(default=None, description="known_hosts file to check the host key against "
                                                              "(default ~/.ssh/known_hosts)")
    strict_host_key_checking: HostKeyChecking = "yes"
    state_dir: Text = Field(default="~/.gpulayer/ssh-provider",
                            description="folder on the host for markers, logs and the worker's home")
    environment: Environment = Field(default_factory=dict,
                                     description="extra variables for the worker (PATH, CUDA_HOME, ...)")
    cpus: int | None = Field(default=None, ge=1)
    memory_gb: float | None = Field(default=None, gt=0)
    devices: list[DeclaredDevices] = Field(default_factory=list)
    frameworks: dict[str, str] = Field(default_factory=dict, description="declared framework versions")

    @model_validator(mode="after")
    def _check(self) -> HostConfig:
        # devices and frameworks are what a declared host has; a probed host reports its own
        if (self.cpus is None) != (self.memory_gb is None) or (self.devices and self.cpus is None):
            raise ValueError("declare cpus and memory_gb together (devices and frameworks optional), "
                             "or none of them to have the host probed over SSH")
        if self.frameworks and self.cpus is None:
            raise ValueError("frameworks are declared with the host's cpus and memory_gb (a host that declares "
                             "nothing is probed over SSH, its frameworks too): declare cpus and memory_gb, "
                             "or leave frameworks out")
        return self

    @property
    def label(self) -> str:
        return self.name or (self.host if self.port == 22 else f"{self.host}:{self.port}")

    @property
    def declared(self) -> bool:
        return self.cpus is not None

    def where(self) -> str:
        """``user@host:port``, for messages."""
        return f"{self.user}@{self.host}:{self.port}"


class SshPoolConfig(BaseModel):
    """A pool of hosts; ``port``, ``user``, ``key_file``, ``python``, ``known_hosts``,
    ``strict_host_key_checking``, ``state_dir`` and ``environment`` given here apply to
    every host that does not set its own."""

    model_config = ConfigDict(extra="forbid")

    # defaults for every host (None: not given); validated here so that an error names the
    # key where it was written, then copied into each host that does not set its own
    port: Port | None = None
    user: Text | None = None
    key_file: Text | None = None
    python: Text | None = None
    known_hosts: str | None = None
    strict_host_key_checking: HostKeyChecking | None = None
    state_dir: Text | None = None
    environment: Environment | None = None
    hosts: list[HostConfig] = Field(min_length=1)
    connect_timeout: float = Field(default=10.0, gt=0, description="seconds for TCP connect, banner and auth")
    command_timeout: float = Field(default=60.0, gt=0, description="seconds for one remote step")
    probe_timeout: float = Field(default=120.0, gt=0, description="seconds for probing a host's capabilities")
    stop_grace: float = Field(default=20.0, ge=0,
                              description="seconds between SIGTERM and SIGKILL when a worker is stopped")

    @model_validator(mode="before")
    @classmethod
    def _spread_shared(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        shared = {k: data[k] for k in SHARED_KEYS if k in data}
        hosts = data.get("hosts")
        if not shared or not isinstance(hosts, list):
            return data
        return {**data, "hosts": [{**shared, **h} if isinstance(h, dict) else h for h in hosts]}

    @model_validator(mode="after")
    def _unique_names(self) -> SshPoolConfig:
        seen: dict[str, int] = {}
        for i, h in enumerate(self.hosts):
            if h.label in seen:
                raise ValueError(f"hosts: hosts {seen[h.label]} and {i} are both called {h.label!r}; "
                                 f"give one a name")
            seen[h.label] = i
        return self
