"""Builds a worker's :class:`~gpulayer.hookrecords.Capabilities` from hook results.

Three sources, run concurrently and each bounded by ``timeout``:

* every accelerator detector (``gpulayer_accelerator_detectors``), each in its own daemon
  thread: one that raises or hangs becomes a diagnostic line, never a crash or a hang;
* the framework probes (``gpulayer_framework_probes``), evaluated in ONE subprocess of the
  job Python (which need not be ours): versions from package metadata, then the sub-probes
  and backend checks, which import frameworks such as torch. The CLI's own process never
  imports a framework. The answer is cached on disk (see below);
* host facts: OS, CPU, RAM, free disk under ``$GPULAYER_HOME``, the job Python, and the
  address peers can reach.

The probe cache lives in ``$GPULAYER_HOME/cache/probes/``. An entry is keyed by the job
Python's path, the probe definitions and ``PYTHONPATH``, and is valid while the Python
executable and every directory on that Python's ``sys.path`` keep their modification time;
installing or removing a package touches its ``site-packages`` directory, so the next
detection probes again. ``use_cache=False`` (``--refresh``) always probes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulayer import config, plugins
from gpulayer.hookrecords import (
    AcceleratorDetector,
    Capabilities,
    DetectionResult,
    Device,
    FrameworkProbe,
    HostInfo,
)

__all__ = [
    "PROBE_SCRIPT",
    "ProbeResult",
    "advertise_address",
    "detect_capabilities",
    "detect_devices",
    "host_info",
    "probe_frameworks",
]

ADVERTISE_ENV = "GPULAYER_ADVERTISE_ADDRESS"
_SENTINEL = "@@gpulayer-probe@@"
# Grace on top of a detector's own timeout before we stop waiting for its thread.
_GRACE = 1.0

# Runs in the job Python: `python -c PROBE_SCRIPT`, probes as JSON on stdin, one JSON line
# (after the sentinel) on stdout. Kept compatible with Python 3.8+.
PROBE_SCRIPT = r"""
import fnmatch, json, re, sys, traceback
from importlib import metadata
spec = json.load(sys.stdin)
out = {"python_version": "%d.%d.%d" % sys.version_info[:3], "python_path": sys.executable,
       "sys_path": [p for p in sys.path if p], "frameworks": {}, "backends": [], "errors": []}
_all = None
def _norm(n):
    return re.sub(r"[-_.]+", "-", n).lower()
def version_of(names):
    global _all
    for name in names:
        if "*" in name:
            if _all is None:
                _all = {}
                for d in metadata.distributions():
                    try:
                        _all.setdefault(_norm(d.metadata["Name"]), d.version)
                    except Exception:
                        pass
            for dn in sorted(_all):
                if fnmatch.fnmatchcase(dn, _norm(name)):
                    return _all[dn]
        else:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
    return None
def run(name, code):
    src = "def _probe():\n" + "\n".join("    " + l for l in code.strip().splitlines())
    ns = {}
    exec(compile(src, "<probe %s>" % name, "exec"), ns)
    return ns["_probe"]()
for p in spec["probes"]:
    v = version_of(p["distributions"] or [p["name"]])
    if v is None:
        continue
    out["frameworks"][p["name"]] = v
    for sp in p["subprobes"]:
        try:
            r = run(sp["name"], sp["code"])
        except Exception as exc:
            out["errors"].append("%s: %s: %s" % (sp["name"], type(exc).__name__, exc))
            continue
        if r:
            out["frameworks"][sp["name"]] = str(r)
    if p.get("backends_code"):
        try:
            for b in run(p["name"] + " backends", p["backends_code"]) or []:
                if b not in out["backends"]:
                    out["backends"].append(str(b))
        except Exception as exc:
            out["errors"].append("%s backends: %s: %s" % (p["name"], type(exc).__name__, exc))
sys.stdout.flush()
print("\n" + SENTINEL + json.dumps(out))
""".replace("SENTINEL", repr(_SENTINEL))


class ProbeResult(dict):  # type: ignore[type-arg]
    """The framework probe's answer: python_version, python_path, sys_path, frameworks,
    backends, errors (plain JSON, as cached)."""


# --------------------------------------------------------------------------- frameworks


def _probe_spec(probes: Mapping[str, FrameworkProbe]) -> dict[str, Any]:
    return {"probes": [
        {"name": p.name, "distributions": p.distributions,
         "subprobes": [{"name": s.name, "code": s.code} for s in p.subprobes],
         "backends_code": p.backends_code}
        for p in sorted(probes.values(), key=lambda p: p.name)
    ]}


def _cache_path(python: str, spec: dict[str, Any]) -> Path:
    key = json.dumps([python, spec, os.environ.get("PYTHONPATH", "")], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return config.home() / "cache" / "probes" / f"{digest}.json"


def _stamp(paths: list[str]) -> list[list[Any]]:
    stamps: list[list[Any]] = []
    for p in paths:
        try:
            st = os.stat(p)
            stamps.append([p, st.st_mtime_ns, st.st_size])
        except OSError:
            stamps.append([p, None, None])
    return stamps


def _read_cache(path: Path) -> ProbeResult | None:
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or "result" not in entry or "stamps" not in entry:
        return None
    paths = [s[0] for s in entry["stamps"]]
    if _stamp(paths) != entry["stamps"]:
        return None
    return ProbeResult(entry["result"])


def _write_cache(path: Path, python: str, result: ProbeResult) -> None:
    stamps = _stamp([python, *result.get("sys_path", [])])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"stamps": stamps, "result": dict(result)}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs speed


def _metadata_only(probes: Mapping[str, FrameworkProbe]) -> dict[str, str]:
    """Versions from our own package metadata (when the job Python is ours)."""
    from importlib import metadata

    found: dict[str, str] = {}
    for probe in probes.values():
        for dist in probe.distributions or [probe.name]:
            if "*" in dist:
                continue
            try:
                found[probe.name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def probe_frameworks(
    python: str | None = None, *, timeout: float = 10.0, use_cache: bool = True,
    probes: Mapping[str, FrameworkProbe] | None = None,
) -> tuple[ProbeResult, list[str]]:
    """Run every framework probe in one subprocess of ``python``; return (result, diagnostics).

    On a timeout or a broken interpreter the result holds what could be learned without
    it (our own metadata when ``python`` is this interpreter) and a diagnostic says why.
    """
    python = python or sys.executable
    probes = plugins.framework_probes() if probes is None else probes
    spec = _probe_spec(probes)
    cache = _cache_path(python, spec)
    if use_cache:
        cached = _read_cache(cache)
        if cached is not None:
            return cached, [f"framework probe: {e}" for e in cached.get("errors", [])]
    ours = os.path.realpath(python) == os.path.realpath(sys.executable)
    fallback = ProbeResult(
        python_version=platform.python_version() if ours else "unknown",
        python_path=python, sys_path=[], frameworks=_metadata_only(probes) if ours else {},
        backends=[], errors=[],
    )
    env = dict(os.environ)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    try:
        proc = subprocess.Popen(
            [python, "-c", PROBE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, errors="replace", env=env,
            start_new_session=(os.name == "posix"),
        )
    except OSError as exc:
        return fallback, [f"framework probe: cannot run {python}: {exc}"]
    try:
        out, err = proc.communicate(json.dumps(spec), timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, 9)
            else:  # pragma: no cover
                proc.kill()
        except OSError:
            pass
        proc.communicate()
        return fallback, [
            f"framework probe: {python} gave no answer within {timeout:g}s (killed); "
            "framework sub-probes (torch.cuda, ...) are not reported"
        ]
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith(_SENTINEL)), None)
    if proc.returncode != 0 or line is None:
        tail = (err.strip().splitlines() or ["no output"])[-1][:300]
        return fallback, [f"framework probe: {python} exited with status {proc.returncode}: {tail}"]
    result = ProbeResult(json.loads(line[len(_SENTINEL):]))
    _write_cache(cache, python, result)  # a fresh answer refreshes the cache either way
    return result, [f"framework probe: {e}" for e in result.get("errors", [])]


# --------------------------------------------------------------------------- devices


def _run_guarded(detector: AcceleratorDetector, timeout: float, slot: dict[str, Any]) -> None:
    try:
        result = detector.detect(timeout)
        if not isinstance(result, DetectionResult):
            raise TypeError(f"detect() returned {type(result).__name__}, expected DetectionResult")
        slot["result"] = result
    except BaseException as exc:  # a detector must never take the caller down
        slot["error"] = f"{type(exc).__name__}: {exc}"


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


def detect_devices(timeout: float = 10.0) -> tuple[list[Device], list[str]]:
    """Call every detector concurrently; a detector that raises or overruns becomes a
    diagnostic. Devices are ordered by kind, then index.

    ``GPULAYER_DETECTORS=cuda,npu`` runs only the detectors of those kinds, ``none`` none
    of them; stand-in (fake) detectors run either way.
    """
    manager = plugins.get_manager()
    detectors, diagnostics = _detectors_to_run()
    threads: list[tuple[str, threading.Thread, dict[str, Any]]] = []
    for name, det in sorted(detectors.items()):
        slot: dict[str, Any] = {}
        t = threading.Thread(target=_run_guarded, args=(det, timeout, slot),
                             name=f"gpulayer-detect-{name}", daemon=True)
        t.start()
        threads.append((name, t, slot))
    devices: list[Device] = []
    deadline = time.monotonic() + timeout + _GRACE
    for name, t, slot in threads:
        t.join(max(deadline - time.monotonic(), 0))
        owner = manager.owner(plugins.DETECTORS_HOOK, name)
        who = f"detector {name!r} (plugin {owner!r})"
        if t.is_alive():
            diagnostics.append(f"{who} gave no answer within {timeout:g}s and was abandoned")
            continue
        if "error" in slot:
            diagnostics.append(f"{who} failed: {slot['error']}")
            continue
        result: DetectionResult = slot["result"]
        for dev in result.devices:
            if dev.kind != name:
                diagnostics.append(f"{who} reported a {dev.kind!r} device; kept as {dev.kind!r}")
            devices.append(dev)
        diagnostics.extend(result.diagnostics)
    devices.sort(key=lambda d: (d.kind, d.index))
    return devices, diagnostics


# --------------------------------------------------------------------------- host


def advertise_address() -> str:
    """``$GPULAYER_ADVERTISE_ADDRESS``, else the source address of the default route (a UDP
    ``connect`` sends no packet), else 127.0.0.1."""
    explicit = config.settings().advertise_address
    if explicit:
        return explicit
    for family, target in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                addr = str(s.getsockname()[0])
            if addr and not addr.startswith(("127.", "0.")) and addr not in ("::", "::1"):
                return addr
        except OSError:
            continue
    return "127.0.0.1"


def host_info(python: str | None = None, python_version: str | None = None) -> HostInfo:
    import psutil

    python = python or sys.executable
    try:
        disk_free = shutil.disk_usage(config.home()).free
    except OSError:
        disk_free = 0
    return HostInfo(
        os=platform.system().lower(),
        os_release=platform.release(),
        arch=platform.machine(),
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count() or 0,
        memory_bytes=int(psutil.virtual_memory().total),
        disk_free_bytes=disk_free,
        python_version=python_version or platform.python_version(),
        python_path=python,
        address=advertise_address(),
    )


# --------------------------------------------------------------------------- all together


def detect_capabilities(
    *, python: str | None = None, timeout: float = 10.0,
    labels: Mapping[str, str] | None = None, use_cache: bool = True,
) -> Capabilities:
    """Everything this machine offers to jobs run by ``python`` (default: this interpreter).

    Never raises for a misbehaving detector or probe and never waits much longer than
    ``timeout``: trouble is reported in ``Capabilities.diagnostics``.
    """
    python = python or sys.executable
    probe_slot: dict[str, Any] = {}

    def _probe() -> None:
        try:
            probe_slot["value"] = probe_frameworks(python, timeout=timeout, use_cache=use_cache)
        except BaseException as exc:
            probe_slot["error"] = f"{type(exc).__name__}: {exc}"

    plugins.get_manager()  # load plugins (and raise plugin errors) in this thread
    probe_thread = threading.Thread(target=_probe, name="gpulayer-probe", daemon=True)
    probe_thread.start()
    devices, diagnostics = detect_devices(timeout)
    probe_thread.join(timeout + _GRACE + 2)
    result: ProbeResult
    if "value" in probe_slot:
        result, probe_diags = probe_slot["value"]
        diagnostics.extend(probe_diags)
    else:
        result = ProbeResult(frameworks={}, backends=[])
        diagnostics.append(f"framework probe failed: {probe_slot.get('error', 'no answer')}")
    host = host_info(python, result.get("python_version") or "unknown")
    return Capabilities(
        host=host,
        devices=devices,
        frameworks=dict(sorted(result.get("frameworks", {}).items())),
        distributed_backends=list(result.get("backends", [])),
        labels=dict(labels or {}),
        diagnostics=diagnostics,
    )
