from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpulayer import hookimpl, plugins
from gpulayer.errors import PluginError
from gpulayer.fakes import FakeAcceleratorPlugin
from gpulayer.hookrecords import RuntimeProfile

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")


def write_module(tmp_path: Path, name: str, source: str, monkeypatch) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_bundled_plugins_load_through_entry_points():
    infos = {i.name: i for i in plugins.get_manager().list_plugins()}
    for name in ("cuda", "rocm", "mps", "frameworks", "profiles"):
        assert infos[name].status == "loaded"
        assert infos[name].distribution == "gpulayer"
    assert infos["cuda"].hooks == ["gpulayer_accelerator_detectors", "gpulayer_device_environment"]
    assert {"cuda", "rocm", "mps"} <= set(plugins.detectors())


def test_disabled_plugins_are_not_imported(monkeypatch):
    monkeypatch.setenv("GPULAYER_DISABLE_PLUGINS", "cuda, rocm")
    monkeypatch.delitem(sys.modules, "gpulayer_rocm", raising=False)
    infos = {i.name: i for i in plugins.get_manager().list_plugins()}
    assert infos["cuda"].status == infos["rocm"].status == "disabled"
    assert "gpulayer_rocm" not in sys.modules
    assert "cuda" not in plugins.detectors() and "mps" in plugins.detectors()


def test_unknown_name_in_disable_list_is_reported(monkeypatch):
    monkeypatch.setenv("GPULAYER_DISABLE_PLUGINS", "cuda,cdua")
    with pytest.warns(plugins.PluginWarning, match="names no installed plugin: cdua"):
        manager = plugins.get_manager()
    assert manager.unknown_disabled == ["cdua"]


def test_broken_plugin_module_is_skipped_with_a_warning(tmp_path, monkeypatch):
    write_module(tmp_path, "gl_broken", "raise ImportError('libacme.so not found')\n", monkeypatch)
    monkeypatch.setenv("GPULAYER_PLUGINS", "gl_broken")
    with pytest.warns(plugins.PluginWarning, match="'gl_broken'.*failed to load.*libacme.so"):
        manager = plugins.get_manager()
    info = {i.name: i for i in manager.list_plugins()}["gl_broken"]
    assert info.status == "broken" and "libacme.so not found" in (info.error or "")
    assert "cuda" in plugins.detectors()  # everything else still works


def test_broken_entry_point_names_its_distribution(tmp_path):
    """A real entry point (dist-info on sys.path) whose module raises on import."""
    dist = tmp_path / "gpulayer_broken-0.3.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer-broken\nVersion: 0.3.1\n")
    (dist / "entry_points.txt").write_text("[gpulayer]\nbroken = gpulayer_broken\n")
    (tmp_path / "gpulayer_broken.py").write_text("1 / 0\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "gpulayer.cli", "plugins", "list"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert ("warning: gpulayer plugin 'broken' (distribution gpulayer-broken) failed to load "
            "and was skipped: ZeroDivisionError: division by zero") in proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("broken "))
    assert "broken" in line.split()[1] and "gpulayer-broken 0.3.1" in line
    assert "error: ZeroDivisionError: division by zero" in proc.stdout


def test_conflicting_detectors_name_both_plugins(plugin_manager):
    plugin_manager.register(FakeAcceleratorPlugin("npu"), name="acme")
    plugin_manager.register(FakeAcceleratorPlugin("npu"), name="initech")
    with pytest.raises(PluginError) as err:
        plugins.detectors()
    assert "Conflicting plugins found for accelerator detector 'npu'" in str(err.value)
    assert "'acme'" in str(err.value) and "'initech'" in str(err.value)


def test_conflict_with_a_bundled_profile(plugin_manager):
    class Mine:
        @hookimpl
        def gpulayer_runtime_profiles(self):
            yield RuntimeProfile(name="mlx", accelerator="mps")

    plugin_manager.register(Mine(), name="my-profiles")
    with pytest.raises(PluginError, match="runtime profile 'mlx'") as err:
        plugins.profiles()
    assert "'profiles'" in str(err.value) and "'my-profiles'" in str(err.value)


def test_unknown_hook_names_the_plugin(plugin_manager):
    class Typo:
        @hookimpl
        def gpulayer_accelerator_detector(self):  # singular: no such hook
            return []

    with pytest.raises(PluginError, match="plugin 'typo-plugin' implements a hook"):
        plugin_manager.register(Typo(), name="typo-plugin")


def test_fake_accelerator_fixture_replaces_the_real_detector(fake_accelerator):
    fake = fake_accelerator("cuda", count=2, memory_gb=80)
    from gpulayer.resources import detect_devices

    devices, _ = detect_devices(timeout=5)
    assert [d.kind for d in devices] == ["cuda", "cuda"] and fake.detect_calls == 1
    assert plugins.device_environment("cuda", devices[1:]) == {"CUDA_VISIBLE_DEVICES": "1"}
    other = fake_accelerator()
    assert plugins.device_environment("fakegpu", other.devices) == {"FAKEGPU_VISIBLE_DEVICES": "0,1"}
