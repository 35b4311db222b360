"""Cached detection: a foreground ``gpulayer submit`` or SDK script does not detect again.

Every detection (``resources detect``, ``worker start``, an in-process worker's first
start) stores what the detectors and framework probes said in
``$GPULAYER_HOME/cache/capabilities/<key>.json``; the in-process worker of the SDK and CLI
(:func:`cached_capabilities`) starts from that entry instead of running the detectors.
Host facts (CPUs, RAM, free disk, address) are read afresh each time (they cost nothing)
and overrides are applied afresh, so editing ``resources.toml`` needs no new detection.

The key and an entry's validity are :mod:`gpulayer.capability_key`'s (the standard
library's, shared with the CLI's light path): the job Python and this interpreter (their
real paths), this interpreter's ``sys.path`` (less its first entry, the script's folder or
the working directory), the host name, ``PATH``, ``PYTHONPATH`` and the ``GPULAYER_*``
variables that change what detectors see (the plugin and detector choices, plugins' own
switches). An entry is also dropped when the Python executable, a folder on either
``sys.path`` or a plugin's module (or a module of a plugin package) changed (installing a package touches its
``site-packages``), and, here, when the installed plugins (name, distribution, version,
module, status; an object registered in-process counts by identity) are not the ones it
records.

A detector that timed out or failed is not run again on every command: its trouble is kept
in the entry and retried with backoff (30 s, then doubling, at most an hour) by a
background process (``python -m gpulayer.capability_cache``, detached, bounded by the
detection timeout, one at a time per entry), which also refreshes an entry older than
:data:`MAX_AGE`. ``resources detect`` on the full path always detects afresh (and stores),
and keeps the text it printed in the entry (:func:`remember_output`): the next
``resources detect`` prints it again from the CLI's light path while the entry, the host's
facts and the overrides stay as they were (:func:`gpulayer.capability_key.cached_output`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpulayer import capability_key, config, overrides, plugins
from gpulayer.framework_probe import ProbeResult
from gpulayer.hookrecords import Capabilities, Device

__all__ = ["MAX_AGE", "cached_capabilities", "entry_path", "remember_output", "store"]

MAX_AGE = capability_key.MAX_AGE
RETRY_BASE = 30.0
RETRY_MAX = 3600.0
entry_path = capability_key.entry_path
#: what an entry holds of a detection (an entry's texts stay valid while these do)
_DETECTION = ("devices", "diagnostics", "problems", "probe", "probe_diagnostics")


def _in_process(manager: plugins.PluginManager, name: str) -> int | None:
    """The identity of a plugin object registered in this process (not a module), else None."""
    info = manager.infos.get(name)
    obj = manager.pm.get_plugin(name)
    if info is None or info.distribution is not None or obj is None or hasattr(obj, "__file__"):
        return None
    return id(obj)


def _plugin_ids(manager: plugins.PluginManager) -> list[list[Any]]:
    """The installed plugins as an entry records them: name, distribution, version, module,
    status, and the identity of an object registered in-process (else None)."""
    return [[i.name, i.distribution, i.version, i.module, i.status, _in_process(manager, i.name)]
            for i in sorted(manager.infos.values(), key=lambda i: i.name)]


def _plugin_files(manager: plugins.PluginManager) -> list[str]:
    """The files of the plugins' modules (imported by now), and of a plugin package's
    submodules (its detector may live in one): an edit to one is a new entry."""
    found = []
    packages = []
    for info in manager.infos.values():
        name = (info.module or "").partition(":")[0]
        module = sys.modules.get(name)
        if module is not None:
            found.append(module)
            if hasattr(module, "__path__"):  # a package: the submodules it imported, at any depth
                packages.append(name + ".")
    if packages:  # (one pass over the imported modules for all of them)
        prefixes = tuple(packages)
        found += [m for n, m in list(sys.modules.items()) if n.startswith(prefixes) and m is not None]
    files = {file for m in found if isinstance(file := getattr(m, "__file__", None), str)}
    return sorted(files)


def _read(path: Path, manager: plugins.PluginManager) -> dict[str, Any] | None:
    """The entry at ``path`` (:func:`gpulayer.capability_key.read`), when it was made with
    the plugins loaded here."""
    entry = capability_key.read(path)
    if entry is None or entry.get("plugins") != _plugin_ids(manager):
        return None
    return entry


def _write(path: Path, entry: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only costs speed


def store(python: str, raw: Any, *, timeout: float, only: set[str] | None = None,
          path: Path | None = None) -> str:
    """Store a detection (a :class:`~gpulayer.resources.RawDetection`); with ``only``, just
    the kinds that were run again, into the entry there is (at ``path``: the refresher).
    Returns the entry's id (for :func:`remember_output`)."""
    manager = plugins.get_manager()
    digest, paths = capability_key.key(python)
    old_entry = _read(path, manager) if path is not None else None
    if path is not None and old_entry is not None:
        paths = [s[0] for s in old_entry["stamps"]]  # the entry's own paths, stamped afresh
    path = path or config.home() / "cache" / "capabilities" / f"{digest}.json"
    old = old_entry or _read(path, manager) or {}
    now = time.time()
    devices = [d.model_dump(mode="json") for d in raw.devices.devices]
    problems = dict(raw.devices.problems)
    diagnostics = list(raw.devices.diagnostics)
    probe, probe_diags = dict(raw.probe), list(raw.probe_diagnostics)
    if only is not None and old:
        devices = [d for d in old["devices"] if d["kind"] not in only] + devices
        kept = {k: v for k, v in old.get("problems", {}).items() if k not in only}
        diagnostics = [d for d in old.get("diagnostics", []) if d not in old.get("problems", {}).values()
                       or d in kept.values()] + diagnostics
        problems = {**kept, **problems}
        probe, probe_diags = old["probe"], old["probe_diagnostics"]
    retries: dict[str, dict[str, float]] = {}
    for kind in problems:
        before = old.get("retries", {}).get(kind)
        ran_now = only is None or kind in only
        failures = (before["failures"] + 1 if before else 1) if ran_now else before["failures"] if before else 1
        retry_at = (now + min(RETRY_BASE * 2 ** (failures - 1), RETRY_MAX) if ran_now or not before
                    else before["retry_at"])
        retries[kind] = {"failures": failures, "retry_at": retry_at}
    stamps = capability_key.stamps([*paths, *probe.get("sys_path", []), *_plugin_files(manager)])
    detection = {"devices": devices, "diagnostics": diagnostics, "problems": problems, "probe": probe,
                 "probe_diagnostics": probe_diags}
    # the texts of `resources detect` rendered from the same detection stay (each is checked
    # against the host's facts when it is read)
    same = bool(old) and all(old.get(k) == json.loads(json.dumps(v)) for k, v in detection.items())
    entry_id = os.urandom(8).hex()
    # the detectors' own inputs as they are now (the detection just ran with them): a change
    # of one makes the entry stale (capability_key.read)
    inputs = sorted({name for det in plugins.detectors().values() for name in det.inputs})
    _write(path, {
        "version": capability_key.VERSION, "id": entry_id, "stamps": stamps,
        "inputs": {name: os.environ.get(name) for name in inputs},
        "written": old.get("written", now) if only else now, "timeout": timeout,
        "plugins": _plugin_ids(manager), **detection, "retries": retries,
        "outputs": old.get("outputs", {}) if same else {},
    })
    return entry_id


def remember_output(python: str, entry_id: str, *, explain: bool, text: str) -> None:
    """Keep ``text``, what ``resources detect`` printed from the entry ``entry_id`` just
    stored, in that entry, for the CLI's light path
    (:func:`gpulayer.capability_key.cached_output`) to print again while the entry and
    this host's facts stay as they are. Kept only when loading the plugins printed nothing
    (no plugin broken or failed, no name clash, no unknown name disabled) and the text has
    no escape sequence (click strips those when stdout is not a terminal)."""
    manager = plugins.get_manager()
    if manager.clashes or manager.unknown_disabled or "\x1b" in text:
        return
    path = capability_key.entry_path(python)
    entry = _read(path, manager)
    if entry is None or entry.get("id") != entry_id:
        return  # another process stored another detection meanwhile
    if not capability_key.quiet_plugins(entry):
        return
    entry["outputs"] = {**entry.get("outputs", {}), capability_key.output_key(python, explain=explain):
                        {"facts": capability_key.output_facts(python), "text": text}}
    _write(path, entry)


def _raw_from(entry: dict[str, Any]) -> Any:
    from gpulayer.resources import DeviceDetection, RawDetection

    return RawDetection(
        DeviceDetection([Device.model_validate(d) for d in entry["devices"]], list(entry["diagnostics"]),
                        dict(entry["problems"])),
        ProbeResult(entry["probe"]), list(entry["probe_diagnostics"]),
    )


def _refresh_in_background(python: str, entry: dict[str, Any], path: Path, *, timeout: float) -> None:
    """Start the detached refresher unless one is running for this entry."""
    now = time.time()
    due = sorted(k for k, r in entry.get("retries", {}).items() if r["retry_at"] <= now)
    stale = now - entry.get("written", 0) > MAX_AGE
    if not due and not stale:
        return
    manager = plugins.get_manager()
    if any(_in_process(manager, name) is not None for name in manager.infos):
        return  # a process of its own would not have the plugins registered here (tests)
    lock = path.with_suffix(".refreshing")
    try:
        if now - lock.stat().st_mtime < 2 * timeout + 30:
            return  # one is running (or died moments ago)
    except OSError:
        pass
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        os.close(fd)
        argv = [sys.executable, "-m", "gpulayer.capability_cache", "--python", python, "--timeout",
                str(timeout), "--lock", str(lock), "--entry", str(path)]
        if not stale:
            argv += ["--only", ",".join(due)]
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=(os.name == "posix"))
    except OSError:
        pass


def cached_capabilities(
    *, python: str | None = None, labels: Mapping[str, str] | None = None,
    resources_file: str | Path | None = None, timeout: float = 10.0,
) -> Capabilities:
    """Capabilities from the cache entry for ``python`` (detecting, and storing, only when
    there is none), with this host's facts and the overrides applied now."""
    from gpulayer.resources import assemble, detect_raw

    python = python or sys.executable
    wanted = overrides.load(resources_file)
    path = entry_path(python)
    entry = _read(path, plugins.get_manager())
    if entry is None:
        raw = detect_raw(python, timeout=timeout)
        store(python, raw, timeout=timeout)
        return overrides.apply(assemble(raw, python, labels), wanted)
    _refresh_in_background(python, entry, path, timeout=timeout)
    caps = assemble(_raw_from(entry), python, labels)
    notes = [f"detector {k!r}: its trouble is from an earlier detection, retried in the background "
             f"(attempt {r['failures'] + 1}) from {time.strftime('%H:%M:%S', time.localtime(r['retry_at']))}"
             for k, r in sorted(entry.get("retries", {}).items())]
    if notes:
        caps = caps.model_copy(update={"diagnostics": [*caps.diagnostics, *notes]})
    return overrides.apply(caps, wanted)


def _main(argv: list[str] | None = None) -> None:
    """The background refresher: detect (some kinds, or everything) and store."""
    from gpulayer.resources import detect_raw

    parser = argparse.ArgumentParser(prog="python -m gpulayer.capability_cache")
    parser.add_argument("--python", required=True)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--only", default=None)
    parser.add_argument("--lock", default=None)
    parser.add_argument("--entry", default=None)
    args = parser.parse_args(argv)
    only = set(filter(None, args.only.split(","))) if args.only is not None else None
    try:
        raw = detect_raw(args.python, timeout=args.timeout, only=only, probe=only is None)
        store(args.python, raw, timeout=args.timeout, only=only,
              path=Path(args.entry) if args.entry else None)
    finally:
        if args.lock:
            Path(args.lock).unlink(missing_ok=True)
    os._exit(0)  # do not wait for a detector thread that was abandoned


if __name__ == "__main__":
    _main()
