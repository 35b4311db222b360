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
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: keys a host section may set for every host at once (the pool level)
SHARED_KEYS = ("port", "user", "key_file", "python", "known_hosts", "strict_host_key_checking", "state_dir",
               "environment")
#: what the adapter itself puts in the worker's environment
RESERVED_ENV = ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_CA", "GPULAYER_MACHINE_ID")


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

    host: str = Field(min_length=1, description="address or DNS name sshd listens on")
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(min_length=1)
    key_file: str = Field(min_length=1, description="private key (OpenSSH format, no passphrase); ~ is expanded")
    python: str = Field(default="python3", min_length=1,
                        description="the host's Python with GPUlayer installed: runs the worker and its jobs")
    name: str | None = Field(default=None, min_length=1, description="what offers and machines call the host")
    known_hosts: str | None = Field(default=None, description="known_hosts file to check the host key against "
                                                              "(default ~/.ssh/known_hosts)")
    strict_host_key_checking: Literal["yes", "accept-new", "no"] = "yes"
    state_dir: str = Field(default="~/.gpulayer/ssh-provider", min_length=1,
                           description="folder on the host for markers, logs and the worker's home")
    environment: dict[str, str] = Field(default_factory=dict,
                                        description="extra variables for the worker (PATH, CUDA_HOME, ...)")
    cpus: int | None = Field(default=None, ge=1)
    memory_gb: float | None = Field(default=None, gt=0)
    devices: list[DeclaredDevices] = Field(default_factory=list)
    frameworks: dict[str, str] = Field(default_factory=dict, description="declared framework versions")

    @model_validator(mode="after")
    def _check(self) -> HostConfig:
        reserved = sorted(set(self.environment) & set(RESERVED_ENV))
        if reserved:
            raise ValueError(f"environment: {', '.join(reserved)} is set by GPUlayer itself for each machine")
        if (self.cpus is None) != (self.memory_gb is None) or (self.devices and self.cpus is None):
            raise ValueError("declare cpus and memory_gb together (devices and frameworks optional), "
                             "or none of them to have the host probed over SSH")
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
        if not shared:
            return data
        rest = {k: v for k, v in data.items() if k not in SHARED_KEYS}
        hosts = rest.get("hosts")
        if isinstance(hosts, list):
            rest["hosts"] = [{**shared, **h} if isinstance(h, dict) else h for h in hosts]
        return rest

    @model_validator(mode="after")
    def _unique_names(self) -> SshPoolConfig:
        seen: dict[str, int] = {}
        for i, h in enumerate(self.hosts):
            if h.label in seen:
                raise ValueError(f"hosts: hosts {seen[h.label]} and {i} are both called {h.label!r}; "
                                 f"give one a name")
            seen[h.label] = i
        return self
