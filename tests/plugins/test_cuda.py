from __future__ import annotations

import time

import gpulayer_cuda
import pytest

from gpulayer import plugins
from gpulayer.hookrecords import SupportLevel
from gpulayer.resources import detect_capabilities, detect_devices

H200_X2 = (
    "0, NVIDIA H200, 143771, 9.0, GPU-6f4c1d9e-0000-4a5b-9c1d-000000000000, 550.54.15\n"
    "1, NVIDIA H200, 143771, 9.0, GPU-6f4c1d9e-0001-4a5b-9c1d-000000000001, 550.54.15\n"
)


def test_two_h200s_from_nvidia_smi(fake_tool):
    tool = fake_tool("nvidia-smi", H200_X2)
    devices, diagnostics = detect_devices(timeout=10)
    assert diagnostics == []
    assert [(d.kind, d.index, d.name) for d in devices] == [
        ("cuda", 0, "NVIDIA H200"), ("cuda", 1, "NVIDIA H200")]
    for d in devices:
        assert d.memory_bytes == 143771 * 1024 * 1024
        assert d.compute_capability == "9.0"
        assert d.driver_version == "550.54.15"
        assert d.uuid and d.uuid.startswith("GPU-6f4c1d9e")
        assert d.usable
        assert d.independent == SupportLevel.FIXTURE_TESTED
        assert d.distributed == SupportLevel.FIXTURE_TESTED
    assert devices[0].describe() == (
        "[0] cuda NVIDIA H200 (140.4 GB) cc=9.0 "
        "independent=fixture-tested distributed=fixture-tested")
    assert tool.calls == [
        "--query-gpu=index,name,memory.total,compute_cap,uuid,driver_version "
        "--format=csv,noheader,nounits"]


def test_disabled_cuda_plugin_reports_nothing(fake_tool, monkeypatch):
    tool = fake_tool("nvidia-smi", H200_X2)
    monkeypatch.setenv("GPULAYER_DISABLE_PLUGINS", "cuda")
    devices, _ = detect_devices(timeout=10)
    assert devices == []
    assert tool.calls == []  # blocked before import: never asked


def test_no_nvidia_smi_is_quiet(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH at all
    result = gpulayer_cuda.detect(5)
    assert result.devices == [] and result.diagnostics == []


def test_hanging_nvidia_smi_is_killed_within_timeout(fake_tool):
    fake_tool("nvidia-smi", H200_X2, sleep=30)
    start = time.monotonic()
    caps = detect_capabilities(timeout=1.0)
    elapsed = time.monotonic() - start
    assert elapsed < 8, elapsed
    assert [d for d in caps.devices if d.kind == "cuda"] == []
    assert any("nvidia-smi" in d and "1s" in d for d in caps.diagnostics), caps.diagnostics


def test_failing_nvidia_smi_gives_a_diagnostic(fake_tool):
    fake_tool("nvidia-smi", "", exit_code=9, stderr=(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"))
    result = gpulayer_cuda.detect(5)
    assert result.devices == []
    assert result.diagnostics == [
        "cuda: nvidia-smi: exited with status 9: NVIDIA-SMI has failed because it "
        "couldn't communicate with the NVIDIA driver."]


def test_old_driver_without_compute_cap_is_asked_again(fake_tool, tmp_path):
    # First call (with compute_cap) fails the way drivers < 510 do; the retry succeeds.
    script = tmp_path / "fake-bin" / "nvidia-smi"
    fake_tool("nvidia-smi")
    script.write_text(
        "#!/bin/sh\n"
        "case \"$*\" in *compute_cap*) echo 'Field \"compute_cap\" is not a valid field to query.'; exit 2;; esac\n"
        "echo '0, Tesla V100-SXM2-16GB, 16160, GPU-aaaa, 470.57.02'\n")
    result = gpulayer_cuda.detect(5)
    assert result.diagnostics == []
    [dev] = result.devices
    assert dev.name == "Tesla V100-SXM2-16GB" and dev.compute_capability is None
    assert dev.memory_bytes == 16160 * 1024 * 1024


def test_unreadable_output_gives_a_diagnostic(fake_tool):
    fake_tool("nvidia-smi", "garbage\n")
    result = gpulayer_cuda.detect(5)
    assert result.devices == []
    assert "unreadable output" in result.diagnostics[0]


def test_parse_handles_commas_in_names_and_na():
    [dev] = gpulayer_cuda.parse_nvidia_smi(
        "3, NVIDIA A100, PCIe, 40GB, [N/A], 8.0, GPU-x, 535.1\n", gpulayer_cuda.QUERY_FIELDS)
    assert dev.index == 3 and dev.name == "NVIDIA A100, PCIe, 40GB"
    assert dev.memory_bytes is None and dev.compute_capability == "8.0"


def test_device_environment_lists_granted_indices(fake_tool):
    fake_tool("nvidia-smi", H200_X2)
    devices, _ = detect_devices(timeout=10)
    env = plugins.device_environment("cuda", [devices[1]])
    assert env == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert plugins.device_environment("cuda", devices)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert plugins.device_environment("nosuchkind", devices) == {}


def test_a_task_granted_no_gpu_sees_none():
    # the same variables the hook gave for an empty list before hiding became its own rule
    assert plugins.detectors()["cuda"].hide_env == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpulayer_cuda.visible_env([]) == plugins.detectors()["cuda"].hide_env


@pytest.mark.gpu  # deselected by default; on a GPU machine: pytest -m gpu
def test_real_nvml_and_nvidia_smi_agree(monkeypatch):
    monkeypatch.delenv("GPULAYER_CUDA_NO_NVML")
    via_nvml = gpulayer_cuda.detect(20)
    via_smi = gpulayer_cuda.detect_nvidia_smi(20)
    assert via_nvml.devices, via_nvml.diagnostics
    assert [(d.index, d.name, d.compute_capability, d.uuid) for d in via_nvml.devices] == [
        (d.index, d.name, d.compute_capability, d.uuid) for d in via_smi.devices]


H200_X3 = H200_X2 + "2, NVIDIA H200, 143771, 9.0, GPU-7a00aaaa-0002-4a5b-9c1d-000000000002, 550.54.15\n"


def _usable(devices):
    return [d.index for d in devices if d.kind == "cuda" and d.usable]


def test_a_worker_given_some_gpus_offers_only_those(fake_tool, monkeypatch):
    """nvidia-smi lists every GPU whatever CUDA_VISIBLE_DEVICES says, and a task's
    CUDA_VISIBLE_DEVICES replaces the worker's: a worker started on GPUs 1 and 2 used to
    offer GPU 0 too, and hand it to a job."""
    fake_tool("nvidia-smi", H200_X3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    devices, diagnostics = detect_devices(timeout=10)
    assert diagnostics == []
    assert _usable(devices) == [1, 2]
    assert devices[0].unusable_reason == "not in the worker's CUDA_VISIBLE_DEVICES='2,1'"
    # as CUDA reads it: UUIDs (a unique prefix), up to the first entry that names no GPU
    for value, usable in (("GPU-7a00,0", [0, 2]), ("1,7,2", [1]), ("GPU-6f4c1d9e,2", []),
                          ("", []), (" 0 , 2", [0, 2]), ("MIG-5d5c3a8e-0000", [0, 1, 2])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert _usable(detect_devices(timeout=10)[0]) == usable, value
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _usable(detect_devices(timeout=10)[0]) == [0, 1, 2]


def test_a_job_gets_only_the_gpus_its_worker_was_given(fake_tool, gpulayer_home):
    import os
    import subprocess
    import sys

    fake_tool("nvidia-smi", H200_X3)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "1,2"}
    show = "import os; print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'])"

    def submit(gpus: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpulayer.cli", "submit", "--accelerator", "cuda", "--gpus", gpus,
                               "--", sys.executable, "-c", show], capture_output=True, text=True, env=env, timeout=120)

    two = submit("2")
    assert two.returncode == 0, two.stderr
    assert "CVD=1,2" in two.stdout
    three = submit("3")
    assert three.returncode != 0
    assert ("needs 3 usable cuda device(s), worker has 2 (1 unusable: not in the worker's "
            "CUDA_VISIBLE_DEVICES='1,2')") in three.stderr
