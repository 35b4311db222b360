"""Cached detection: the in-process worker of `gpulayer submit` and SDK scripts does not detect again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from gpulayer import capability_cache, hookimpl
from gpulayer.capability_cache import cached_capabilities, entry_path
from gpulayer.hookrecords import AcceleratorDetector, DetectionResult
from gpulayer.resources import detect_capabilities

pytestmark = pytest.mark.usefixtures("gpulayer_isolated", "probes_seeded")


def test_a_second_start_does_not_detect_again(fake_accelerator):
    fake = fake_accelerator("cuda", count=2)
    first = cached_capabilities(timeout=30)
    second = cached_capabilities(timeout=30)
    assert fake.detect_calls == 1
    assert [d.index for d in second.devices] == [d.index for d in first.devices] == [0, 1]
    assert second.frameworks == first.frameworks
    assert second.provenance["device.cuda:0"].plugin == "fake-cuda"


def test_resources_detect_refreshes_the_entry(fake_accelerator):
    fake = fake_accelerator("cuda", count=1)
    detect_capabilities(timeout=30)  # what `resources detect` and `worker start` run
    assert entry_path().exists()
    cached_capabilities(timeout=30)
    assert fake.detect_calls == 1


def test_the_entry_belongs_to_the_installed_plugins(fake_accelerator, plugin_manager):
    fake = fake_accelerator("cuda", count=1)
    cached_capabilities(timeout=30)

    class Another:
        @hookimpl
        def gpulayer_accelerator_detectors(self):
            yield AcceleratorDetector(name="npu", detect=lambda timeout: DetectionResult())

    plugin_manager.register(Another(), name="another")
    cached_capabilities(timeout=30)
    assert fake.detect_calls == 2


def test_the_entry_belongs_to_the_interpreters_sys_path(fake_accelerator, tmp_path, monkeypatch):
    fake = fake_accelerator("cuda", count=1)
    cached_capabilities(timeout=30)
    monkeypatch.setattr(sys, "path", [sys.path[0], str(tmp_path), *sys.path[1:]])
    cached_capabilities(timeout=30)
    assert fake.detect_calls == 2
    cached_capabilities(timeout=30)
    assert fake.detect_calls == 2
    (tmp_path / "newly_installed.py").write_text("")  # the folder changed: detect again
    os.utime(tmp_path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    cached_capabilities(timeout=30)
    assert fake.detect_calls == 3


def test_the_first_entry_point_of_sys_path_does_not_count(fake_accelerator, tmp_path, monkeypatch):
    """sys.path[0] is the script's folder or the working directory: where a command runs from
    is no reason to detect again."""
    fake = fake_accelerator("cuda", count=1)
    cached_capabilities(timeout=30)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path[1:]])
    cached_capabilities(timeout=30)
    assert fake.detect_calls == 1


def test_a_detector_in_trouble_is_not_run_again_on_every_start(fake_accelerator):
    fake = fake_accelerator("npu", fail="driver on fire")
    first = cached_capabilities(timeout=30)
    assert "npu" in first.detector_problems
    entry = json.loads(entry_path().read_text())
    assert entry["retries"]["npu"]["failures"] == 1
    assert entry["retries"]["npu"]["retry_at"] - time.time() > capability_cache.RETRY_BASE - 10
    second = cached_capabilities(timeout=30)
    assert fake.detect_calls == 1
    assert second.detector_problems == first.detector_problems  # still said, from the entry
    assert any(d.startswith("detector 'npu': its trouble is from an earlier detection, retried in the "
                            "background (attempt 2) from ") for d in second.diagnostics)


DETECTOR = """\
    import os
    from gpulayer import plugin

    def detect(timeout):
        with open(os.environ["CALLS_FILE"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        raise RuntimeError("xpu driver not answering")

    @plugin.hookimpl
    def gpulayer_accelerator_detectors():
        yield plugin.AcceleratorDetector(name="xpu", detect=detect)
    """


def test_foreground_submits_reuse_the_detection_and_retry_trouble_in_the_background(tmp_path, gpulayer_home):
    (tmp_path / "gl_flaky_xpu.py").write_text(textwrap.dedent(DETECTOR))
    calls = tmp_path / "calls.txt"
    env = {**os.environ, "GPULAYER_PLUGINS": "gl_flaky_xpu", "GPULAYER_DETECTORS": "none",
           "CALLS_FILE": str(calls),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    # GPULAYER_DETECTORS=none keeps the machine's own detectors out; a plugin's detector
    # named in it would run, so name xpu
    env["GPULAYER_DETECTORS"] = "xpu"

    def submit(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "submit", *args, "--", sys.executable, "-c",
                                 "print('ran')"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def run(*args: str) -> tuple[int, str, str, int]:
        proc = submit(*args)
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err, proc.pid

    rc, out, err, _ = run()
    assert rc == 0 and "ran" in out, err
    assert len(calls.read_text().split()) == 1
    rc, out, err, _ = run()
    assert rc == 0 and "ran" in out, err
    assert len(calls.read_text().split()) == 1  # not again
    rc, out, err, _ = run("--accelerator", "xpu")
    assert rc == 125
    assert ("needs 1 usable xpu device(s), worker has 0 (detection trouble: detector 'xpu' (plugin 'gl_flaky_xpu') "
            "failed: RuntimeError: xpu driver not answering)") in err
    [entry_file] = (gpulayer_home / "cache" / "capabilities").glob("*.json")
    entry = json.loads(entry_file.read_text())
    entry["retries"]["xpu"]["retry_at"] = 0  # the backoff has passed
    entry_file.write_text(json.dumps(entry))
    rc, out, err, pid = run()
    assert rc == 0 and "ran" in out, err
    for _ in range(600):  # the background refresher, bounded by the detection timeout
        if len(calls.read_text().split()) == 2 and not entry_file.with_suffix(".refreshing").exists():
            break
        time.sleep(0.1)
    callers = calls.read_text().split()
    assert len(callers) == 2 and int(callers[1]) != pid  # retried by another process, not the submit
    assert json.loads(entry_file.read_text())["retries"]["xpu"]["failures"] == 2  # and backed off further
    listed = subprocess.run([sys.executable, "-m", "gpulayer.cli", "worker", "list"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert listed.stdout.strip() == "no workers registered"  # no dead in-process rows
