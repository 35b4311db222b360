"""GPUlayer plugin for Acme NPUs (an example of a third-party plugin).

A real plugin would ask the vendor's tool (``acme-smi --json``) with
:func:`gpulayer.probing.run_tool`; this one reads ``ACME_NPU_DEVICES`` (a device count,
default 0) so it can be tried on any machine. It offers:

* an accelerator detector for kind ``npu``;
* the environment a job needs to see its granted NPUs (``ACME_VISIBLE_DEVICES``);
* a runtime profile ``acme-npu`` (accelerator npu + the ``acme-runtime`` framework);
* a framework probe for the ``acme-runtime`` distribution.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from gpulayer import hookimpl
from gpulayer.hookrecords import (
    AcceleratorDetector,
    DetectionResult,
    Device,
    DeviceEnvironment,
    FrameworkProbe,
    RuntimeProfile,
    SupportLevel,
)

KIND = "npu"


def detect(timeout: float) -> DetectionResult:
    raw = os.environ.get("ACME_NPU_DEVICES", "0")
    try:
        count = int(raw)
    except ValueError:
        return DetectionResult(diagnostics=[f"npu: ACME_NPU_DEVICES={raw!r} is not a number"])
    return DetectionResult(devices=[
        Device(kind=KIND, index=i, name="Acme NPU 9000", memory_bytes=64 * 1024**3,
               architecture="acme-v3", usable=True,
               independent=SupportLevel.UNTESTED, distributed=SupportLevel.UNSUPPORTED)
        for i in range(count)
    ])


@hookimpl
def gpulayer_accelerator_detectors() -> Iterator[AcceleratorDetector]:
    yield AcceleratorDetector(name=KIND, description="Acme NPUs", detect=detect)


@hookimpl
def gpulayer_device_environment(kind: str, devices: list[Device]) -> DeviceEnvironment | None:
    if kind != KIND:
        return None  # not ours: let the plugin for that kind answer
    return DeviceEnvironment(name=KIND, env={
        "ACME_VISIBLE_DEVICES": ",".join(str(d.index) for d in devices)})


@hookimpl
def gpulayer_runtime_profiles() -> Iterator[RuntimeProfile]:
    yield RuntimeProfile(name="acme-npu", description="Acme runtime on Acme NPUs",
                         accelerator=KIND, frameworks={"acme-runtime": ""})


@hookimpl
def gpulayer_framework_probes() -> Iterator[FrameworkProbe]:
    yield FrameworkProbe(name="acme-runtime", distributions=["acme-runtime"])
