"""The capability cache's key, its entries' validity and this host's facts, on the standard library.

:mod:`gpulayer.capability_cache` (the full path: plugins loaded, pydantic records) and the
CLI's light path (:mod:`gpulayer.cli.light`, which answers ``resources detect`` before Typer,
pydantic or pluggy is imported) both find and check an entry here, so that the two can
never disagree on which entry is current:

* :func:`key`: the entry's digest (the job Python and this interpreter, their real paths;
  this interpreter's ``sys.path`` less its first entry; the host name; ``PATH``,
  ``PYTHONPATH`` and the ``GPULAYER_*`` variables that change what detectors see) and the
  paths whose modification times the entry records;
* :func:`read`: an entry of this format whose recorded paths are unchanged (installing a
  package touches its ``site-packages``; the plugins' own modules are recorded too), and
  the variables its detectors declared they read (``AcceleratorDetector.inputs``) too.

The installed plugins are not in the digest (knowing their status means importing them,
with pluggy): the entry records them, and the full path, which loads them anyway, checks
that record (:func:`gpulayer.capability_cache.cached_capabilities`). The light path
answers only from entries whose plugins all loaded (or were disabled), none registered
in-process, with their modules unchanged.

:func:`host_facts` reads what a worker reports of this host (CPUs, RAM, free disk, the
address peers reach), for :func:`gpulayer.resources.assemble`; :func:`output_facts` is what,
besides the entry, the text of ``resources detect`` depends on, recorded next to that text
(:func:`cached_output`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gpulayer import config
from gpulayer.errors import GpulayerError
from gpulayer.units import format_gb

__all__ = ["MAX_AGE", "VERSION", "cached_output", "entry_path", "host_facts", "key", "output_facts",
           "quiet_plugins", "read", "stamps"]

#: the entry format (an entry of another is not read)
VERSION = 2
#: seconds after which an entry is refreshed in the background (still used meanwhile); the
#: light path does not answer from an entry older than this
MAX_AGE = 3600.0
#: GPULAYER_* settings that do change what the detectors report (``gpulayer.plugins``'
#: ``EXTRA_ENV``, ``DISABLE_ENV``, ``DETECTORS_ENV``: a test keeps them equal)
DETECTION_SETTINGS = frozenset({"GPULAYER_PLUGINS", "GPULAYER_DISABLE_PLUGINS", "GPULAYER_DETECTORS"})
#: plugin statuses under which loading the plugins prints nothing
QUIET_STATUSES = frozenset({"loaded", "disabled"})
ADVERTISE_ENV = "GPULAYER_ADVERTISE_ADDRESS"


def key(python: str) -> tuple[str, list[str]]:
    """The entry's digest for ``python``, and the paths whose stamps must not change."""
    known = {s.name for s in config.SETTINGS}
    env = {k: v for k, v in sorted(os.environ.items())
           if (k.startswith("GPULAYER_") and (k not in known or k in DETECTION_SETTINGS))
           or k in ("PATH", "PYTHONPATH")}
    ours = [p for p in sys.path[1:] if p]
    material = [VERSION, os.path.realpath(python), os.path.realpath(sys.executable), ours,
                socket.gethostname(), env]
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]
    return digest, [python, sys.executable, *ours]


def entry_path(python: str | None = None) -> Path:
    return config.home() / "cache" / "capabilities" / f"{key(python or sys.executable)[0]}.json"


def stamps(paths: list[str]) -> list[list[Any]]:
    """``[path, mtime_ns or None]`` for each path, once each, in order."""
    out: list[list[Any]] = []
    for p in dict.fromkeys(paths):
        try:
            out.append([p, os.stat(p).st_mtime_ns])
        except OSError:
            out.append([p, None])
    return out


def read(path: Path) -> dict[str, Any] | None:
    """The entry at ``path``, when it is of this format and its paths are unchanged."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("version") != VERSION:
        return None
    if stamps([s[0] for s in entry.get("stamps", [])]) != entry.get("stamps"):
        return None
    inputs = entry.get("inputs") or {}
    if not isinstance(inputs, dict) or any(os.environ.get(k) != v for k, v in inputs.items()):
        return None  # a variable a detector reads changed (AcceleratorDetector.inputs)
    return entry


# --------------------------------------------------------------------------- host facts


def address() -> tuple[str, str]:
    """The address peers reach, and how it was found: ``$GPULAYER_ADVERTISE_ADDRESS``, else
    the source address of the default route (a UDP ``connect`` sends no packet), else
    127.0.0.1."""
    explicit = config.settings().advertise_address
    if explicit:
        return explicit, ADVERTISE_ENV
    for family, target in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((target, 9))
                addr = str(s.getsockname()[0])
            if addr and not addr.startswith(("127.", "0.")) and addr not in ("::", "::1"):
                return addr, "the default route's source address"
        except OSError:
            continue
    return "127.0.0.1", "no route found: loopback"


def memory() -> tuple[int, str]:
    """This host's RAM in bytes, and where the figure came from: the physical pages the
    kernel counts (``MemTotal`` of ``/proc/meminfo`` on Linux, ``hw.memsize`` on macOS), from
    ``os.sysconf`` where it has them, else psutil (Windows; an import the light path of
    ``resources detect`` would pay 0.5x ``python -c pass`` for)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "os.sysconf(SC_PHYS_PAGES)"
    except (AttributeError, ValueError, OSError):
        import psutil

        return int(psutil.virtual_memory().total), "psutil"


def host_facts(python: str) -> dict[str, Any]:
    """What a worker running jobs with ``python`` reports of this host, read now."""
    home = config.home()
    try:
        disk_free = shutil.disk_usage(home).free
    except OSError:
        disk_free = 0
    addr, address_source = address()
    memory_bytes, memory_source = memory()
    return {
        "os": platform.system().lower(), "os_release": platform.release(), "arch": platform.machine(),
        "hostname": socket.gethostname(), "cpu_count": os.cpu_count() or 0,
        "memory_bytes": memory_bytes, "memory_source": memory_source, "disk_free_bytes": disk_free,
        "python_path": python, "address": addr, "address_source": address_source, "home": str(home),
        "this_python": platform.python_version(),
        "ours": os.path.realpath(python) == os.path.realpath(sys.executable),
    }


def output_facts(python: str) -> dict[str, Any]:
    """Everything besides the entry that the text of ``resources detect`` (and of
    ``--explain``) depends on: this host's facts, with free disk as that text shows it
    (to one decimal of a GB, :func:`gpulayer.units.format_gb`: the text shows no finer
    figure, the JSON does), and the overrides' sources (the ``resources.toml`` of
    ``$GPULAYER_HOME`` and the ``GPULAYER_OVERRIDE_*`` variables). A setting that does not
    parse, or a ``resources.toml`` that cannot be read, is a
    :class:`~gpulayer.errors.GpulayerError` (the full path says what is wrong)."""
    facts = host_facts(python)
    facts["disk_free_bytes"] = format_gb(facts["disk_free_bytes"])
    path = config.home() / "resources.toml"  # gpulayer.overrides.default_path()
    try:
        content: str | None = hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        content = None
    except OSError as exc:
        raise GpulayerError(f"{path}: {exc}") from None
    facts["resources.toml"] = content
    facts["overrides"] = {s.name: os.environ.get(s.name) for s in config.SETTINGS
                          if s.name.startswith("GPULAYER_OVERRIDE_")}
    return facts


# --------------------------------------------------------------------------- resources detect's text


def quiet_plugins(entry: dict[str, Any]) -> bool:
    """Whether the entry's plugins all loaded (or were disabled), none registered in-process:
    loading them again prints nothing, and a process of its own has them all."""
    recorded = entry.get("plugins")
    return isinstance(recorded, list) and all(p[4] in QUIET_STATUSES and p[5] is None for p in recorded)


def output_key(python: str, *, explain: bool) -> str:
    """Which of an entry's texts a ``resources detect`` command line prints."""
    return json.dumps({"python": python, "explain": explain}, sort_keys=True)


def cached_output(python: str, *, explain: bool) -> str | None:
    """The text ``resources detect`` (``--explain``) printed for ``python`` from the current
    entry, when the entry is less than :data:`MAX_AGE` old, its plugins loaded quietly,
    and this host's facts and the overrides are what they were; else None."""
    try:
        path = entry_path(python)
        entry = read(path)
        if entry is None or time.time() - float(entry.get("written", 0)) > MAX_AGE:
            return None
        if not quiet_plugins(entry):
            return None
        recorded = entry.get("outputs", {}).get(output_key(python, explain=explain))
        if not isinstance(recorded, dict) or recorded.get("facts") != output_facts(python):
            return None
    except GpulayerError:
        return None
    text = recorded.get("text")
    return text if isinstance(text, str) else None
