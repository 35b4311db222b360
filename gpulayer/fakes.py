"""Fake accelerators for tests: in-process plugin objects and an env-driven plugin module.

In-process (plugin authors' and our own unit tests)::

    from gpulayer import plugins
    from gpulayer.fakes import FakeAcceleratorPlugin
    plugins.register(FakeAcceleratorPlugin(kind="fakegpu", count=2, memory_gb=80))

Across processes (a worker started as a subprocess): this module is itself a plugin that
reports the devices described by ``GPULAYER_FAKE_DEVICES``, so load it by name::

    env = {**os.environ, **fake_devices_env("cuda:2:80:9.0")}
    # GPULAYER_PLUGINS=gpulayer.fakes, GPULAYER_FAKE_DEVICES=cuda:2:80:9.0,
    # GPULAYER_DISABLE_PLUGINS=cuda (so the real detector does not conflict)
    subprocess.run(["gpulayer", "worker", "start", ...], env=env)

``GPULAYER_FAKE_DEVICES`` is a comma-separated list of ``KIND:COUNT[:MEMORY_GB[:CC]]``;
memory is in binary gigabytes (80 -> 80 GiB, shown as "80.0 GB"). A job granted fake
devices sees ``CUDA_VISIBLE_DEVICES`` for ``cuda``, ``ROCR_VISIBLE_DEVICES`` for ``rocm``
and ``<KIND>_VISIBLE_DEVICES`` otherwise.

This module imports neither pytest nor any framework, so workers can load it cheaply.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from gpulayer.hookrecords import (
    AcceleratorDetector,
    DetectionResult,
    Device,
    DeviceEnvironment,
    SupportLevel,
)
from gpulayer.hookspecs import hookimpl

__all__ = ["FAKE_DEVICES_ENV", "FakeAcceleratorPlugin", "fake_devices_env",
           "parse_fake_devices", "visible_devices_var"]

FAKE_DEVICES_ENV = "GPULAYER_FAKE_DEVICES"
#: Kinds whose bundled detector must be disabled when a fake of that kind is loaded.
BUNDLED_KINDS = ("cuda", "rocm", "mps")


def visible_devices_var(kind: str) -> str:
    return {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "ROCR_VISIBLE_DEVICES"}.get(
        kind, f"{kind.upper().replace('-', '_')}_VISIBLE_DEVICES")


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
        found[kind] = _make_devices(kind, count, memory, cc, usable=True)
    return found


def fake_devices_env(spec: str, *, disable: list[str] | None = None) -> dict[str, str]:
    """Environment for a subprocess that should see the fake devices in ``spec``."""
    kinds = list(parse_fake_devices(spec))
    blocked = [k for k in kinds if k in BUNDLED_KINDS] + list(disable or [])
    extra = [p for p in os.environ.get("GPULAYER_PLUGINS", "").split(",") if p.strip()]
    env = {
        "GPULAYER_PLUGINS": ",".join(dict.fromkeys([*extra, __name__])),
        FAKE_DEVICES_ENV: spec,
    }
    existing = [p for p in os.environ.get("GPULAYER_DISABLE_PLUGINS", "").split(",") if p.strip()]
    if blocked or existing:
        env["GPULAYER_DISABLE_PLUGINS"] = ",".join(dict.fromkeys([*existing, *blocked]))
    return env


class FakeAcceleratorPlugin:
    """A plugin object offering ``count`` fake devices of ``kind``.

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
            import time

            time.sleep(self.hang)
        if self.fail:
            raise RuntimeError(self.fail)
        return DetectionResult(devices=[d.model_copy() for d in self.devices])

    @hookimpl
    def gpulayer_accelerator_detectors(self) -> Iterator[AcceleratorDetector]:
        yield AcceleratorDetector(name=self.kind, description=f"fake {self.kind} devices",
                                  detect=self.detect)

    @hookimpl
    def gpulayer_device_environment(self, kind: str, devices: list[Device]) -> DeviceEnvironment | None:
        if kind != self.kind:
            return None
        return DeviceEnvironment(name=kind, env={
            visible_devices_var(kind): ",".join(str(d.index) for d in devices)})


# ----------------------------------------------------------------- the env-driven plugin


def _from_env() -> dict[str, list[Device]]:
    return parse_fake_devices(os.environ.get(FAKE_DEVICES_ENV, ""))


@hookimpl
def gpulayer_accelerator_detectors() -> Iterator[AcceleratorDetector]:
    for kind, devices in _from_env().items():
        def detect(timeout: float, _devices: list[Device] = devices) -> DetectionResult:
            return DetectionResult(devices=[d.model_copy() for d in _devices])

        yield AcceleratorDetector(name=kind, description=f"fake {kind} devices ({FAKE_DEVICES_ENV})",
                                  detect=detect)


@hookimpl
def gpulayer_device_environment(kind: str, devices: list[Device]) -> DeviceEnvironment | None:
    if kind not in _from_env():
        return None
    return DeviceEnvironment(name=kind, env={
        visible_devices_var(kind): ",".join(str(d.index) for d in devices)})
