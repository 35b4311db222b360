from __future__ import annotations

import gpulayer_mps

from gpulayer.hookrecords import SupportLevel
from gpulayer.resources import detect_devices


def fake_sysctl(fake_tool, tmp_path, memsize="34359738368", brand="Apple M2 Max"):
    # One script answering both keys, as the real sysctl does.
    tool = fake_tool("sysctl")
    tool.path.write_text(
        "#!/bin/sh\n"
        f"case \"$2\" in hw.memsize) echo {memsize};; machdep.cpu.brand_string) echo '{brand}';;"
        " *) exit 1;; esac\n")
    return tool


def test_apple_silicon_device_line(fake_tool, tmp_path, monkeypatch):
    fake_sysctl(fake_tool, tmp_path)
    monkeypatch.setenv("GPULAYER_MPS_FORCE", "1")
    devices, diagnostics = detect_devices(timeout=10)
    assert diagnostics == []
    [dev] = devices
    assert dev.kind == "mps" and dev.unified_memory and dev.architecture == "Apple M2 Max"
    assert dev.memory_bytes == 32 * 1024**3
    assert dev.distributed == SupportLevel.UNSUPPORTED
    assert dev.describe() == (
        "[0] mps Apple arm64 GPU (Metal) (32.0 GB unified) "
        "independent=fixture-tested distributed=unsupported")


def test_not_on_this_platform(monkeypatch):
    monkeypatch.setattr(gpulayer_mps, "is_apple_silicon", lambda: False)
    assert gpulayer_mps.detect(5).devices == []


def test_broken_sysctl_still_reports_the_gpu_with_a_diagnostic(fake_tool, monkeypatch):
    fake_tool("sysctl", "", exit_code=1)
    monkeypatch.setenv("GPULAYER_MPS_FORCE", "1")
    result = gpulayer_mps.detect(5)
    [dev] = result.devices
    assert dev.memory_bytes is None
    assert result.diagnostics and "hw.memsize" in result.diagnostics[0]


def test_nothing_hides_the_apple_gpu():
    from gpulayer import plugins

    assert plugins.detectors()["mps"].hide_env == {}
