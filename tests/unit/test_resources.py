from __future__ import annotations

import os
import sys
import time

import pytest

from gpulayer import hookimpl, plugins
from gpulayer.errors import GpulayerError, InvalidRequirement
from gpulayer.fakes import parse_fake_devices
from gpulayer.hookrecords import AcceleratorDetector, DetectionResult, Device
from gpulayer.probing import ToolError, ToolFailed, ToolNotFound, ToolTimeout, run_tool
from gpulayer.resources import advertise_address, detect_capabilities, detect_devices
from gpulayer.specs import Requirements, parse_framework_spec

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")


def test_capabilities_of_this_machine(monkeypatch):
    monkeypatch.setenv("GPULAYER_ADVERTISE_ADDRESS", "10.1.2.3")
    caps = detect_capabilities(timeout=120, labels={"rack": "b7"})
    h = caps.host
    assert h.os == __import__("platform").system().lower()
    assert h.cpu_count == os.cpu_count() and h.memory_bytes > 0 and h.disk_free_bytes > 0
    assert h.python_version == ".".join(map(str, sys.version_info[:3]))
    assert h.python_path == sys.executable and h.address == "10.1.2.3"
    assert caps.labels == {"rack": "b7"}
    assert caps.frameworks["torch"].startswith("2.")
    assert "gloo" in caps.distributed_backends


def test_advertise_address_default_is_an_ip():
    import ipaddress

    ipaddress.ip_address(advertise_address())


def test_a_raising_detector_becomes_a_diagnostic(fake_accelerator):
    fake_accelerator("npu", fail="driver on fire")
    devices, diagnostics = detect_devices(timeout=5)
    assert [d for d in devices if d.kind == "npu"] == []
    assert "detector 'npu' (plugin 'fake-npu') failed: RuntimeError: driver on fire" in diagnostics


def test_a_hanging_detector_is_abandoned_within_the_timeout(fake_accelerator):
    fake_accelerator("npu", hang=60)
    fake_accelerator("tpu", count=1)
    start = time.monotonic()
    devices, diagnostics = detect_devices(timeout=0.5)
    assert time.monotonic() - start < 5
    assert [d.kind for d in devices] == ["tpu"]  # the others still report
    assert "detector 'npu' (plugin 'fake-npu') gave no answer within 0.5s and was abandoned" in diagnostics


def test_fake_devices_spec():
    found = parse_fake_devices("cuda:2:80:9.0, npu:1")
    assert [d.memory_bytes for d in found["cuda"]] == [80 * 1024**3] * 2
    assert found["cuda"][0].compute_capability == "9.0" and found["npu"][0].memory_bytes is None
    with pytest.raises(ValueError, match="'cuda' is not KIND:COUNT"):
        parse_fake_devices("cuda")
    # a kind no job could ask for is named in the variable, not blamed on the fakes plugin
    # ("failed in gpulayer_accelerator_detectors ... --accelerator cpu", the fakes left out)
    for spec, kind in (("cpu:2", "cpu"), ("none:1", "none"), ("my gpu:1", "my gpu"), ("_x:1", "_x")):
        with pytest.raises(ValueError, match=rf"^GPULAYER_FAKE_DEVICES: '{spec}': '{kind}' is not an accelerator kind; "
                                             "accepted: lowercase letters"):
            parse_fake_devices(spec)
    assert list(parse_fake_devices("NPU:1, intel-gpu:1")) == ["npu", "intel-gpu"]


def test_run_tool_kills_the_whole_process_group(tmp_path):
    script = tmp_path / "forks"
    script.write_text("#!/bin/sh\nsleep 60 &\nsleep 60\n")
    script.chmod(0o755)
    start = time.monotonic()
    with pytest.raises(ToolTimeout, match=r"forks: no answer within 0\.5s"):
        run_tool([str(script)], 0.5)
    assert time.monotonic() - start < 5  # the background sleep did not hold the pipes
    with pytest.raises(ToolNotFound):
        run_tool(["gpulayer-no-such-tool"], 1)
    with pytest.raises(ToolFailed) as err:
        run_tool(["sh", "-c", "echo bad >&2; exit 4"], 5)
    assert err.value.returncode == 4 and str(err.value) == "sh: exited with status 4: bad"


def test_tool_errors_are_gpulayer_errors():
    with pytest.raises(GpulayerError) as err:
        run_tool(["gpulayer-no-such-tool"], 1)
    assert isinstance(err.value, ToolError)
    assert err.value.to_dict() == {"code": "tool_error", "message": "gpulayer-no-such-tool: not found on PATH"}


class NpuDetector:
    """An installed-looking (not stand-in) detector that counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    @hookimpl
    def gpulayer_accelerator_detectors(self):
        def detect(timeout):
            self.runs += 1
            return DetectionResult(devices=[Device(kind="npu", index=0, name="NPU")])

        yield AcceleratorDetector(name="npu", detect=detect)


def test_gpulayer_detectors_hides_real_detectors_but_not_fakes(plugin_manager, fake_accelerator, monkeypatch):
    real = NpuDetector()
    plugin_manager.register(real, name="npu-plugin")
    fake_accelerator("fakegpu", count=1)
    assert os.environ["GPULAYER_DETECTORS"] == "none"  # what gpulayer_isolated sets
    devices, diagnostics = detect_devices(timeout=5)
    assert [d.kind for d in devices] == ["fakegpu"] and real.runs == 0 and diagnostics == []
    monkeypatch.setenv("GPULAYER_DETECTORS", "npu")
    devices, _ = detect_devices(timeout=5)
    assert [d.kind for d in devices] == ["fakegpu", "npu"] and real.runs == 1
    monkeypatch.delenv("GPULAYER_DETECTORS")
    devices, _ = detect_devices(timeout=5)
    assert "npu" in {d.kind for d in devices} and real.runs == 2


def test_gpulayer_detectors_naming_no_detector_is_a_diagnostic(monkeypatch, plugin_manager):
    monkeypatch.setenv("GPULAYER_DETECTORS", " XPU ")
    devices, diagnostics = detect_devices(timeout=5)
    known = ", ".join(sorted(plugins.detectors()))
    assert devices == [] and diagnostics == [f"GPULAYER_DETECTORS names no accelerator detector: xpu "
                           f"(detectors: {known}; 'none' runs none)"]


@pytest.mark.parametrize("spec", ["torch>>2", "torch==", "torch>=", "torch 2.1 ~", "torch>=2.2,<", "torch>=abc"])
def test_malformed_framework_specs_are_refused_naming_the_spec(spec):
    with pytest.raises(InvalidRequirement) as err:
        parse_framework_spec(spec)
    assert repr(spec) in str(err.value)
    with pytest.raises((InvalidRequirement, ValueError)) as err2:
        Requirements(frameworks=[spec])
    assert repr(spec) in str(err2.value)


def test_framework_specs_that_parse():
    assert parse_framework_spec("torch>=2.2") == ("torch", ">=2.2")
    assert parse_framework_spec("jax") == ("jax", "")
    assert Requirements(frameworks={"torch.cuda": ""}).frameworks == {"torch.cuda": ""}
