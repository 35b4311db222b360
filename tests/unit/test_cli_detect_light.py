"""``gpulayer resources detect`` on the CLI's light path (gpulayer.cli.light,
gpulayer.capability_key): with the capability cache warm it prints exactly the text the full
path printed from the same entry, and the full path runs whenever that text may no longer be
what it would print (no entry; another interpreter, ``sys.path``, plugin or overrides; an
entry over an hour old; detection trouble; an option it does not take).

Every command runs in a fresh interpreter on a real ``$GPULAYER_HOME``, through
``gpulayer.cli.main`` (the light path when it can) or through the Typer app itself (always
the full path, which detects and stores). The probe reports which path ran by whether
Typer, pydantic, SQLAlchemy, SQLModel or pluggy was imported.

Free disk is shown to 0.1 GB; should it cross such a step between a full run and the next
(other work on this machine writes to the disk), the light path must not answer: the
helpers below retry such a pair, and still require the light path to answer at least once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer import capability_key, plugins
from gpulayer.fakes import fake_devices_env, no_real_devices_env
from tests.cli_support import Result, run_cli
from tests.support import seed_probe_cache

PLUGIN = """\
    from gpulayer import plugin

    def detect(timeout):
        return plugin.DetectionResult(devices=[plugin.Device(kind="xpu", index=0, name="Test XPU {VERSION}")])

    @plugin.hookimpl
    def gpulayer_accelerator_detectors():
        yield plugin.AcceleratorDetector(name="xpu", detect=detect)
    """

def run(args: list[str], home: Path, *, entry: str = "main", env: dict[str, str] | None = None) -> Result:
    """:func:`run_cli` with two fake CUDA devices and no real ones."""
    return run_cli(args, home, entry=entry,
                   env={**fake_devices_env("cuda:2:80:9.0"), **no_real_devices_env(), **(env or {})})


def _disk_masked(result: tuple[Any, ...]) -> tuple[Any, ...]:
    code, out, err = result
    # (the summary's "N GB free disk", and --explain's "disk free   N GB" row)
    out = re.sub(rb"[0-9.]+ GB free disk", b"N GB free disk", out)
    return code, re.sub(rb"(disk free +)[0-9.]+ GB", rb"\1N GB", out), err


def full_then_light(args: list[str], home: Path, env: dict[str, str] | None = None) -> tuple[Result, Result]:
    """A full run (which detects and keeps its text), then a run through ``main`` that the
    light path answers; again (up to 3 times) if free disk moved a step in between."""
    for _ in range(3):
        full = run(args, home, entry="app", env=env)
        assert full[0] == 0 and full[3] == "full", full
        light = run(args, home, env=env)
        if light[3] == "light":
            return full, light
        # (the full path ran instead, and says what a full run says; free disk is read anew
        # by each, and other work on the machine may move it a step between the two)
        assert _disk_masked(light[:3]) == _disk_masked(run(args, home, entry="app", env=env)[:3])
    raise AssertionError(f"the light path never answered {args}")


@pytest.fixture
def home(tmp_path: Path, probed_frameworks: Path) -> Path:
    """A home whose resources.toml overrides and hides something (so that ``--explain``
    has override rows and a diagnostic). Its framework probes' cache holds what this
    interpreter's probes found (tests/conftest.py: probed_frameworks): what these tests
    look at is the capability cache, and a full path that probed again would only import
    torch in a subprocess once more."""
    home = tmp_path / "home"
    home.mkdir()
    seed_probe_cache(home, probed_frameworks)
    (home / "resources.toml").write_text('cpu_count = 3\nhide_devices = ["cuda:1", "npu"]\n')
    return home


@pytest.mark.parametrize("args", [
    ["resources", "detect"],
    ["resources", "detect", "--explain"],
    ["resources", "detect", "--python", sys.executable],
    ["resources", "detect", f"--python={sys.executable}", "--explain"],
    ["--home", "HOME", "resources", "detect"],
    ["--token", "t", "resources", "detect", "--explain"],
])
def test_resources_detect_prints_what_the_full_path_printed(home: Path, args: list[str]) -> None:
    args = [str(home) if a == "HOME" else a for a in args]
    full, light = full_then_light(args, home)
    assert light[:3] == full[:3]
    text = light[1].decode()
    if "--explain" in args:
        assert "device cuda:0" in text and "Fake CUDA GPU, 80.0 GB, cc=9.0" in text
        assert f"override {home / 'resources.toml'}: cpu_count" in text
        assert "diagnostic override" in text and "no npu device was detected" in text
    else:
        assert "3 CPUs" in text and "[0] cuda Fake CUDA GPU (80.0 GB) cc=9.0" in text and "[1] cuda" not in text


def test_each_text_is_kept_for_its_own_command_line(home: Path) -> None:
    """``detect`` and ``detect --explain`` alternate on the light path once each ran in
    full: a detection that found the same keeps the texts already kept."""
    plain, _ = full_then_light(["resources", "detect"], home)
    explain, _ = full_then_light(["resources", "detect", "--explain"], home)
    assert plain[1] != explain[1]
    for args, want in ((["resources", "detect"], plain), (["resources", "detect", "--explain"], explain)):
        got = run(args, home)
        if got[3] == "light":  # (free disk may have moved a step: then it is the full path's)
            assert got[:3] == want[:3]


@pytest.mark.parametrize("args", [
    ["resources", "detect", "--json"],
    ["resources", "detect", "--timeout", "20"],
    ["resources", "detect", "--refresh"],
    ["resources", "detect", "--explain", "--json"],
    ["--url", "http://127.0.0.1:9", "resources", "detect"],
    ["resources", "detect", "--python"],
    ["resources", "detect", "--help"],
    ["resources", "detect", "extra"],
])
def test_what_the_light_path_does_not_take_goes_to_the_full_path(home: Path, args: list[str]) -> None:
    full_then_light(["resources", "detect"], home)  # the cache is warm
    assert run(args, home)[3] == "full"


def test_a_cold_cache_is_detected_by_the_full_path(home: Path) -> None:
    code, _, err, path = run(["resources", "detect"], home)
    assert (code, path) == (0, "full"), err
    assert list((home / "cache" / "capabilities").glob("*.json"))
    assert run(["resources", "detect"], home)[3] == "light" or run(["resources", "detect"], home)[3] == "light"


def test_another_interpreter_or_sys_path_is_detected_again(home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "site"
    folder.mkdir()
    pythonpath = os.pathsep.join([str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    env = {"PYTHONPATH": pythonpath}
    full_then_light(["resources", "detect"], home, env=env)
    assert run(["resources", "detect"], home)[3] == "full"  # another sys.path (and PYTHONPATH)
    (folder / "newly_installed.py").write_text("")  # the folder changed: a package was installed
    later = time.time_ns() + 10**9
    os.utime(folder, ns=(later, later))
    assert run(["resources", "detect"], home, env=env)[3] == "full"


def test_another_or_a_replaced_interpreter_is_detected_again(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "python3-other"
    shutil.copy2(os.path.realpath(sys.executable), other)  # the job Python: another interpreter
    args = ["resources", "detect", "--python", str(other)]
    assert run(args, home)[3] == "full"  # its entry is not this interpreter's
    _, light = full_then_light(args, home)
    assert f"({other})".encode() in light[1]
    later = time.time_ns() + 10**9
    os.utime(other, ns=(later, later))  # replaced (an upgrade)
    assert run(args, home)[3] == "full"


def test_a_changed_plugin_is_detected_again(home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()
    module = folder / "gl_test_xpu.py"
    module.write_text(textwrap.dedent(PLUGIN).replace("{VERSION}", "1"))
    env = {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))]), "GPULAYER_PLUGINS": "gpulayer.fakes,gl_test_xpu", "GPULAYER_DETECTORS": "xpu"}
    _, light = full_then_light(["resources", "detect"], home, env=env)
    assert b"[0] xpu Test XPU 1" in light[1]
    module.write_text(textwrap.dedent(PLUGIN).replace("{VERSION}", "2"))  # edited in place
    later = time.time_ns() + 10**9
    os.utime(module, ns=(later, later))
    code, out, err, path = run(["resources", "detect"], home, env=env)
    assert (code, path) == (0, "full") and b"[0] xpu Test XPU 2" in out, err
    assert run(["resources", "detect"], home, env={**env, "GPULAYER_DISABLE_PLUGINS": "gl_test_xpu"})[3] == "full"


def test_a_changed_module_of_a_plugin_package_is_detected_again(home: Path, tmp_path: Path) -> None:
    """A plugin package whose detector lives in a submodule: an edit there is a change of
    the plugin as much as one of the module its entry point names (docs/plugins.md: "when
    your plugin's files change")."""
    package = tmp_path / "plugins" / "gl_test_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent("""\
        from gpulayer import plugin
        from gl_test_pkg.detection import detect

        @plugin.hookimpl
        def gpulayer_accelerator_detectors():
            yield plugin.AcceleratorDetector(name="xpu", detect=detect)
        """))
    detection = package / "detection.py"
    body = textwrap.dedent(PLUGIN).partition("@plugin.hookimpl")[0]
    detection.write_text(body.replace("{VERSION}", "1"))
    env = {"PYTHONPATH": os.pathsep.join([str(package.parent), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))]), "GPULAYER_PLUGINS": "gpulayer.fakes,gl_test_pkg", "GPULAYER_DETECTORS": "xpu"}
    _, light = full_then_light(["resources", "detect"], home, env=env)
    assert b"[0] xpu Test XPU 1" in light[1]
    detection.write_text(body.replace("{VERSION}", "2"))  # edited in place: the package's folder is as it was
    later = time.time_ns() + 10**9
    os.utime(detection, ns=(later, later))
    code, out, err, path = run(["resources", "detect"], home, env=env)
    assert (code, path) == (0, "full") and b"[0] xpu Test XPU 2" in out, err


def test_a_change_of_what_a_detector_reads_is_detected_again(home: Path, tmp_path: Path) -> None:
    """A detector that declares the variables it reads (``inputs``): the light path does not
    answer from an entry detected with another value of one, and the full path detects again."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "gl_test_counted.py").write_text(textwrap.dedent("""\
        import os
        from gpulayer import plugin

        def detect(timeout):
            count = int(os.environ.get("ACME_NPU_DEVICES", "0"))
            return plugin.DetectionResult(devices=[plugin.Device(kind="apu", index=i, name="Acme NPU")
                                                   for i in range(count)])

        @plugin.hookimpl
        def gpulayer_accelerator_detectors():
            yield plugin.AcceleratorDetector(name="apu", detect=detect, inputs=["ACME_NPU_DEVICES"])
        """))
    env = {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))]), "GPULAYER_PLUGINS": "gpulayer.fakes,gl_test_counted", "GPULAYER_DETECTORS": "apu",
        "ACME_NPU_DEVICES": "1"}
    _, light = full_then_light(["resources", "detect"], home, env=env)
    assert b"[0] apu Acme NPU" in light[1] and b"[1] apu" not in light[1]
    code, out, err, path = run(["resources", "detect"], home, env={**env, "ACME_NPU_DEVICES": "2"})
    assert (code, path) == (0, "full") and b"[1] apu Acme NPU" in out, err
    assert run(["resources", "detect"], home, env={**env, "ACME_NPU_DEVICES": "2"})[3] == "light"


def test_a_plugin_warning_is_always_printed_by_the_full_path(home: Path, tmp_path: Path) -> None:
    """A plugin that fails in a hook is reported on stderr every time: no text is kept."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "gl_test_failing.py").write_text(textwrap.dedent("""\
        from gpulayer import plugin

        @plugin.hookimpl
        def gpulayer_accelerator_detectors():
            raise RuntimeError("no detectors today")
        """))
    env = {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))]), "GPULAYER_PLUGINS": "gpulayer.fakes,gl_test_failing"}
    for _ in range(2):
        code, _, err, path = run(["resources", "detect"], home, env=env)
        assert (code, path) == (0, "full")
        assert "warning:" in err and "gl_test_failing" in err


def test_detection_trouble_is_detected_again(home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "gl_test_trouble.py").write_text(textwrap.dedent("""\
        from gpulayer import plugin

        def detect(timeout):
            raise RuntimeError("driver on fire")

        @plugin.hookimpl
        def gpulayer_accelerator_detectors():
            yield plugin.AcceleratorDetector(name="npu", detect=detect)
        """))
    env = {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))]), "GPULAYER_PLUGINS": "gpulayer.fakes,gl_test_trouble", "GPULAYER_DETECTORS": "npu"}
    for _ in range(2):
        code, out, err, path = run(["resources", "detect"], home, env=env)
        assert (code, path) == (0, "full"), err
        assert b"driver on fire" in out


def test_changed_overrides_are_applied_by_the_full_path(home: Path) -> None:
    full_then_light(["resources", "detect"], home)
    assert run(["resources", "detect"], home, env={"GPULAYER_OVERRIDE_CPU_COUNT": "5"})[1:] == (
        run(["resources", "detect"], home, entry="app", env={"GPULAYER_OVERRIDE_CPU_COUNT": "5"})[1:3] + ("full",))
    (home / "resources.toml").write_text("cpu_count = 7\n")
    code, out, _, path = run(["resources", "detect"], home)
    assert (code, path) == (0, "full") and b"7 CPUs" in out
    (home / "resources.toml").write_text("cpu_count = 0\n")
    code, _, err, path = run(["resources", "detect"], home)
    assert (code, path) == (2, "full") and "cpu_count = 0: expected a whole number >= 1" in err
    (home / "resources.toml").unlink()
    _, light = full_then_light(["resources", "detect"], home)
    assert b"2 CPUs" in light[1] or f"{os.cpu_count()} CPUs".encode() in light[1]


def test_an_entry_over_an_hour_old_is_detected_again(home: Path) -> None:
    full_then_light(["resources", "detect"], home)
    [entry_file] = (home / "cache" / "capabilities").glob("*.json")
    entry = json.loads(entry_file.read_text())
    entry["written"] = time.time() - capability_key.MAX_AGE - 60
    entry_file.write_text(json.dumps(entry))
    assert run(["resources", "detect"], home)[3] == "full"
    assert json.loads(entry_file.read_text())["written"] > time.time() - 600  # detected and stored again


def test_the_detection_settings_are_the_plugin_managers() -> None:
    assert capability_key.DETECTION_SETTINGS == {plugins.EXTRA_ENV, plugins.DISABLE_ENV, plugins.DETECTORS_ENV}
