"""GPUlayer plugin for Acme NPUs (an example of a third-party plugin).

A real plugin would ask the vendor's tool (``acme-smi --json``) with
:func:`gpulayer.plugin.run_tool`; this one reads ``ACME_NPU_DEVICES`` (a device count,
default 0) so it can be tried on any machine. It offers:

* an accelerator detector for kind ``npu``, whose ``hide_env`` hides every NPU from a job
  that was granted none;
* the environment a job needs to see its granted NPUs (``ACME_VISIBLE_DEVICES``);
* a runtime profile ``acme-npu`` (accelerator npu + the ``acme-runtime`` framework);
* framework probes for the ``acme-runtime`` distribution and for Acme's PyTorch extension,
  whose ``torch.npu`` sub-probe is what ``gpulayer.torch.launch(accelerator="npu")`` then
  requires.

It imports only ``gpulayer.plugin``, the supported plugin API.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from gpulayer import plugin

KIND = "npu"
VISIBLE = "ACME_VISIBLE_DEVICES"

_TORCH_NPU = """
import acme_torch
if acme_torch.npu.is_available():
    return acme_torch.__version__
return None
"""


def detect(timeout: float) -> plugin.DetectionResult:
    raw = os.environ.get("ACME_NPU_DEVICES", "0")
    try:
        count = int(raw)
    except ValueError:
        return plugin.DetectionResult(diagnostics=[f"npu: ACME_NPU_DEVICES={raw!r} is not a number"])
    return plugin.DetectionResult(devices=[
        plugin.Device(kind=KIND, index=i, name="Acme NPU 9000", memory_bytes=64 * 1024**3,
                      architecture="acme-v3", usable=True,
                      independent=plugin.SupportLevel.UNTESTED, distributed=plugin.SupportLevel.UNSUPPORTED)
        for i in range(count)
    ])


@plugin.hookimpl
def gpulayer_accelerator_detectors() -> Iterator[plugin.AcceleratorDetector]:
    # inputs: what detect() reads, so that a change of it is detected again, not answered
    # from the capability cache
    yield plugin.AcceleratorDetector(name=KIND, description="Acme NPUs", detect=detect,
                                     hide_env={VISIBLE: ""}, inputs=["ACME_NPU_DEVICES"])


@plugin.hookimpl
def gpulayer_device_environment(kind: str, devices: list[plugin.Device]) -> plugin.DeviceEnvironment | None:
    if kind != KIND:
        return None  # not ours: let the plugin for that kind answer
    return plugin.DeviceEnvironment(name=KIND, env={VISIBLE: ",".join(str(d.index) for d in devices)})


@plugin.hookimpl
def gpulayer_runtime_profiles() -> Iterator[plugin.RuntimeProfile]:
    yield plugin.RuntimeProfile(name="acme-npu", description="Acme runtime on Acme NPUs",
                                accelerator=KIND, frameworks={"acme-runtime": ""})


@plugin.hookimpl
def gpulayer_framework_probes() -> Iterator[plugin.FrameworkProbe]:
    yield plugin.FrameworkProbe(name="acme-runtime", distributions=["acme-runtime"])
    yield plugin.FrameworkProbe(name="acme-torch", distributions=["acme-torch"], subprobes=[
        plugin.SubProbe(name="torch.npu", code=_TORCH_NPU, accelerator=KIND)])
