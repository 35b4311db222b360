"""Overrides (resources.toml, GPULAYER_OVERRIDE_*) and the provenance of every detected value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

from gpulayer import capability_key, overrides
from gpulayer.errors import InvalidInput
from gpulayer.hookrecords import FrameworkProbe, SubProbe
from gpulayer.records import WorkerRecord
from gpulayer.resources import detect_capabilities, probe_frameworks
from gpulayer.scheduling import check
from gpulayer.testing import fake_devices_env
from gpulayer.units import GB
from tests.factories import make_job


def make_worker(*, capabilities) -> WorkerRecord:
    return WorkerRecord(id="wkr-000000000001", name="w", origin="local", capabilities=capabilities, cpu_slots=1)

pytestmark = pytest.mark.usefixtures("gpulayer_isolated", "probes_seeded")


def write_toml(gpulayer_home, text: str):
    path = gpulayer_home / "resources.toml"
    path.write_text(textwrap.dedent(text))
    return path


# --------------------------------------------------------------------------- provenance


def test_every_value_says_where_it_came_from(fake_accelerator):
    fake_accelerator("cuda", count=2, memory_gb=80)
    caps = detect_capabilities(timeout=60)
    p = caps.provenance
    assert p["host.cpu_count"].source == "os.cpu_count()" and p["host.cpu_count"].plugin is None
    assert p["host.memory_bytes"].source == capability_key.memory()[1] == "os.sysconf(SC_PHYS_PAGES)"
    assert caps.host.memory_bytes == psutil.virtual_memory().total  # the figure psutil reads
    assert p["host.disk_free_bytes"].source.startswith("free space under ")
    assert p["host.address"].source in ("the default route's source address", "no route found: loopback")
    assert p["host.python_version"].source == "this interpreter"
    for i in (0, 1):
        assert (p[f"device.cuda:{i}"].plugin, p[f"device.cuda:{i}"].source) == ("fake-cuda", "fake (test fixture)")
        assert caps.devices[i].plugin == "fake-cuda" and caps.devices[i].source == "fake (test fixture)"
    assert (p["framework.torch"].plugin, p["framework.torch"].source) == ("frameworks", "package metadata (torch)")
    assert p["backends"].plugin == "frameworks" and "torch backends check" in p["backends"].source
    assert caps.overrides == {} and caps.hidden_devices == []


def test_a_detector_in_trouble_is_kept_per_kind(fake_accelerator):
    fake_accelerator("npu", fail="driver on fire")
    caps = detect_capabilities(timeout=30)
    assert caps.detector_problems == {"npu": "detector 'npu' (plugin 'fake-npu') failed: RuntimeError: driver on fire"}


def test_a_detector_that_builds_a_bad_record_is_in_trouble_on_one_line(plugin_manager, monkeypatch):
    """pydantic's error for a record built with a field it does not have is several lines
    long, with links: it goes into a scheduler's reason, on one line."""
    from gpulayer import hookimpl, plugin

    def detect(timeout):
        return plugin.DetectionResult(devices=[plugin.Device(kind="npu", index=0, name="N", memory_gb=16)])

    class Bad:
        @hookimpl
        def gpulayer_accelerator_detectors(self):
            yield plugin.AcceleratorDetector(name="npu", detect=detect)

    plugin_manager.register(Bad(), name="bad-records")
    monkeypatch.setenv("GPULAYER_DETECTORS", "npu")
    caps = detect_capabilities(timeout=30)
    assert caps.detector_problems == {
        "npu": "detector 'npu' (plugin 'bad-records') failed: ValidationError for Device: memory_gb: "
               "Extra inputs are not permitted"}


def test_each_plugins_sub_probes_are_bounded_on_their_own(plugin_manager):
    from gpulayer import hookimpl

    class Slow:
        @hookimpl
        def gpulayer_framework_probes(self):
            yield FrameworkProbe(name="pytest", distributions=["pytest"], subprobes=[
                SubProbe(name="pytest.quick", code="return '1'"),
                SubProbe(name="pytest.stuck", code="import time\ntime.sleep(60)\nreturn '1'")])

    class Fine:
        @hookimpl
        def gpulayer_framework_probes(self):
            yield FrameworkProbe(name="pluggy", distributions=["pluggy"], subprobes=[
                SubProbe(name="pluggy.ok", code="return '7'")])

    plugin_manager.register(Slow(), name="slow-probes")
    plugin_manager.register(Fine(), name="fine-probes")
    probes = {n: p for n, p in plugin_manager.collect("gpulayer_framework_probes", FrameworkProbe).items()
              if n in ("pytest", "pluggy")}
    result, diagnostics = probe_frameworks(timeout=3, probes=probes, use_cache=False)
    assert result["frameworks"]["pluggy.ok"] == "7"  # the other plugin is not hidden
    assert result["frameworks"]["pytest.quick"] == "1"  # what ran before the hang is kept
    assert "pytest" in result["frameworks"] and "pytest.stuck" not in result["frameworks"]
    assert ("framework probe: sub-probe 'pytest.stuck' (plugin 'slow-probes') gave no answer within 3s "
            "(killed); the sub-probes after it are not reported") in diagnostics
    assert result["plugins"]["pluggy.ok"] == "fine-probes" and result["plugins"]["pytest.quick"] == "slow-probes"
    assert result["sources"]["pytest.quick"] == "sub-probe pytest.quick"


def test_a_sub_probe_that_raises_is_named_with_its_plugin(plugin_manager):
    from gpulayer import hookimpl

    class Raising:
        @hookimpl
        def gpulayer_framework_probes(self):
            yield FrameworkProbe(name="pytest", distributions=["pytest"], backends_code="raise OSError('no fabric')",
                                 subprobes=[SubProbe(name="pytest.boom", code="raise ValueError('probe blew up')"),
                                            SubProbe(name="pytest.fine", code="return '2'")])

    plugin_manager.register(Raising(), name="raising-probes")
    probes = {"pytest": plugin_manager.collect("gpulayer_framework_probes", FrameworkProbe)["pytest"]}
    for use_cache in (False, True):  # (an answer read back from the cache says the same)
        result, diagnostics = probe_frameworks(timeout=30, probes=probes, use_cache=use_cache)
        assert result["frameworks"]["pytest.fine"] == "2" and "pytest.boom" not in result["frameworks"]
        assert diagnostics == [
            "framework probe: sub-probe 'pytest.boom' (plugin 'raising-probes') raised ValueError: probe blew up",
            "framework probe: the backends check of 'pytest' (plugin 'raising-probes') raised OSError: no fabric"]


def test_what_a_probe_told_before_it_hung_is_kept_errors_and_backends_too(plugin_manager):
    """A sub-probe that raised, and the backends a probe read, before another sub-probe of the
    same plugin hung: both are told, as the versions read before it are."""
    from gpulayer import hookimpl

    class RaisesThenHangs:
        @hookimpl
        def gpulayer_framework_probes(self):
            yield FrameworkProbe(name="pluggy", distributions=["pluggy"], backends_code="return ['zccl']")
            yield FrameworkProbe(name="pytest", distributions=["pytest"], subprobes=[
                SubProbe(name="pytest.boom", code="raise ValueError('probe blew up')"),
                SubProbe(name="pytest.stuck", code="import time\ntime.sleep(60)\nreturn '1'")])

    plugin_manager.register(RaisesThenHangs(), name="hangs")
    probes = {n: p for n, p in plugin_manager.collect("gpulayer_framework_probes", FrameworkProbe).items()
              if n in ("pytest", "pluggy")}
    result, diagnostics = probe_frameworks(timeout=3, probes=probes, use_cache=False)
    assert diagnostics == [
        "framework probe: sub-probe 'pytest.boom' (plugin 'hangs') raised ValueError: probe blew up",
        "framework probe: sub-probe 'pytest.stuck' (plugin 'hangs') gave no answer within 3s (killed); "
        "the sub-probes after it are not reported"]
    assert result["backends"] == ["zccl"] and result["sources"]["backend zccl"] == "pluggy backends check"


def test_backends_are_told_with_the_plugins_that_read_them(plugin_manager):
    from gpulayer import hookimpl
    from gpulayer.resources import DeviceDetection, RawDetection, assemble

    class Gloo:
        @hookimpl
        def gpulayer_framework_probes(self):
            yield FrameworkProbe(name="pytest", distributions=["pytest"], backends_code="return ['gloo']")

    class Zccl:
        @hookimpl
        def gpulayer_framework_probes(self):
            yield FrameworkProbe(name="pluggy", distributions=["pluggy"], backends_code="return ['zccl']")

    plugin_manager.register(Gloo(), name="gloo-probes")
    plugin_manager.register(Zccl(), name="zccl-probes")
    probes = {n: p for n, p in plugin_manager.collect("gpulayer_framework_probes", FrameworkProbe).items()
              if n in ("pytest", "pluggy")}
    result, _ = probe_frameworks(timeout=30, probes=probes, use_cache=False)
    caps = assemble(RawDetection(DeviceDetection([], [], {}), result, []), sys.executable)
    assert caps.distributed_backends == ["gloo", "zccl"]
    assert caps.provenance["backends"].plugin == "gloo-probes, zccl-probes"
    assert caps.provenance["backends"].source == "pluggy backends check; pytest backends check"


# --------------------------------------------------------------------------- overrides


def test_resources_toml_and_variables_override_and_say_so(gpulayer_home, fake_accelerator, monkeypatch):
    fake_accelerator("cuda", count=2, memory_gb=80)
    path = write_toml(gpulayer_home, """\
        cpu_count = 3
        memory_gb = 16
        address = "203.0.113.7"
        hide_devices = ["cuda:1"]
        backends = ["gloo"]
        [frameworks]
        torch = "2.1.0"
        jax = ""
        """)
    monkeypatch.setenv("GPULAYER_OVERRIDE_CPU_COUNT", "2")  # the variable wins over the file
    monkeypatch.setenv("GPULAYER_OVERRIDE_FRAMEWORKS", "numpy=1.0")
    caps = detect_capabilities(timeout=60)
    assert caps.host.cpu_count == 2 and caps.host.memory_bytes == 16 * GB and caps.host.address == "203.0.113.7"
    assert [d.index for d in caps.devices] == [0] and [d.index for d in caps.hidden_devices] == [1]
    assert caps.distributed_backends == ["gloo"]
    assert caps.frameworks["torch"] == "2.1.0" and caps.frameworks["numpy"] == "1.0" and "jax" not in caps.frameworks
    assert caps.overrides == {
        "backends": f"{path}: backends",
        "device.cuda:1": f"{path}: hide_devices",
        "framework.jax": f"{path}: frameworks.jax",
        "framework.numpy": "GPULAYER_OVERRIDE_FRAMEWORKS",
        "framework.torch": f"{path}: frameworks.torch",
        "host.address": f"{path}: address",
        "host.cpu_count": "GPULAYER_OVERRIDE_CPU_COUNT",
        "host.memory_bytes": f"{path}: memory_gb",
    }
    cpu = caps.provenance["host.cpu_count"]
    assert (cpu.source, cpu.override, cpu.detected) == (
        "override", "GPULAYER_OVERRIDE_CPU_COUNT", f"{os.cpu_count()}, from os.cpu_count()")
    assert caps.provenance["framework.jax"].detected == "not installed"


def test_rejections_that_depend_on_an_override_say_so(gpulayer_home, fake_accelerator):
    fake_accelerator("cuda", count=2, memory_gb=80)
    write_toml(gpulayer_home, 'cpu_count = 1\nhide_devices = ["cuda:1"]\n[frameworks]\ntorch = "2.1.0"\njax = ""\n')
    worker = make_worker(capabilities=detect_capabilities(timeout=60))
    messages = [r.message for r in check(make_job(accelerator="cuda", gpus=2, cpus=2,
                                                  frameworks={"torch": ">=2.2", "jax": ""}), worker)]
    assert messages == [
        "needs 2 CPUs, worker has 1 (set by override)",
        "needs 2 usable cuda device(s), worker has 1 (1 hidden by override)",
        "framework 'jax' not installed (removed by override)",
        "torch 2.1.0 does not satisfy >=2.2 (set by override)",
    ]


def test_a_rejection_says_the_detector_timed_out(fake_accelerator):
    fake_accelerator("xpu", hang=30)
    worker = make_worker(capabilities=detect_capabilities(timeout=0.5))
    [reason] = check(make_job(accelerator="xpu"), worker)
    assert reason.message == ("needs 1 usable xpu device(s), worker has 0 (detection trouble: detector 'xpu' "
                              "(plugin 'fake-xpu') gave no answer within 0.5s and was abandoned)")


@pytest.mark.parametrize(("text", "error"), [
    ("cpu_count = 'four'\n", "{path}: cpu_count = 'four': expected a whole number >= 1"),
    ("cpu_count = 0\n", "{path}: cpu_count = 0: expected a whole number >= 1"),
    ("memory_gb = -1\n", "{path}: memory_gb = -1: expected a number of GB > 0"),
    ("hide_devices = ['cuda:x']\n", "{path}: hide_devices: 'cuda:x' is not KIND or KIND:INDEX"),
    ("gpus = 2\n", "{path}: unknown key 'gpus'; the keys are cpu_count, memory_gb, disk_free_gb, address, "
                   "hide_devices, backends, frameworks"),
    ("[frameworks]\ntorch = 2\n", "{path}: frameworks = {{'torch': 2}}: expected a table of NAME = \"VERSION\""),
    ("cpu_count = \n", "{path}: not valid TOML"),
    # a version no specifier can be checked against was taken: the worker then met none
    ("[frameworks]\ntorch = 'latest'\n", "{path}: frameworks.torch = 'latest': not a version; expected a PEP 440 "
                                         "version such as \"2.4.0\", or \"\" for a framework that is absent"),
])
def test_a_bad_resources_toml_names_the_file_and_the_key(gpulayer_home, text, error):
    path = write_toml(gpulayer_home, text)
    with pytest.raises(InvalidInput) as err:
        overrides.load()
    assert str(err.value).startswith(error.format(path=path))


@pytest.mark.parametrize(("name", "value", "error"), [
    ("GPULAYER_OVERRIDE_CPU_COUNT", "x", "GPULAYER_OVERRIDE_CPU_COUNT='x': expected a whole number >= 1"),
    ("GPULAYER_OVERRIDE_HIDE_DEVICES", "cuda:one", "GPULAYER_OVERRIDE_HIDE_DEVICES='cuda:one': 'cuda:one' is not "
                                                   "KIND or KIND:INDEX"),
    ("GPULAYER_OVERRIDE_FRAMEWORKS", "torch", "GPULAYER_OVERRIDE_FRAMEWORKS='torch': expected NAME=VERSION pairs"),
    ("GPULAYER_OVERRIDE_MEMORY_GB", "0", "GPULAYER_OVERRIDE_MEMORY_GB='0': expected a number > 0"),
    ("GPULAYER_OVERRIDE_FRAMEWORKS", "torch=abc,jax=", "GPULAYER_OVERRIDE_FRAMEWORKS='torch=abc,jax=': torch='abc': "
                                                     "not a version; accepted: a PEP 440 version such as 2.4.0"),
])
def test_a_bad_override_variable_names_it(monkeypatch, name, value, error):
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInput) as err:
        overrides.load()
    assert str(err.value).startswith(error)


def test_an_explicit_resources_file_must_exist(tmp_path):
    with pytest.raises(InvalidInput, match=r"^--resources '.*nope.toml': no such file$"):
        overrides.load(tmp_path / "nope.toml")


# --------------------------------------------------------------------------- the CLI


def gpulayer(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_resources_detect_explain_shows_sources_and_overrides(gpulayer_home):
    path = write_toml(gpulayer_home, 'hide_devices = ["cuda:1"]\n')
    env = {**fake_devices_env("cuda:2:80:9.0"), "GPULAYER_OVERRIDE_CPU_COUNT": "1", "GPULAYER_DETECTORS": "none"}
    proc = gpulayer("resources", "detect", "--explain", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {ln.split("  ")[0].strip(): ln for ln in proc.stdout.splitlines()}
    assert rows["cpus"].split()[1] == "1"
    assert rows["cpus"].endswith(f"override GPULAYER_OVERRIDE_CPU_COUNT (detected {os.cpu_count()}, from os.cpu_count())")
    assert rows["device cuda:0"].endswith("plugin gpulayer.fakes: fake (GPULAYER_FAKE_DEVICES)")
    assert "hidden (Fake CUDA GPU)" in rows["device cuda:1"]
    assert rows["device cuda:1"].endswith(f"override {path}: hide_devices "
                                          "(detected Fake CUDA GPU, from fake (GPULAYER_FAKE_DEVICES))")
    assert rows["framework torch"].endswith("plugin frameworks: package metadata (torch)")
    data = json.loads(gpulayer("resources", "detect", "--json", env=env).stdout)
    assert data["overrides"] == {"device.cuda:1": f"{path}: hide_devices", "host.cpu_count": "GPULAYER_OVERRIDE_CPU_COUNT"}


def test_worker_start_with_a_missing_resources_file_exits_2(tmp_path):
    proc = gpulayer("worker", "start", "--resources", str(tmp_path / "nope.toml"), env={})
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --resources '{tmp_path / 'nope.toml'}': no such file"


def test_a_bad_override_fails_a_submit_naming_it(gpulayer_home):
    write_toml(gpulayer_home, "cpu_count = 'x'\n")
    proc = gpulayer("submit", "--", sys.executable, "-c", "pass", env={"GPULAYER_DETECTORS": "none"})
    assert proc.returncode == 2
    assert f"error: {gpulayer_home / 'resources.toml'}: cpu_count = 'x': expected a whole number >= 1" in proc.stderr


def test_worker_status_json_shows_overrides_and_detector_trouble(gpulayer_home, fake_accelerator, monkeypatch):
    from gpulayer.client import connect

    fake_accelerator("xpu", fail="xpu-smi: no answer within 10s")
    monkeypatch.setenv("GPULAYER_OVERRIDE_CPU_COUNT", "1")
    client = connect()
    client.ensure_local_worker()  # the in-process worker, heartbeating while the CLI reads
    proc = gpulayer("worker", "status", "--json", env={"GPULAYER_DETECTORS": "none"})
    assert proc.returncode == 0, proc.stderr
    [worker] = json.loads(proc.stdout)
    assert worker["overrides"] == {"host.cpu_count": "GPULAYER_OVERRIDE_CPU_COUNT"}
    assert worker["capabilities"]["host"]["cpu_count"] == 1
    assert worker["capabilities"]["provenance"]["host.cpu_count"]["override"] == "GPULAYER_OVERRIDE_CPU_COUNT"
    assert worker["detector_problems"] == {
        "xpu": "detector 'xpu' (plugin 'fake-xpu') failed: RuntimeError: xpu-smi: no answer within 10s"}
    explained = gpulayer("explain", "--accelerator", "xpu", "--allow-unknown-accelerator", "--", "true", env={"GPULAYER_DETECTORS": "none"})
    assert "needs 1 usable xpu device(s), worker has 0 (detection trouble: detector 'xpu' (plugin 'fake-xpu') " \
           "failed: RuntimeError: xpu-smi: no answer within 10s)" in explained.stdout + explained.stderr


def test_a_task_cannot_see_devices_an_override_hid(gpulayer_home):
    env = {**fake_devices_env("cuda:2"), "GPULAYER_DETECTORS": "none", "GPULAYER_OVERRIDE_HIDE_DEVICES": "cuda"}
    show = "import os; print('CVD=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    proc = gpulayer("submit", "--", sys.executable, "-c", show, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "CVD=''" in proc.stdout  # hidden like a CPU task's, though the worker offers no cuda device


def test_explain_keeps_a_long_value_apart_from_where_it_came_from(fake_accelerator):
    """A long value (a venv's python path) used to run into the next column:
    ``.../venv/bin/python3)this interpreter``."""
    from gpulayer.cli.resources import render_explain

    fake_accelerator("cuda", count=1, memory_gb=80)
    caps = detect_capabilities(timeout=60)
    long_path = "/home/someone/projects/a-rather-long-name/.venv/bin/python3"
    caps = caps.model_copy(update={"host": caps.host.model_copy(update={"python_path": long_path})})
    [row] = [line for line in render_explain(caps) if line.startswith("python ")]
    assert f"({long_path})  this interpreter" in row
