"""The plugin's own tests, using the fixtures gpulayer ships (gpulayer.testing)."""

import gpulayer_acme_npu
import pytest

from gpulayer import plugins
from gpulayer.profiles import resolve_requirements
from gpulayer.resources import detect_devices
from gpulayer.specs import Requirements


@pytest.fixture
def acme(plugin_manager, gpulayer_home):
    # Installed (pip install -e .), the entry point already loads it; otherwise register it.
    if "acme-npu" not in {p.name for p in plugin_manager.list_plugins()}:
        plugin_manager.register(gpulayer_acme_npu, name="acme-npu")
    return plugin_manager


def test_two_npus(acme, monkeypatch):
    monkeypatch.setenv("ACME_NPU_DEVICES", "2")
    devices, _ = detect_devices(timeout=5)
    npus = [d for d in devices if d.kind == "npu"]
    assert [d.index for d in npus] == [0, 1]
    assert plugins.device_environment("npu", npus[1:]) == {"ACME_VISIBLE_DEVICES": "1"}


def test_bad_setting_is_a_diagnostic(acme, monkeypatch):
    monkeypatch.setenv("ACME_NPU_DEVICES", "lots")
    _, diagnostics = detect_devices(timeout=5)
    assert "npu: ACME_NPU_DEVICES='lots' is not a number" in diagnostics


def test_profile(acme):
    req = resolve_requirements(Requirements(profile="acme-npu"))
    assert req.accelerator == "npu" and req.frameworks == {"acme-runtime": ""}
