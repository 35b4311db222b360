"""Bundled GPUlayer plugin: AMD ROCm devices.

Detection, in order, first answer wins:

1. ``amd-smi static --json`` (ROCm 6+);
2. ``rocm-smi --showproductname --showmeminfo vram --json`` (older ROCm);
3. the KFD topology in sysfs, ``/sys/class/kfd/kfd/topology/nodes/*/properties``:
   nodes with ``simd_count > 0`` are GPUs, numbered in node order as the ROCm runtime
   does. ``GPULAYER_KFD_ROOT`` points it at another tree (tests).

The tools run with the caller's timeout; a tool that is missing is skipped quietly, one
that fails or times out leaves a diagnostic and the next source is tried.

Jobs see their granted GPUs through ``ROCR_VISIBLE_DEVICES`` (the granted runtime
indices) and ``HIP_VISIBLE_DEVICES`` (``0..n-1``). The two filters apply one after the
other (ROCr first, then HIP indexes what is left), so repeating the physical indices in
``HIP_VISIBLE_DEVICES`` would select the wrong devices, or none. A job granted no GPU
gets both variables empty (the detector's ``hide_env``), which hides them all.

The tools and the KFD tree list every GPU of the machine, and a task's two variables replace
the worker's. So a worker started with them set (``ROCR_VISIBLE_DEVICES=1 gpulayer worker
start``) reports the GPUs they leave out as unusable, saying why: ``ROCR_VISIBLE_DEVICES``
first (indices or ``GPU-`` UUIDs), then ``HIP_VISIBLE_DEVICES`` (indices into what it left),
each read up to its first entry that names no GPU; an empty value leaves none.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpulayer import plugin

KIND = "rocm"
KFD_ROOT_ENV = "GPULAYER_KFD_ROOT"
ROCR_ENV = "ROCR_VISIBLE_DEVICES"
HIP_ENV = "HIP_VISIBLE_DEVICES"
DEFAULT_KFD_ROOT = "/sys/class/kfd/kfd"
_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


def _device(index: int, name: str, memory: int | None, arch: str | None,
            uuid: str | None = None, driver: str | None = None) -> plugin.Device:
    return plugin.Device(
        kind=KIND, index=index, name=name, memory_bytes=memory, architecture=arch,
        uuid=uuid, driver_version=driver, usable=True,
        independent=plugin.SupportLevel.FIXTURE_TESTED, distributed=plugin.SupportLevel.FIXTURE_TESTED,
    )


def gfx_name(target_version: int) -> str | None:
    """KFD ``gfx_target_version`` to a gfx target: 90010 -> gfx90a, 110000 -> gfx1100."""
    if target_version <= 0:
        return None
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def _size(value: Any) -> int | None:
    """amd-smi sizes come as {"value": 196592, "unit": "MB"}, "196592 MB" or a number (MB)."""
    number: Any
    if isinstance(value, dict):
        number, unit = value.get("value"), str(value.get("unit", "MB"))
    elif isinstance(value, (int, float)):
        number, unit = value, "MB"
    elif isinstance(value, str):
        m = re.match(r"^\s*([\d.]+)\s*([A-Za-z]*)\s*$", value)
        if not m:
            return None
        number, unit = m.group(1), m.group(2) or "MB"
    else:
        return None
    try:
        return int(float(number) * _UNITS.get(unit.upper(), 1024**2))
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return None if not text or text.upper() in ("N/A", "NA") else text


def parse_amd_smi(output: str) -> list[plugin.Device]:
    """Parse ``amd-smi static --json``: a list of GPUs (or ``{"gpu_data": [...]}``)."""
    data = json.loads(output)
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    devices = []
    for pos, gpu in enumerate(data):
        asic = gpu.get("asic") or {}
        vram = gpu.get("vram") or {}
        driver = gpu.get("driver") or {}
        devices.append(_device(
            index=int(gpu.get("gpu", pos)),
            name=_text(asic.get("market_name")) or "AMD GPU",
            memory=_size(vram.get("size")) if vram.get("size") is not None else None,
            arch=_text(asic.get("target_graphics_version")),
            uuid=_text(asic.get("asic_serial")),
            driver=_text(driver.get("version")) if isinstance(driver, dict) else None,
        ))
    return devices


def parse_rocm_smi(output: str) -> list[plugin.Device]:
    """Parse ``rocm-smi --showproductname --showmeminfo vram --json``: ``{"card0": {...}}``."""
    data = json.loads(output)
    devices = []
    for key, card in data.items():
        m = re.match(r"^card(\d+)$", key)
        if not m or not isinstance(card, dict):
            continue  # "system" and other non-card sections
        memory = _text(card.get("VRAM Total Memory (B)"))
        devices.append(_device(
            index=int(m.group(1)),
            name=_text(card.get("Card Series")) or _text(card.get("Card series"))
            or _text(card.get("Card model")) or "AMD GPU",
            memory=int(memory) if memory and memory.isdigit() else None,
            arch=_text(card.get("GFX Version")),
        ))
    return sorted(devices, key=lambda d: d.index)


def _properties(path: Path) -> dict[str, int]:
    props: dict[str, int] = {}
    for line in (plugin.read_text(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            props[parts[0]] = int(parts[1])
    return props


def detect_kfd(root: str | Path) -> list[plugin.Device]:
    """GPUs from a KFD topology tree (``<root>/topology/nodes/N/...``)."""
    nodes_dir = Path(root) / "topology" / "nodes"
    if not nodes_dir.is_dir():
        return []
    node_ids = sorted(int(p.name) for p in nodes_dir.iterdir() if p.name.isdigit())
    devices: list[plugin.Device] = []
    for node in node_ids:
        ndir = nodes_dir / str(node)
        props = _properties(ndir / "properties")
        if props.get("simd_count", 0) <= 0:
            continue  # a CPU node
        arch = gfx_name(props.get("gfx_target_version", 0))
        memory = 0
        banks = ndir / "mem_banks"
        if banks.is_dir():
            for bank in sorted(banks.iterdir()):
                memory += _properties(bank / "properties").get("size_in_bytes", 0)
        name = plugin.read_text(ndir / "name") or ""
        if not name or name == arch:
            name = f"AMD GPU ({arch})" if arch else "AMD GPU"
        unique = props.get("unique_id")
        devices.append(_device(
            index=len(devices), name=name, memory=memory or None, arch=arch,
            uuid=f"{unique:016x}" if unique else None,
        ))
    return devices


def _uuid(text: str) -> str:
    text = text.strip().lower()
    return text[2:] if text.startswith("0x") else text


def _pick(entries: str, devices: list[plugin.Device], *, uuids: bool) -> list[plugin.Device]:
    """The devices a ``*_VISIBLE_DEVICES`` list names, in its order, read up to its first
    entry that names none: indices into ``devices``' own (ROCr: runtime indices and UUIDs;
    HIP: positions in what ROCr left)."""
    picked: list[plugin.Device] = []
    for entry in (e.strip() for e in entries.split(",")) if entries.strip() else ():
        found: plugin.Device | None = None
        if entry.isdigit():
            if uuids:
                found = next((d for d in devices if d.index == int(entry)), None)
            elif int(entry) < len(devices):
                found = devices[int(entry)]
        elif uuids and entry.upper().startswith("GPU-"):
            found = next((d for d in devices if d.uuid and _uuid(d.uuid) == _uuid(entry[4:])), None)
        if found is None or found in picked:
            break
        picked.append(found)
    return picked


def limit_to_visible(devices: list[plugin.Device], environ: dict[str, str] | os._Environ[str]) -> list[plugin.Device]:
    """``devices`` with those the worker's ``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``
    leave out marked unusable (all of them as they are when neither is set)."""
    visible = list(devices)
    said = []
    for name, uuids in ((ROCR_ENV, True), (HIP_ENV, False)):
        value = environ.get(name)
        if value is not None:
            visible = _pick(value, visible, uuids=uuids)
            said.append(f"{name}={value!r}")
    if not said:
        return devices
    why = f"not in the worker's {' and '.join(said)}"
    return [d if d in visible else d.model_copy(update={"usable": False, "unusable_reason": why}) for d in devices]


def detect(timeout: float) -> plugin.DetectionResult:
    result = _detect(timeout)
    return result.model_copy(update={"devices": limit_to_visible(result.devices, os.environ)})


def _detect(timeout: float) -> plugin.DetectionResult:
    diagnostics: list[str] = []
    deadline = time.monotonic() + timeout
    for argv, parse in (
        (["amd-smi", "static", "--json"], parse_amd_smi),
        (["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"], parse_rocm_smi),
    ):
        left = deadline - time.monotonic()
        if left <= 0.1:
            break  # the sysfs tree below costs nothing and cannot hang
        try:
            _, out, _ = plugin.run_tool(argv, left)
        except plugin.ToolNotFound:
            continue
        except plugin.ToolError as exc:
            diagnostics.append(f"rocm: {exc}")
            continue
        try:
            devices = parse(out)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            diagnostics.append(f"rocm: {argv[0]} gave unreadable output ({type(exc).__name__}: {exc})")
            continue
        if devices:
            return plugin.DetectionResult(devices=devices, diagnostics=diagnostics, source=argv[0])
    root = os.environ.get(KFD_ROOT_ENV) or DEFAULT_KFD_ROOT
    return plugin.DetectionResult(devices=detect_kfd(root), diagnostics=diagnostics, source=f"sysfs ({root})")


def visible_env(devices: list[plugin.Device]) -> dict[str, str]:
    """The variables that make exactly ``devices`` visible (none of them for ``[]``)."""
    return {
        "ROCR_VISIBLE_DEVICES": ",".join(str(d.index) for d in devices),
        "HIP_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(devices))),
    }


@plugin.hookimpl
def gpulayer_accelerator_detectors() -> Iterator[plugin.AcceleratorDetector]:
    yield plugin.AcceleratorDetector(
        name=KIND, description="AMD GPUs via amd-smi, rocm-smi or the KFD topology", detect=detect,
        hide_env=visible_env([]), inputs=[ROCR_ENV, HIP_ENV],
    )


@plugin.hookimpl
def gpulayer_device_environment(kind: str, devices: list[plugin.Device]) -> plugin.DeviceEnvironment | None:
    if kind != KIND:
        return None
    return plugin.DeviceEnvironment(name=KIND, env=visible_env(devices))
