"""The plugin's own tests, using the fixtures gpulayer ships (gpulayer.testing) and the
helpers in gpulayer.plugin."""

import gpulayer_acme_npu
import pytest

from gpulayer import plugin


@pytest.fixture
def acme(gpulayer_isolated, plugin_manager, monkeypatch):
    # The machine's own GPUs stay hidden; this plugin's detector runs.
    for name, value in plugin.no_real_devices_env(keep=["npu"]).items():
        monkeypatch.setenv(name, value)
    # Installed (pip install -e .), the entry point already loads it; otherwise register it.
    if "acme-npu" not in {p.name for p in plugin_manager.list_plugins()}:
        plugin_manager.register(gpulayer_acme_npu, name="acme-npu")
    return plugin_manager


def test_two_npus(acme, monkeypatch):
    monkeypatch.setenv("ACME_NPU_DEVICES", "2")
    devices, diagnostics = plugin.detect_devices(timeout=5)
    assert [(d.kind, d.index) for d in devices] == [("npu", 0), ("npu", 1)] and diagnostics == []
    assert plugin.device_environment("npu", devices[1:]) == {"ACME_VISIBLE_DEVICES": "1"}
    assert plugin.device_environment("npu", []) == {"ACME_VISIBLE_DEVICES": ""}


def test_bad_setting_is_a_diagnostic(acme, monkeypatch):
    monkeypatch.setenv("ACME_NPU_DEVICES", "lots")
    _, diagnostics = plugin.detect_devices(timeout=5)
    assert "npu: ACME_NPU_DEVICES='lots' is not a number" in diagnostics


def test_profile(acme):
    profile = plugin.records(plugin.RuntimeProfile)["acme-npu"]
    assert (profile.accelerator, profile.frameworks) == ("npu", {"acme-runtime": ""})


def test_torch_npu_is_declared_for_the_npu(acme):
    [sub] = plugin.records(plugin.FrameworkProbe)["acme-torch"].subprobes
    assert (sub.name, sub.accelerator) == ("torch.npu", "npu")
