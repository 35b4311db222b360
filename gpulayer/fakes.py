"""Fake accelerators for tests: in-process plugin objects and an env-driven plugin module.

Only detection is faked. A fake detector is a *stand-in*
(:attr:`~gpulayer.hookrecords.AcceleratorDetector.stand_in`): where an installed plugin
detects the same kind, the fake's devices replace what that plugin would find, and the
job environment (the device environment hook, ``hide_env``) still comes from that plugin,
so a job on two fake ``cuda`` devices sees exactly what it would see on two real ones.
For a kind no installed plugin knows (``fakegpu``, ``npu``), the fake sets
``<KIND>_VISIBLE_DEVICES`` itself.

In-process (plugin authors' and our own unit tests)::

    from gpulayer import plugin, plugins
    plugins.register(plugin.FakeAcceleratorPlugin(kind="fakegpu", count=2, memory_gb=80))

Across processes (a worker started as a subprocess): this module is itself a plugin that
reports the devices described by ``GPULAYER_FAKE_DEVICES``, so load it by name::

    env = {**os.environ, **fake_devices_env("cuda:2:80:9.0")}
    # GPULAYER_PLUGINS=gpulayer.fakes, GPULAYER_FAKE_DEVICES=cuda:2:80:9.0
    subprocess.run(["gpulayer", "worker", "start", ...], env=env)

``GPULAYER_FAKE_DEVICES`` is a comma-separated list of ``KIND:COUNT[:MEMORY_GB[:CC]]``;
memory is in binary gigabytes (80 -> 80 GiB, shown as "80.0 GB").

:func:`no_real_devices_env` gives the environment in which no installed detector runs
(``GPULAYER_DETECTORS=none``), so a process sees the fakes and nothing of the machine's
own hardware.

This module imports neither pytest nor any framework, so workers can load it cheaply.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator

from gpulayer.hookrecords import (
    AcceleratorDetector,
    DetectFn,
    DetectionResult,
    Device,
    DeviceEnvironment,
    SupportLevel,
    is_kind,
)
from gpulayer.hookspecs import hookimpl
from gpulayer.plugins import DETECTORS_ENV, DISABLE_ENV, EXTRA_ENV, NO_DETECTORS

__all__ = ["FAKE_DEVICES_ENV", "FakeAcceleratorPlugin", "fake_devices_env", "no_real_devices_env",
           "parse_fake_devices"]

FAKE_DEVICES_ENV = "GPULAYER_FAKE_DEVICES"


def _visible_var(kind: str) -> str:
    return f"{kind.upper().replace('-', '_')}_VISIBLE_DEVICES"


def _detector(kind: str, description: str, detect: DetectFn) -> AcceleratorDetector:
    return AcceleratorDetector(name=kind, description=description, detect=detect,
                               hide_env={_visible_var(kind): ""}, stand_in=True)


def _environment(kind: str, devices: list[Device]) -> DeviceEnvironment:
    return DeviceEnvironment(name=kind, env={_visible_var(kind): ",".join(str(d.index) for d in devices)})


def _make_devices(kind: str, count: int, memory_gb: float | None, compute_capability: str | None,
                  usable: bool) -> list[Device]:
    return [
        Device(
            kind=kind, index=i, name=f"Fake {kind.upper()} GPU",
            memory_bytes=int(memory_gb * 1024**3) if memory_gb is not None else None,
            compute_capability=compute_capability, uuid=f"FAKE-{kind}-{i}",
            driver_version="fake", usable=usable,
            unusable_reason=None if usable else "fake device marked unusable",
            independent=SupportLevel.FIXTURE_TESTED, distributed=SupportLevel.FIXTURE_TESTED,
        )
        for i in range(count)
    ]


def parse_fake_devices(spec: str) -> dict[str, list[Device]]:
    """``"cuda:2:80:9.0,npu:1"`` -> ``{"cuda": [2 devices], "npu": [1 device]}``."""
    found: dict[str, list[Device]] = {}
    for item in (p.strip() for p in spec.split(",")):
        if not item:
            continue
        parts = item.split(":")
        try:
            kind, count = parts[0].strip().lower(), int(parts[1])
            memory = float(parts[2]) if len(parts) > 2 and parts[2] else None
            cc = parts[3] if len(parts) > 3 and parts[3] else None
        except (IndexError, ValueError):
            raise ValueError(
                f"{FAKE_DEVICES_ENV}: {item!r} is not KIND:COUNT[:MEMORY_GB[:CC]], "
                "e.g. 'cuda:2:80:9.0'"
            ) from None
        if not is_kind(kind):  # (said naming the variable, not as the fakes plugin's failure)
            raise ValueError(
                f"{FAKE_DEVICES_ENV}: {item!r}: {kind!r} is not an accelerator kind; accepted: lowercase letters, "
                "digits, '.', '_' and '-', starting with a letter or digit, other than cpu and none, e.g. 'npu:1'"
            )
        found[kind] = _make_devices(kind, count, memory, cc, usable=True)
    return found


def _env_list(name: str) -> list[str]:
    return [p.strip() for p in os.environ.get(name, "").split(",") if p.strip()]


def fake_devices_env(spec: str, *, disable: list[str] | None = None) -> dict[str, str]:
    """Environment for a subprocess that should see the fake devices in ``spec``.

    The fakes stand in for the detectors of their kinds; nothing is disabled except the
    plugins named in ``disable`` (added to ``GPULAYER_DISABLE_PLUGINS``).
    """
    parse_fake_devices(spec)  # a bad spec fails here, not in the subprocess
    env = {
        EXTRA_ENV: ",".join(dict.fromkeys([*_env_list(EXTRA_ENV), __name__])),
        FAKE_DEVICES_ENV: spec,
    }
    if disable:
        env[DISABLE_ENV] = ",".join(dict.fromkeys([*_env_list(DISABLE_ENV), *disable]))
    return env


def no_real_devices_env(keep: Iterable[str] = ()) -> dict[str, str]:
    """Environment in which a process runs no installed accelerator detector except those
    of the kinds in ``keep``: it sees fake devices only (and what ``keep`` finds)."""
    kinds = [k.strip().lower() for k in keep if k.strip()]
    return {DETECTORS_ENV: ",".join(kinds) or NO_DETECTORS}


class FakeAcceleratorPlugin:
    """A plugin object offering ``count`` fake devices of ``kind``, standing in for the
    detector of that kind if one is installed.

    Register it with :func:`gpulayer.plugins.register` (or the ``fake_accelerator``
    fixture). ``detect_calls`` counts detections; ``fail``/``hang`` make ``detect`` raise or
    sleep, to test how callers cope.
    """

    def __init__(
        self, kind: str = "fakegpu", count: int = 2, memory_gb: float | None = 80,
        compute_capability: str | None = "9.0", *, usable: bool = True,
        fail: str | None = None, hang: float = 0.0,
    ) -> None:
        self.kind = kind
        self.name = f"fake-{kind}"
        self.devices = _make_devices(kind, count, memory_gb, compute_capability, usable)
        self.fail = fail
        self.hang = hang
        self.detect_calls = 0

    def detect(self, timeout: float) -> DetectionResult:
        self.detect_calls += 1
        if self.hang:
            time.sleep(self.hang)
        if self.fail:
            raise RuntimeError(self.fail)
        return DetectionResult(devices=[d.model_copy() for d in self.devices], source="fake (test fixture)")

    @hookimpl
    def gpulayer_accelerator_detectors(self) -> Iterator[AcceleratorDetector]:
        yield _detector(self.kind, f"fake {self.kind} devices", self.detect)

    @hookimpl
    def gpulayer_device_environment(self, kind: str, devices: list[Device]) -> DeviceEnvironment | None:
        # Asked only where no installed plugin detects this kind: the manager leaves a
        # stand-in out of this hook for the kind it stands in for.
        return _environment(kind, devices) if kind == self.kind else None


# ----------------------------------------------------------------- the env-driven plugin


def _from_env() -> dict[str, list[Device]]:
    return parse_fake_devices(os.environ.get(FAKE_DEVICES_ENV, ""))


@hookimpl
def gpulayer_accelerator_detectors() -> Iterator[AcceleratorDetector]:
    for kind, devices in _from_env().items():
        def detect(timeout: float, _devices: list[Device] = devices) -> DetectionResult:
            return DetectionResult(devices=[d.model_copy() for d in _devices], source=f"fake ({FAKE_DEVICES_ENV})")

        yield _detector(kind, f"fake {kind} devices ({FAKE_DEVICES_ENV})", detect)


@hookimpl
def gpulayer_device_environment(kind: str, devices: list[Device]) -> DeviceEnvironment | None:
    return _environment(kind, devices) if kind in _from_env() else None
