"""A provider for tests: its machines are local ``gpulayer worker start`` processes.

Load it by name in the server's environment (``GPULAYER_PLUGINS=gpulayer.testprovider``) and
configure it in providers.toml with ``type = "local-process"``::

    [local]
    type = "local-process"
    max_machines = 2
    idle_timeout = "5s"
    join_timeout = "60s"
    state_dir = "/tmp/machines"          # default: $GPULAYER_HOME/local-machines
    # home_template = "/tmp/warm-home"   # each machine's home starts as a copy of this folder

    [[local.shapes]]
    name = "gpu1"
    region = "here"
    devices = "cuda:1:80:9.0"            # fake devices the worker reports (gpulayer.fakes)
    price_per_hour = 1.5
    # fail = "quota"                     # launch raises: no_capacity, quota, skip, transient
    # join = false                       # the machine starts but never joins

A launch is instant: it starts ``gpulayer worker start --name MACHINE_ID`` as a real
subprocess (in a session of its own, so it outlives a server killed in a test) with the
launch request's environment (the bootstrap token is in ``GPULAYER_TOKEN``, never in argv)
and a home of its own under ``state_dir``, which starts as a copy of ``home_template`` when
one is set (what a machine image brings: e.g. ``cache/probes``, so that its worker does not
probe the frameworks again). ``list`` reads the machine files there, so it
finds the machines of a server that died; ``terminate`` ends the process group. With
``start_workers = false`` a launch starts nothing (the bench's instant provider).
``auth_fails = true`` makes every call raise ``ProviderAuthFailed``. ``garbage = ["offers",
"launch", "list"]`` makes those calls answer with the wrong types, as a broken adapter
might: ``offers`` the shapes' names (strings), ``launch`` (after starting the machine) its
provider id as a bare string, ``list`` one dict instead of a ``LiveMachine``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, cast

import psutil
from pydantic import BaseModel, ConfigDict, DirectoryPath, Field

from gpulayer import config
from gpulayer.errors import NoCapacity, ProviderAuthFailed, ProviderTransient, QuotaExceeded, SkipOffer
from gpulayer.fakes import FAKE_DEVICES_ENV, parse_fake_devices
from gpulayer.hookrecords import (
    Capabilities,
    HostInfo,
    LaunchedMachine,
    LaunchRequest,
    LiveMachine,
    MachineOffer,
    ProviderAdapter,
)
from gpulayer.hookspecs import hookimpl
from gpulayer.plugins import DETECTORS_ENV, EXTRA_ENV, NO_DETECTORS
from gpulayer.specs import Requirements

NAME = "local-process"
_FAILURES = {"no_capacity": NoCapacity, "quota": QuotaExceeded, "skip": SkipOffer, "transient": ProviderTransient}
#: settings of the server's own that a machine's worker must not inherit
_SERVER_ONLY = ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_CA", "GPULAYER_DATABASE_URL", "GPULAYER_PROVIDERS",
                "GPULAYER_PUBLIC_URL", "GPULAYER_PLUGINS", FAKE_DEVICES_ENV, "GPULAYER_HOME")


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    region: str | None = None
    devices: str = Field(default="", description="fake devices, KIND:COUNT[:MEMORY_GB[:CC]], comma separated")
    cpus: int = Field(default=2, ge=1)
    memory_gb: float = Field(default=4.0, gt=0)
    price_per_hour: float | None = Field(default=None, ge=0)
    spot: bool = False
    availability: Literal["available", "limited", "unavailable", "unknown"] = "available"
    boot_seconds: float | None = Field(default=None, ge=0)
    fail: Literal["no_capacity", "quota", "skip", "transient"] | None = None
    join: bool = True


class LocalProcessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: str | None = None
    #: a folder each machine's home starts as a copy of (see the module doc)
    home_template: DirectoryPath | None = None
    shapes: list[Shape] = Field(default_factory=lambda: [Shape(name="cpu")])
    cpu_slots: int = Field(default=2, ge=0)
    python: str = Field(default_factory=lambda: sys.executable)
    start_workers: bool = True
    auth_fails: bool = False
    #: calls that answer with the wrong types (see the module doc)
    garbage: list[Literal["offers", "launch", "list"]] = Field(default_factory=list)
    #: extra environment of every machine's worker
    env: dict[str, str] = Field(default_factory=dict)


class LocalProcessProvider:
    """One ``local-process`` section (see the module doc)."""

    def __init__(self, name: str, settings: LocalProcessConfig) -> None:
        self.name = name
        self.settings = settings
        self.state_dir = Path(settings.state_dir or config.home() / "local-machines").expanduser()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def _auth(self) -> None:
        if self.settings.auth_fails:
            raise ProviderAuthFailed(f"{self.name}: the test credentials are refused (auth_fails = true)")

    def check(self) -> None:
        self._auth()

    def offers(self, requirements: Requirements) -> list[MachineOffer]:
        self._auth()
        if "offers" in self.settings.garbage:
            return cast("list[MachineOffer]", [s.name for s in self.settings.shapes])
        return [self._offer(s) for s in self.settings.shapes]

    def _offer(self, shape: Shape) -> MachineOffer:
        devices = [d for ds in parse_fake_devices(shape.devices).values() for d in ds]
        host = HostInfo(os=platform.system().lower(), arch=platform.machine(), hostname=platform.node(),
                        cpu_count=shape.cpus, memory_bytes=int(shape.memory_gb * 1024**3),
                        python_version=platform.python_version())
        return MachineOffer(shape=shape.name, region=shape.region, capabilities=Capabilities(host=host, devices=devices),
                            price_per_hour=shape.price_per_hour, spot=shape.spot, availability=shape.availability,
                            boot_seconds=shape.boot_seconds, data={"devices": shape.devices, "join": shape.join})

    def launch(self, request: LaunchRequest) -> LaunchedMachine:
        launched = self._launch(request)
        if "launch" in self.settings.garbage:
            return cast(LaunchedMachine, launched.provider_id)
        return launched

    def _launch(self, request: LaunchRequest) -> LaunchedMachine:
        self._auth()
        shape = next((s for s in self.settings.shapes if s.name == request.offer.shape), None)
        if shape is None:
            raise SkipOffer(f"{self.name}: no shape {request.offer.shape!r}")
        if shape.fail:
            raise _FAILURES[shape.fail](f"{self.name}: {shape.name} is set to fail with {shape.fail}")
        home = self.state_dir / request.machine_id
        meta = home / "machine.json"
        if meta.is_file():  # the same launch again: the same machine
            known = json.loads(meta.read_text())
            return LaunchedMachine(provider_id=known["provider_id"])
        home.mkdir(parents=True, exist_ok=True)
        if self.settings.home_template:
            shutil.copytree(self.settings.home_template, home, dirs_exist_ok=True)
        pid = 0
        if self.settings.start_workers:
            env = {k: v for k, v in os.environ.items() if k not in _SERVER_ONLY}
            env.update(request.worker_environment())
            env.update({"GPULAYER_HOME": str(home), DETECTORS_ENV: NO_DETECTORS, **self.settings.env})
            if shape.devices:
                env.update({EXTRA_ENV: "gpulayer.fakes", FAKE_DEVICES_ENV: shape.devices})
            argv = ([*request.worker_argv(self.settings.python), "--cpu-slots", str(self.settings.cpu_slots),
                     "--grace", "2"] if shape.join else [self.settings.python, "-c", "import time; time.sleep(3600)"])
            with open(home / "worker.log", "ab") as log:
                proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            self._procs[request.machine_id] = proc
            pid = proc.pid
        provider_id = f"local-{pid}" if pid else f"local-{request.machine_id}"
        meta.write_text(json.dumps({"machine_id": request.machine_id, "label": request.label, "pid": pid,
                                    "provider_id": provider_id, "started": time.time()}))
        return LaunchedMachine(provider_id=provider_id, address="127.0.0.1", data={"pid": pid})

    def _machines(self) -> Iterator[dict[str, object]]:
        if not self.state_dir.is_dir():
            return
        for meta in sorted(self.state_dir.glob("*/machine.json")):
            try:
                yield json.loads(meta.read_text())
            except (OSError, ValueError):
                continue

    def list(self, label: str) -> list[LiveMachine]:
        self._auth()
        if "list" in self.settings.garbage:
            return cast("list[LiveMachine]", [{"machine_id": "m-garbage", "provider_id": "garbage", "state": "running"}])
        return [LiveMachine(machine_id=str(m["machine_id"]), provider_id=str(m["provider_id"]), state="running")
                for m in self._machines() if m.get("label") == label and _alive(int(str(m.get("pid") or 0)), m)]

    def terminate(self, machine_id: str, provider_id: str | None) -> None:
        self._auth()
        meta = self.state_dir / machine_id / "machine.json"
        if not meta.is_file():
            return  # already gone
        known = json.loads(meta.read_text())
        pid = int(known.get("pid") or 0)
        if pid:
            _end_group(pid, self._procs.pop(machine_id, None))
        meta.rename(meta.with_name("machine.ended.json"))


def _alive(pid: int, meta: dict[str, object]) -> bool:
    if not pid:
        return True  # a machine without a process (start_workers = false) lives until terminated
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _end_group(pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the machine's process group, SIGKILL what is left after a few seconds."""
    for sig, wait in ((signal.SIGTERM, 8.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return
            if proc is None and not _alive(pid, {}):
                return
            time.sleep(0.1)
    if proc is not None:
        proc.poll()


@hookimpl
def gpulayer_provider_adapters() -> Iterator[ProviderAdapter]:
    yield ProviderAdapter(name=NAME, description="test machines: local `gpulayer worker start` processes",
                          config=LocalProcessConfig, create=LocalProcessProvider)


__all__ = ["NAME", "LocalProcessConfig", "LocalProcessProvider", "Shape"]
