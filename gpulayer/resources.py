"""Builds a worker's :class:`~gpulayer.hookrecords.Capabilities` from hook results, with
the source of every value and the site's overrides.

Three sources, run concurrently and each bounded by ``timeout``:

* every accelerator detector (``gpulayer_accelerator_detectors``), each in its own daemon
  thread: one that raises or hangs becomes a diagnostic line (and a ``detector_problems``
  entry for its kind), never a crash or a hang;
* the framework probes (``gpulayer_framework_probes``), in subprocesses of the job Python,
  one per plugin (:mod:`gpulayer.framework_probe`, which also caches them);
* host facts: OS, CPU, RAM, free disk under ``$GPULAYER_HOME``, the job Python, and the
  address peers can reach.

Every value gets a :class:`~gpulayer.hookrecords.Provenance` in ``Capabilities.provenance``
(which plugin, which source), and then the overrides of ``resources.toml`` and the
``GPULAYER_OVERRIDE_*`` variables (:mod:`gpulayer.overrides`) are applied on top, each
recorded as such. ``resources detect --explain`` prints the lot.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from gpulayer import capability_key, overrides, plugins
from gpulayer.errors import one_line
from gpulayer.framework_probe import PROBE_SCRIPT, ProbeResult, probe_frameworks
from gpulayer.hookrecords import (
    AcceleratorDetector,
    Capabilities,
    DetectionResult,
    Device,
    HostInfo,
    Provenance,
)

__all__ = [
    "PROBE_SCRIPT",
    "DeviceDetection",
    "ProbeResult",
    "advertise_address",
    "detect_capabilities",
    "detect_devices",
    "host_info",
    "probe_frameworks",
]

ADVERTISE_ENV = capability_key.ADVERTISE_ENV
# Grace on top of a detector's own timeout before we stop waiting for its thread.
_GRACE = 1.0


# --------------------------------------------------------------------------- devices


def _run_guarded(detector: AcceleratorDetector, timeout: float, slot: dict[str, Any]) -> None:
    try:
        result = detector.detect(timeout)
        if not isinstance(result, DetectionResult):
            raise TypeError(f"detect() returned {type(result).__name__}, expected DetectionResult")
        slot["result"] = result
    except BaseException as exc:  # a detector must never take the caller down
        slot["error"] = one_line(exc)


def _detectors_to_run() -> tuple[dict[str, AcceleratorDetector], list[str]]:
    """The detectors ``GPULAYER_DETECTORS`` lets run (stand-ins always run), and a
    diagnostic when it names a kind no detector has."""
    detectors = plugins.detectors()
    allowed = plugins.allowed_detectors()
    if allowed is None:
        return detectors, []
    diagnostics = []
    unknown = sorted(allowed - set(detectors))
    if unknown:
        diagnostics.append(
            f"{plugins.DETECTORS_ENV} names no accelerator detector: {', '.join(unknown)} "
            f"(detectors: {', '.join(sorted(detectors)) or 'none'}; '{plugins.NO_DETECTORS}' runs none)"
        )
    kept = {name: det for name, det in detectors.items() if det.stand_in or name in allowed}
    return kept, diagnostics


class DeviceDetection(NamedTuple):
    """What the detectors found: devices (each with its ``plugin`` and ``source``),
    diagnostics, and per kind what went wrong (a detector that timed out, raised, or found
    nothing and said why)."""

    devices: list[Device]
    diagnostics: list[str]
    problems: dict[str, str]


def detect_devices(timeout: float = 10.0) -> tuple[list[Device], list[str]]:
    """Call every detector concurrently; a detector that raises or overruns becomes a
    diagnostic. Devices are ordered by kind, then index.

    ``GPULAYER_DETECTORS=cuda,npu`` runs only the detectors of those kinds, ``none`` none
    of them; stand-in (fake) detectors run either way.
    """
    found = detect_device_kinds(timeout)
    return found.devices, found.diagnostics


def detect_device_kinds(timeout: float = 10.0, only: set[str] | None = None) -> DeviceDetection:
    """:func:`detect_devices` with the trouble of each kind kept apart; ``only``: run just
    the detectors of these kinds (a retry of the ones that timed out)."""
    manager = plugins.get_manager()
    detectors, diagnostics = _detectors_to_run()
    if only is not None:
        detectors = {k: d for k, d in detectors.items() if k in only}
        diagnostics = []
    threads: list[tuple[str, threading.Thread, dict[str, Any]]] = []
    for name, det in sorted(detectors.items()):
        slot: dict[str, Any] = {}
        t = threading.Thread(target=_run_guarded, args=(det, timeout, slot),
                             name=f"gpulayer-detect-{name}", daemon=True)
        t.start()
        threads.append((name, t, slot))
    devices: list[Device] = []
    problems: dict[str, str] = {}
    deadline = time.monotonic() + timeout + _GRACE
    for name, t, slot in threads:
        t.join(max(deadline - time.monotonic(), 0))
        owner = manager.owner(plugins.DETECTORS_HOOK, name)
        who = f"detector {name!r} (plugin {owner!r})"
        if t.is_alive():
            problems[name] = f"{who} gave no answer within {timeout:g}s and was abandoned"
            diagnostics.append(problems[name])
            continue
        if "error" in slot:
            problems[name] = f"{who} failed: {slot['error']}"
            diagnostics.append(problems[name])
            continue
        result: DetectionResult = slot["result"]
        for dev in result.devices:
            if dev.kind != name:
                diagnostics.append(f"{who} reported a {dev.kind!r} device; kept as {dev.kind!r}")
            devices.append(dev.model_copy(update={
                "plugin": owner, "source": dev.source or result.source or f"detector {name!r}"}))
        diagnostics.extend(result.diagnostics)
        if result.diagnostics and not any(d.usable for d in result.devices):
            problems[name] = "; ".join(result.diagnostics)
    devices.sort(key=lambda d: (d.kind, d.index))
    return DeviceDetection(devices, diagnostics, problems)


# --------------------------------------------------------------------------- host


def advertise_address() -> str:
    """``$GPULAYER_ADVERTISE_ADDRESS``, else the source address of the default route (a UDP
    ``connect`` sends no packet), else 127.0.0.1."""
    return capability_key.address()[0]


def host_info(python: str | None = None, python_version: str | None = None) -> HostInfo:
    return _host(python, python_version)[0]


def _host(python: str | None, python_version: str | None) -> tuple[HostInfo, dict[str, Provenance]]:
    """This host's facts (:func:`gpulayer.capability_key.host_facts`, which the light path
    of ``resources detect`` reads too) and where each came from."""
    facts = capability_key.host_facts(python or sys.executable)
    host = HostInfo(
        os=facts["os"], os_release=facts["os_release"], arch=facts["arch"], hostname=facts["hostname"],
        cpu_count=facts["cpu_count"], memory_bytes=facts["memory_bytes"],
        disk_free_bytes=facts["disk_free_bytes"], python_version=python_version or facts["this_python"],
        python_path=facts["python_path"], address=facts["address"],
    )
    provenance = {
        "host.cpu_count": Provenance(source="os.cpu_count()"),
        "host.memory_bytes": Provenance(source=facts["memory_source"]),
        "host.disk_free_bytes": Provenance(source=f"free space under {facts['home']}"),
        "host.address": Provenance(source=facts["address_source"]),
        "host.python_version": Provenance(
            source="this interpreter" if facts["ours"] and python_version in (None, facts["this_python"])
            else f"the framework probe of {facts['python_path']}"),
    }
    return host, provenance


# --------------------------------------------------------------------------- all together


class RawDetection(NamedTuple):
    """What the detectors and probes said, before host facts and overrides: what the
    capability cache keeps (:mod:`gpulayer.capability_cache`)."""

    devices: DeviceDetection
    probe: ProbeResult
    probe_diagnostics: list[str]


def detect_raw(python: str, *, timeout: float = 10.0, use_cache: bool = True,
               only: set[str] | None = None, probe: bool = True) -> RawDetection:
    """Run the detectors (``only`` some kinds) and, with ``probe``, the framework probes,
    concurrently; never raises for a misbehaving one."""
    probe_slot: dict[str, Any] = {}

    def _probe() -> None:
        try:
            probe_slot["value"] = probe_frameworks(python, timeout=timeout, use_cache=use_cache)
        except BaseException as exc:
            probe_slot["error"] = one_line(exc)

    plugins.get_manager()  # load plugins (and raise plugin errors) in this thread
    probe_thread = threading.Thread(target=_probe, name="gpulayer-probe", daemon=True)
    if probe:
        probe_thread.start()
    found = detect_device_kinds(timeout, only)
    result = ProbeResult(frameworks={}, backends=[])
    probe_diags: list[str] = []
    if probe:
        probe_thread.join(timeout + _GRACE + 2)
        if "value" in probe_slot:
            result, probe_diags = probe_slot["value"]
        else:
            probe_diags = [f"framework probe failed: {probe_slot.get('error', 'no answer')}"]
    return RawDetection(found, result, probe_diags)


def assemble(raw: RawDetection, python: str, labels: Mapping[str, str] | None = None) -> Capabilities:
    """Capabilities from a raw detection, this host's facts, and where each value came from."""
    result = raw.probe
    host, provenance = _host(python, result.get("python_version") or "unknown")
    for d in raw.devices.devices:
        provenance[f"device.{d.kind}:{d.index}"] = Provenance(plugin=d.plugin, source=d.source or "detector")
    sources = result.get("sources", {})
    owners = result.get("plugins", {})
    for name in result.get("frameworks", {}):
        provenance[f"framework.{name}"] = Provenance(plugin=owners.get(name),
                                                     source=sources.get(name, "package metadata"))
    backends = list(result.get("backends", []))
    if backends:
        how = sorted({sources.get(f"backend {b}", "backends check") for b in backends})
        # the plugins whose probes read them (an entry cached before they were recorded: the
        # first framework's)
        who = list(dict.fromkeys(o for b in backends if (o := owners.get(f"backend {b}"))))
        owner = (", ".join(who) if who else
                 next((owners.get(n) for n in result.get("frameworks", {}) if owners.get(n)), None))
        provenance["backends"] = Provenance(plugin=owner, source="; ".join(how))
    probe_problems = [d for d in raw.probe_diagnostics if "no answer" in d or "exited with" in d
                      or "cannot run" in d or "probe failed" in d]
    return Capabilities(
        host=host,
        devices=list(raw.devices.devices),
        frameworks=dict(sorted(result.get("frameworks", {}).items())),
        distributed_backends=backends,
        labels=dict(labels or {}),
        diagnostics=[*raw.devices.diagnostics, *raw.probe_diagnostics],
        provenance=dict(sorted(provenance.items())),
        detector_problems=dict(raw.devices.problems),
        probe_problems=probe_problems,
    )


def detect_capabilities(
    *, python: str | None = None, timeout: float = 10.0,
    labels: Mapping[str, str] | None = None, use_cache: bool = True,
    resources_file: str | Path | None = None,
) -> Capabilities:
    """Everything this machine offers to jobs run by ``python`` (default: this interpreter),
    detected now (framework probes may come from their cache), with the overrides of
    ``resources_file`` (default: ``$GPULAYER_HOME/resources.toml`` when it exists) and of
    the ``GPULAYER_OVERRIDE_*`` variables applied.

    Never raises for a misbehaving detector or probe and never waits much longer than
    ``timeout``: trouble is reported in ``Capabilities.diagnostics``. A bad override is an
    :class:`~gpulayer.errors.InvalidInput` naming the key (and the file).
    """
    return detect_stored(python=python, timeout=timeout, labels=labels, use_cache=use_cache,
                         resources_file=resources_file)[0]


def detect_stored(
    *, python: str | None = None, timeout: float = 10.0,
    labels: Mapping[str, str] | None = None, use_cache: bool = True,
    resources_file: str | Path | None = None,
) -> tuple[Capabilities, str]:
    """:func:`detect_capabilities`, and the id of the capability cache entry it stored
    (:func:`gpulayer.capability_cache.remember_output`)."""
    python = python or sys.executable
    wanted = overrides.load(resources_file)  # bad input fails before anything runs
    raw = detect_raw(python, timeout=timeout, use_cache=use_cache)
    from gpulayer import capability_cache

    entry_id = capability_cache.store(python, raw, timeout=timeout)
    return overrides.apply(assemble(raw, python, labels), wanted), entry_id
