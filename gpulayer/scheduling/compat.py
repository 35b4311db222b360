"""Compatibility: whether one worker could ever run jobs of one shape, and if not, why.

The wordings are tabled in :mod:`gpulayer.scheduling`; reasons come in that table's order.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from gpulayer.hookrecords import Capabilities, SupportLevel
from gpulayer.records import TARGET_FOR_ORIGIN, Reason, WorkerRecord
from gpulayer.scheduling.shapes import Shape, shape_of
from gpulayer.specs import JobSpec
from gpulayer.units import GB, format_gb_below, format_wanted_gb


class RawReason(NamedTuple):
    """A reason before it is bound to a worker id (see :func:`bind`)."""

    code: str
    wanted: str | None
    have: str | None
    message: str


class Compat(NamedTuple):
    """What :func:`compat` found out about one (shape, worker) pair."""

    reasons: list[RawReason]  # empty: compatible
    eligible: tuple[int, ...]  # indices of the devices that pass every filter (compatible only)
    all_usable: bool  # the eligible devices are all the worker's usable devices of the kind


@lru_cache(maxsize=8192)
def satisfies(spec: str, version: str) -> bool:
    """``version`` is in ``spec`` (pre-releases and local versions allowed: 2.13.0+cpu >= 2.2)."""
    if not spec.strip():
        return True
    try:
        v = Version(version.strip())
    except InvalidVersion:
        return False
    try:
        return SpecifierSet(spec).contains(v, prereleases=True)
    except InvalidSpecifier:
        return False


def _norm_name(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def compat(shape: Shape, rec: WorkerRecord) -> Compat:
    """Reasons ``rec`` cannot run jobs of ``shape``, and which of its devices could."""
    out: list[RawReason] = []
    _worker_reasons(shape, rec, out)
    eligible: tuple[int, ...] = ()
    all_usable = True
    if shape.accelerator is not None:
        eligible, all_usable = _device_reasons(shape, rec.capabilities, out)
    _framework_reasons(shape, rec.capabilities, out)
    return Compat(out, eligible, all_usable)


def _worker_reasons(shape: Shape, rec: WorkerRecord, out: list[RawReason]) -> None:
    """Target, host (OS, Python, CPUs, RAM), labels and CPU slots, in that order."""
    caps = rec.capabilities
    host = caps.host
    target = TARGET_FOR_ORIGIN[rec.origin]
    if target not in shape.targets:
        allowed = ", ".join(shape.targets)
        out.append(RawReason("target", allowed, target,
                             f"serves {target} jobs (origin {rec.origin}), job allows {allowed}"))
    if shape.os and host.os.strip().lower() != shape.os:
        out.append(RawReason("os", shape.os, host.os, f"needs os {shape.os}, worker has {host.os}"))
    if shape.python and not satisfies(shape.python, host.python_version):
        out.append(RawReason("python", shape.python, host.python_version,
                             f"python {host.python_version} does not satisfy {shape.python}"))
    if shape.cpus and host.cpu_count < shape.cpus:
        out.append(RawReason("cpus", str(shape.cpus), str(host.cpu_count),
                             f"needs {shape.cpus} CPUs, worker has {host.cpu_count}"
                             f"{_by_override(caps, 'host.cpu_count')}"))
    if shape.memory_gb and host.memory_bytes < shape.memory_gb * GB:
        want = format_wanted_gb(shape.memory_gb)
        have = format_gb_below(host.memory_bytes, shape.memory_gb)  # 63.96 GB is not 64: "63.960"
        out.append(RawReason("memory", want, have, f"needs {want} GB RAM, worker has {have} GB"
                                                    f"{_by_override(caps, 'host.memory_bytes')}"))
    for key, value in shape.labels:
        hv = caps.labels.get(key)
        if hv != value:
            has = f"{key}={hv}" if hv is not None else None
            out.append(RawReason("label", f"{key}={value}", has,
                                 f"needs label {key}={value}, worker has {has or 'none'}"))
    if shape.device_count == 0 and rec.cpu_slots <= 0:
        out.append(RawReason("cpu_slots", "1", str(rec.cpu_slots),
                             f"runs no jobs without devices (cpu_slots={rec.cpu_slots})"))


def _by_override(caps: Capabilities, key: str) -> str:
    """`` (set by override)`` when the value at provenance ``key`` came from an override."""
    return " (set by override)" if caps.overridden(key) else ""


def _device_reasons(shape: Shape, caps: Capabilities, out: list[RawReason]) -> tuple[tuple[int, ...], bool]:
    """Devices of the shape's kind: enough usable ones, then memory, compute capability and
    distributed filters; returns the eligible indices and whether they are all usable ones.
    A worker without enough usable devices hears only that (not also that they are too small),
    and why it may have fewer than it seems: devices hidden by an override, a detector that
    timed out or failed."""
    kind = shape.accelerator
    need = max(shape.device_count, 1)
    devs = [d for d in caps.devices if d.kind == kind]
    usable = [d for d in devs if d.usable]
    if len(usable) < need:
        msg = f"needs {need} usable {kind} device(s), worker has {len(usable)}"
        unusable = [d for d in devs if not d.usable]
        if unusable:
            whys = sorted({d.unusable_reason or "no reason given" for d in unusable})
            msg += f" ({len(unusable)} unusable: {'; '.join(whys)})"
        hidden = sum(1 for d in caps.hidden_devices if d.kind == kind)
        if hidden:
            msg += f" ({hidden} hidden by override)"
        problem = caps.detector_problems.get(kind or "")
        if problem:
            msg += f" (detection trouble: {problem})"
        out.append(RawReason("devices", str(need), str(len(usable)), msg))
        return (), True
    ok = usable
    bad = False
    want_mem = f">= {format_wanted_gb(shape.min_gpu_memory_gb)} GB" if shape.min_gpu_memory_gb else None
    if shape.min_gpu_memory_gb:
        floor = shape.min_gpu_memory_gb * GB
        mem_ok = [d for d in usable if d.memory_bytes is not None and d.memory_bytes >= floor]
        if len(mem_ok) < need:
            bad = True
            out.append(RawReason("gpu_memory", f"{need} x {want_mem}", str(len(mem_ok)),
                                 f"needs {need} {kind} device(s) with {want_mem}, worker has {len(mem_ok)}"))
        ok = mem_ok
    if shape.compute_capability:
        spec = shape.compute_capability
        cc_ok = [d for d in usable if d.compute_capability and satisfies(spec, d.compute_capability)]
        if len(cc_ok) < need:
            bad = True
            out.append(RawReason("compute_capability", f"{need} x {spec}", str(len(cc_ok)),
                                 f"needs {need} {kind} device(s) with compute capability {spec}, "
                                 f"worker has {len(cc_ok)}"))
        cc_idx = {d.index for d in cc_ok}
        ok = [d for d in ok if d.index in cc_idx]
        if not bad and len(ok) < need:  # each filter alone is met, not both at once
            bad = True
            out.append(RawReason("device_filters", f"{need} x {want_mem} and {spec}", str(len(ok)),
                                 f"needs {need} {kind} device(s) with {want_mem} and compute "
                                 f"capability {spec}, worker has {len(ok)}"))
    if not bad and shape.distributed:
        dist_ok = [d for d in ok if d.distributed != SupportLevel.UNSUPPORTED]
        if len(dist_ok) < need:
            bad = True
            out.append(RawReason("distributed", "distributed work", SupportLevel.UNSUPPORTED.value,
                                 f"{kind} device(s) do not support distributed work "
                                 f"(distributed={SupportLevel.UNSUPPORTED.value})"))
        ok = dist_ok
    if bad:
        return (), True
    return tuple(sorted(d.index for d in ok)), len(ok) == len(usable)


def _framework_reasons(shape: Shape, caps: Capabilities, out: list[RawReason]) -> None:
    """Each framework (or sub-probe) the shape names: installed, and in the specifier; an
    override or a framework probe in trouble is said."""
    frameworks = caps.frameworks
    for name, spec in shape.frameworks:
        version = frameworks.get(name)
        if version is None:  # "cupy_cuda12x" matches "cupy-cuda12x"
            n = _norm_name(name)
            for have_name, have_version in frameworks.items():
                if _norm_name(have_name) == n:
                    version = have_version
                    break
        wanted = f"{name}{spec}"
        if version is None:
            note = (" (removed by override)" if caps.overridden(f"framework.{name}")
                    else f" ({caps.probe_problems[0]})" if caps.probe_problems else "")
            out.append(RawReason("framework_missing", wanted, None, f"framework '{name}' not installed{note}"))
        elif spec and not satisfies(spec, version):
            shown = version or "(unknown version)"
            out.append(RawReason("framework_version", wanted, version, f"{name} {shown} does not satisfy {spec}"
                                                                        f"{_by_override(caps, f'framework.{name}')}"))


def bind(worker_id: str, reasons: list[RawReason]) -> list[Reason]:
    return [Reason(worker=worker_id, code=c, wanted=w, have=h, message=m) for c, w, h, m in reasons]


def check(job: JobSpec, worker: WorkerRecord) -> list[Reason]:
    """Why ``worker`` can never run ``job``: an empty list when it is compatible.

    Compatibility only: availability (online, draining, busy) is ``place``'s business.
    The wordings are listed in :mod:`gpulayer.scheduling`'s docstring.
    """
    return bind(worker.id, compat(shape_of(job), worker).reasons)
