"""Bundled GPUlayer plugin: NVIDIA CUDA devices.

Detection, in order:

1. NVML (``pynvml`` from nvidia-ml-py) in a short-lived subprocess of this Python, so a
   wedged driver cannot hang the caller. Skipped when ``GPULAYER_CUDA_NO_NVML=1`` or, on
   Linux, when no NVIDIA kernel driver is loaded (``/proc/driver/nvidia`` is absent).
2. ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` with the same timeout.

No nvidia-smi and no driver means no devices and no diagnostic: most machines have no
NVIDIA GPU. A tool that fails or times out gives no devices and one diagnostic line.

A GPU counts as usable when its driver is: no framework is needed to run CUDA binaries.
Jobs see their granted GPUs through ``CUDA_VISIBLE_DEVICES`` (runtime indices, not UUIDs,
because some libraries still do not parse UUIDs) plus ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so
that CUDA numbers the GPUs the way NVML and nvidia-smi do. A job granted no GPU gets the
same variables with an empty list (the detector's ``hide_env``), which hides them all.

NVML and nvidia-smi list every GPU of the machine whatever ``CUDA_VISIBLE_DEVICES`` says,
and a task's ``CUDA_VISIBLE_DEVICES`` replaces the worker's. So a worker started with
``CUDA_VISIBLE_DEVICES`` set (``CUDA_VISIBLE_DEVICES=2,3 gpulayer worker start``, or inside
a Slurm allocation without device cgroups) reports the GPUs it leaves out as unusable, saying
why: its jobs are given only the GPUs it was given. The entries are read as CUDA reads them:
indices (as nvidia-smi numbers the GPUs) or ``GPU-`` UUIDs (a unique prefix will do), up to
the first one that names no GPU; an empty value leaves none. A list that names MIG instances
(``MIG-...``) is not read (MIG is not detected): every GPU is offered.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator

from gpulayer import plugin

KIND = "cuda"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
NO_NVML_ENV = "GPULAYER_CUDA_NO_NVML"
QUERY_FIELDS = ["index", "name", "memory.total", "compute_cap", "uuid", "driver_version"]
MIB = 1024 * 1024

# Runs in a subprocess; prints one JSON object. Exit 3 = NVML not available here.
_NVML_SCRIPT = r"""
import json, sys
try:
    import pynvml as N
    N.nvmlInit()
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(3)
def s(v):
    return v.decode() if isinstance(v, bytes) else str(v)
out = []
try:
    driver = s(N.nvmlSystemGetDriverVersion())
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        try:
            cc = "%d.%d" % tuple(N.nvmlDeviceGetCudaComputeCapability(h))
        except Exception:
            cc = None
        out.append({"index": i, "name": s(N.nvmlDeviceGetName(h)),
                    "memory": int(N.nvmlDeviceGetMemoryInfo(h).total),
                    "cc": cc, "uuid": s(N.nvmlDeviceGetUUID(h)), "driver": driver})
finally:
    N.nvmlShutdown()
print(json.dumps({"devices": out}))
"""


def _device(index: int, name: str, memory: int | None, cc: str | None,
            uuid: str | None, driver: str | None) -> plugin.Device:
    return plugin.Device(
        kind=KIND, index=index, name=name, memory_bytes=memory, compute_capability=cc,
        uuid=uuid, driver_version=driver, usable=True,
        independent=plugin.SupportLevel.FIXTURE_TESTED, distributed=plugin.SupportLevel.FIXTURE_TESTED,
    )


def _nvml_wanted() -> bool:
    if plugin.env_flag(NO_NVML_ENV):
        return False
    if sys.platform.startswith("linux") and not os.path.exists("/proc/driver/nvidia"):
        return False  # no kernel driver: NVML cannot find a GPU either
    import importlib.util

    return importlib.util.find_spec("pynvml") is not None


def detect_nvml(timeout: float) -> plugin.DetectionResult | None:
    """Devices from NVML, or None when NVML is not usable here (fall back to nvidia-smi)."""
    try:
        _, out, _ = plugin.run_tool([sys.executable, "-c", _NVML_SCRIPT], timeout)
    except plugin.ToolFailed as exc:
        if exc.returncode == 3:
            return None
        return plugin.DetectionResult(diagnostics=[f"cuda: NVML query failed: {exc}"])
    except plugin.ToolError as exc:
        return plugin.DetectionResult(diagnostics=[f"cuda: NVML query failed: {exc}"])
    try:
        data = json.loads(out.strip().splitlines()[-1])
        devices = [_device(d["index"], d["name"], d["memory"], d["cc"], d["uuid"], d["driver"])
                   for d in data["devices"]]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return plugin.DetectionResult(diagnostics=[f"cuda: NVML query gave unreadable output ({exc})"])
    return plugin.DetectionResult(devices=devices, source="NVML")


def _value(text: str) -> str | None:
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None  # "[N/A]", "[Not Supported]", "[Insufficient Permissions]"
    return text


def parse_nvidia_smi(output: str, fields: list[str]) -> list[plugin.Device]:
    """Parse ``--format=csv,noheader,nounits`` output of ``--query-gpu=<fields>``."""
    devices: list[plugin.Device] = []
    n = len(fields)
    for line in output.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < n:
            raise ValueError(f"expected {n} comma-separated fields, got {line!r}")
        if len(cells) > n:  # a name with commas in it: keep the fields around it fixed
            name_at = fields.index("name")
            extra = len(cells) - n
            cells = [*cells[:name_at], ", ".join(cells[name_at:name_at + extra + 1]),
                     *cells[name_at + extra + 1:]]
        row = dict(zip(fields, cells, strict=True))
        memory = _value(row.get("memory.total", ""))
        devices.append(_device(
            index=int(row["index"]),
            name=_value(row["name"]) or "NVIDIA GPU",
            memory=int(float(memory) * MIB) if memory else None,
            cc=_value(row.get("compute_cap", "")),
            uuid=_value(row.get("uuid", "")),
            driver=_value(row.get("driver_version", "")),
        ))
    return devices


def detect_nvidia_smi(timeout: float) -> plugin.DetectionResult:
    fields = list(QUERY_FIELDS)
    argv = ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    try:
        try:
            _, out, _ = plugin.run_tool(argv, timeout)
        except plugin.ToolFailed as exc:
            # Drivers before 510 do not know compute_cap; ask again without it.
            if "compute_cap" not in (exc.stdout + exc.stderr):
                raise
            fields.remove("compute_cap")
            argv[1] = f"--query-gpu={','.join(fields)}"
            _, out, _ = plugin.run_tool(argv, timeout)
    except plugin.ToolNotFound:
        return plugin.DetectionResult()
    except plugin.ToolError as exc:
        return plugin.DetectionResult(diagnostics=[f"cuda: {exc}"])
    try:
        return plugin.DetectionResult(devices=parse_nvidia_smi(out, fields), source="nvidia-smi")
    except ValueError as exc:
        return plugin.DetectionResult(diagnostics=[f"cuda: nvidia-smi gave unreadable output ({exc})"])


def _named(entry: str, devices: list[plugin.Device]) -> plugin.Device | None:
    """The device a ``CUDA_VISIBLE_DEVICES`` entry names: an index, or a unique UUID prefix."""
    if entry.isdigit():
        return next((d for d in devices if d.index == int(entry)), None)
    if entry.upper().startswith("GPU-"):
        found = [d for d in devices if d.uuid and d.uuid.upper().startswith(entry.upper())]
        return found[0] if len(found) == 1 else None
    return None


def limit_to_visible(devices: list[plugin.Device], value: str | None) -> list[plugin.Device]:
    """``devices`` with those ``CUDA_VISIBLE_DEVICES=value`` (the worker's) leaves out
    marked unusable; all of them as they are when it is unset or names MIG instances."""
    if value is None:
        return devices
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    if any(e.upper().startswith("MIG-") for e in entries):
        return devices
    chosen: list[int] = []
    for entry in entries:  # CUDA reads the list up to its first entry that names no device
        device = _named(entry, devices)
        if device is None or device.index in chosen:
            break
        chosen.append(device.index)
    why = f"not in the worker's {VISIBLE_ENV}={value!r}"
    return [d if d.index in chosen else d.model_copy(update={"usable": False, "unusable_reason": why})
            for d in devices]


def detect(timeout: float) -> plugin.DetectionResult:
    result = _detect(timeout)
    devices = limit_to_visible(result.devices, os.environ.get(VISIBLE_ENV))
    return result.model_copy(update={"devices": devices})


def _detect(timeout: float) -> plugin.DetectionResult:
    deadline = time.monotonic() + timeout
    if _nvml_wanted():
        result = detect_nvml(timeout)
        if result is not None and result.devices:
            return result
        left = deadline - time.monotonic()
        if result is not None and left < 0.5:
            return result
        if result is not None:  # NVML failed: nvidia-smi may still answer; keep the reason
            fallback = detect_nvidia_smi(left)
            if fallback.devices:
                return fallback
            return plugin.DetectionResult(diagnostics=result.diagnostics + fallback.diagnostics)
    return detect_nvidia_smi(max(deadline - time.monotonic(), 0.5))


def visible_env(devices: list[plugin.Device]) -> dict[str, str]:
    """The variables that make exactly ``devices`` visible (none of them for ``[]``)."""
    ids = ",".join(str(d.index) for d in devices)
    return {"CUDA_VISIBLE_DEVICES": ids, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@plugin.hookimpl
def gpulayer_accelerator_detectors() -> Iterator[plugin.AcceleratorDetector]:
    yield plugin.AcceleratorDetector(
        name=KIND, description="NVIDIA GPUs via NVML or nvidia-smi", detect=detect,
        hide_env=visible_env([]), inputs=[VISIBLE_ENV],
    )


@plugin.hookimpl
def gpulayer_device_environment(kind: str, devices: list[plugin.Device]) -> plugin.DeviceEnvironment | None:
    if kind != KIND:
        return None
    return plugin.DeviceEnvironment(name=KIND, env=visible_env(devices))
