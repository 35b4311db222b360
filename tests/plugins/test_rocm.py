from __future__ import annotations

import json
from pathlib import Path

import gpulayer_rocm

from gpulayer import plugins
from gpulayer.resources import detect_devices

# Shape of `amd-smi static --json` (ROCm 6.x): one object per GPU.
AMD_SMI = json.dumps([
    {"gpu": i,
     "asic": {"market_name": "AMD Instinct MI300X", "vendor_id": "0x1002", "device_id": "0x74a1",
              "target_graphics_version": "gfx942", "asic_serial": f"0x8D5A0C2B1E{i}"},
     "vram": {"type": "HBM", "vendor": "N/A", "size": {"value": 196592, "unit": "MB"}},
     "driver": {"name": "amdgpu", "version": "6.7.0"}}
    for i in range(2)
])

# Shape of `rocm-smi --showproductname --showmeminfo vram --json`.
ROCM_SMI = json.dumps({
    "card0": {"Card Series": "AMD Instinct MI210", "Card Model": "0x740f",
              "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]", "Card SKU": "D67301",
              "GFX Version": "gfx90a", "VRAM Total Memory (B)": "68702699520",
              "VRAM Total Used Memory (B)": "10960896"},
    "card1": {"Card Series": "AMD Instinct MI210", "GFX Version": "gfx90a",
              "VRAM Total Memory (B)": "68702699520"},
    "system": {"Driver version": "6.3.6"},
})


def write_kfd(root: Path) -> Path:
    """A KFD topology: node 0 a CPU, nodes 1-2 MI250X GCDs (gfx90a, 64 GiB each)."""
    nodes = root / "topology" / "nodes"
    cpu = nodes / "0"
    (cpu / "mem_banks" / "0").mkdir(parents=True)
    (cpu / "properties").write_text("cpu_cores_count 64\nsimd_count 0\ngfx_target_version 0\n")
    (cpu / "name").write_text("\n")
    (cpu / "mem_banks" / "0" / "properties").write_text("heap_type 0\nsize_in_bytes 540000000000\n")
    for n in (1, 2):
        gpu = nodes / str(n)
        (gpu / "mem_banks" / "0").mkdir(parents=True)
        (gpu / "properties").write_text(
            f"cpu_cores_count 0\nsimd_count 440\ngfx_target_version 90010\nunique_id 1234567{n}\n")
        (gpu / "name").write_text("gfx90a\n")
        (gpu / "mem_banks" / "0" / "properties").write_text(
            f"heap_type 1\nsize_in_bytes {64 * 1024**3}\nwidth 4096\n")
    return root


def test_amd_smi(fake_tool):
    fake_tool("amd-smi", AMD_SMI)
    devices, diagnostics = detect_devices(timeout=10)
    assert diagnostics == []
    assert [(d.kind, d.index, d.name, d.architecture) for d in devices] == [
        ("rocm", 0, "AMD Instinct MI300X", "gfx942"), ("rocm", 1, "AMD Instinct MI300X", "gfx942")]
    assert devices[0].memory_bytes == 196592 * 1024**2
    assert devices[0].driver_version == "6.7.0"


def test_amd_smi_older_string_sizes_and_wrapper():
    data = json.dumps({"gpu_data": [{"gpu": 0, "asic": {"market_name": "Radeon RX 7900 XTX"},
                                     "vram": {"size": "24560 MB"}}]})
    [dev] = gpulayer_rocm.parse_amd_smi(data)
    assert dev.name == "Radeon RX 7900 XTX" and dev.memory_bytes == 24560 * 1024**2


def test_rocm_smi_when_amd_smi_is_missing(fake_tool):
    fake_tool("rocm-smi", ROCM_SMI)
    result = gpulayer_rocm.detect(5)
    assert result.diagnostics == []
    assert [(d.index, d.name, d.architecture, d.memory_bytes) for d in result.devices] == [
        (0, "AMD Instinct MI210", "gfx90a", 68702699520),
        (1, "AMD Instinct MI210", "gfx90a", 68702699520)]


def test_kfd_sysfs_tree(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAYER_KFD_ROOT", str(write_kfd(tmp_path / "kfd")))
    result = gpulayer_rocm.detect(5)
    assert [(d.index, d.name, d.architecture, d.memory_bytes) for d in result.devices] == [
        (0, "AMD GPU (gfx90a)", "gfx90a", 64 * 1024**3),
        (1, "AMD GPU (gfx90a)", "gfx90a", 64 * 1024**3)]


def test_failing_tool_falls_back_to_kfd_with_a_diagnostic(fake_tool, tmp_path, monkeypatch):
    fake_tool("amd-smi", "", exit_code=1, stderr="ERROR:root:Unable to detect any GPU devices\n")
    monkeypatch.setenv("GPULAYER_KFD_ROOT", str(write_kfd(tmp_path / "kfd")))
    result = gpulayer_rocm.detect(5)
    assert len(result.devices) == 2
    assert result.diagnostics == [
        "rocm: amd-smi: exited with status 1: ERROR:root:Unable to detect any GPU devices"]


def test_no_tools_no_kfd_is_quiet(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = gpulayer_rocm.detect(5)
    assert result.devices == [] and result.diagnostics == []


def test_gfx_names():
    assert gpulayer_rocm.gfx_name(90010) == "gfx90a"
    assert gpulayer_rocm.gfx_name(90402) == "gfx942"
    assert gpulayer_rocm.gfx_name(110000) == "gfx1100"
    assert gpulayer_rocm.gfx_name(100300) == "gfx1030"
    assert gpulayer_rocm.gfx_name(0) is None


def test_device_environment(fake_tool):
    fake_tool("amd-smi", AMD_SMI)
    devices, _ = detect_devices(timeout=10)
    assert plugins.device_environment("rocm", [devices[1]]) == {
        "ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"}


def test_a_task_granted_no_gpu_sees_none():
    assert plugins.detectors()["rocm"].hide_env == {"ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
    assert gpulayer_rocm.visible_env([]) == plugins.detectors()["rocm"].hide_env


def test_a_worker_given_some_gpus_offers_only_those(tmp_path, monkeypatch):
    """The KFD tree and the tools list every GPU, and a task's ROCR_VISIBLE_DEVICES and
    HIP_VISIBLE_DEVICES replace the worker's: a worker started on GPU 1 used to offer GPU 0
    too, and hand it to a job."""
    monkeypatch.setenv("GPULAYER_KFD_ROOT", str(write_kfd(tmp_path / "kfd")))
    second = f"GPU-{12345672:016x}"  # ROCr's UUID of the second GPU (its KFD unique_id)
    for rocr, hip, usable in (("1", None, [1]), (None, "1", [1]), (f"{second},0", "0", [1]),
                              (f"{second},0", None, [0, 1]), ("0,5,1", None, [0]), ("", None, []),
                              (None, None, [0, 1])):
        for name, value in (("ROCR_VISIBLE_DEVICES", rocr), ("HIP_VISIBLE_DEVICES", hip)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        devices, diagnostics = detect_devices(timeout=10)
        assert diagnostics == []
        assert [d.index for d in devices if d.usable] == usable, (rocr, hip)
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "1")
    devices, _ = detect_devices(timeout=10)
    assert devices[0].unusable_reason == "not in the worker's ROCR_VISIBLE_DEVICES='1'"
    assert plugins.device_environment("rocm", [devices[1]]) == {
        "ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0"}
