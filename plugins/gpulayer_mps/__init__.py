"""Bundled GPUlayer plugin: Apple silicon GPUs through Metal (PyTorch's ``mps``, MLX).

Only macOS on arm64 has one: a single device whose memory is the machine's unified
memory (``sysctl -n hw.memsize``); the chip name (``machdep.cpu.brand_string``) is kept
as its ``architecture``. ``GPULAYER_MPS_FORCE=1`` skips the platform check so the parsing
can be tested anywhere with a fake ``sysctl`` on PATH.

Distributed work is unsupported: no collective backend (NCCL, RCCL) exists for Metal.
There is no device environment to set, and no variable hides the GPU: a process sees the
one GPU or none.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator

from gpulayer import plugin

KIND = "mps"
FORCE_ENV = "GPULAYER_MPS_FORCE"
NAME = "Apple arm64 GPU (Metal)"


def is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() in ("arm64", "aarch64")


def detect(timeout: float) -> plugin.DetectionResult:
    if not (is_apple_silicon() or plugin.env_flag(FORCE_ENV)):
        return plugin.DetectionResult()
    deadline = time.monotonic() + timeout
    diagnostics: list[str] = []
    memory: int | None = None
    chip: str | None = None
    try:
        _, out, _ = plugin.run_tool(["sysctl", "-n", "hw.memsize"], timeout)
        memory = int(out.strip())
    except (plugin.ToolError, ValueError) as exc:
        diagnostics.append(f"mps: could not read hw.memsize ({exc})")
    try:
        _, out, _ = plugin.run_tool(["sysctl", "-n", "machdep.cpu.brand_string"],
                             max(deadline - time.monotonic(), 0.5))
        chip = out.strip() or None
    except plugin.ToolError:
        pass  # only a nicety
    device = plugin.Device(
        kind=KIND, index=0, name=NAME, memory_bytes=memory, unified_memory=True,
        architecture=chip or "arm64", usable=True,
        independent=plugin.SupportLevel.FIXTURE_TESTED, distributed=plugin.SupportLevel.UNSUPPORTED,
    )
    return plugin.DetectionResult(devices=[device], diagnostics=diagnostics, source="sysctl")


@plugin.hookimpl
def gpulayer_accelerator_detectors() -> Iterator[plugin.AcceleratorDetector]:
    yield plugin.AcceleratorDetector(name=KIND, description="Apple silicon GPU (Metal)", detect=detect)
