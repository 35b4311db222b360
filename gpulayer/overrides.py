"""Overrides: what a site tells a worker about itself that detection gets wrong or should not use.

Two places, the variables winning over the file key by key (a framework at a time):

* ``resources.toml`` in ``$GPULAYER_HOME`` (or the file of ``gpulayer worker start
  --resources FILE``);
* the ``GPULAYER_OVERRIDE_*`` variables, parsed with every other setting in
  :mod:`gpulayer.config`.

==================  ==============================  =========================================
key                 variable                        what it does
==================  ==============================  =========================================
``cpu_count``       ``GPULAYER_OVERRIDE_CPU_COUNT``     the CPUs jobs may use (a container's quota)
``memory_gb``       ``GPULAYER_OVERRIDE_MEMORY_GB``     RAM in GB (2^30 bytes)
``disk_free_gb``    ``GPULAYER_OVERRIDE_DISK_FREE_GB``  free disk in GB
``address``         ``GPULAYER_OVERRIDE_ADDRESS``       the address peers reach (behind NAT)
``hide_devices``    ``GPULAYER_OVERRIDE_HIDE_DEVICES``  devices not to offer: ``cuda:1``, or
                                                    ``cuda`` for every device of the kind
``backends``        ``GPULAYER_OVERRIDE_BACKENDS``      the distributed backends, replacing
                                                    the detected list
``[frameworks]``    ``GPULAYER_OVERRIDE_FRAMEWORKS``    ``NAME = "VERSION"`` sets a framework's
                                                    version, ``NAME = ""`` says it is absent
==================  ==============================  =========================================

:func:`apply` records each one in ``Capabilities.provenance`` (``override`` says where it
came from, ``detected`` what detection said) and moves hidden devices to
``Capabilities.hidden_devices``, so ``resources detect --explain``, ``worker status --json``
and rejection reasons (``needs 2 usable cuda device(s), worker has 1 (1 hidden by
override)``) say so. An unknown key or a value of the wrong kind is an
:class:`~gpulayer.errors.InvalidInput` naming the file and the key.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer import config
from gpulayer.errors import InvalidInput
from gpulayer.hookrecords import Capabilities, Provenance
from gpulayer.units import GB, format_gb

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["FILE_NAME", "KEYS", "Override", "apply", "default_path", "load"]

FILE_NAME = "resources.toml"

#: key -> (the Settings attribute of its variable, what is accepted)
KEYS: dict[str, tuple[str, str]] = {
    "cpu_count": ("override_cpu_count", "a whole number >= 1"),
    "memory_gb": ("override_memory_gb", "a number of GB > 0"),
    "disk_free_gb": ("override_disk_free_gb", "a number of GB >= 0"),
    "address": ("override_address", "a host name or IP address"),
    "hide_devices": ("override_hide_devices", 'a list of devices such as ["cuda:1"] or ["cuda"]'),
    "backends": ("override_backends", 'a list of backend names such as ["gloo"]'),
    "frameworks": ("override_frameworks", 'a table of NAME = "VERSION" ("" for absent)'),
}


def variable(key: str) -> str:
    return f"GPULAYER_OVERRIDE_{key.upper()}"


@dataclass(frozen=True)
class Override:
    """One override: its key, its (validated) value, and where it came from."""

    key: str
    value: Any
    origin: str  # "GPULAYER_OVERRIDE_CPU_COUNT" or "/path/resources.toml: cpu_count"


def default_path() -> Path:
    return config.home() / FILE_NAME


def _check(where: str, key: str, value: Any) -> Any:
    """``value`` of ``key`` from the file, validated; InvalidInput naming ``where``."""
    accepted = KEYS[key][1]

    def bad() -> InvalidInput:
        return InvalidInput(f"{where} = {value!r}: expected {accepted}")

    if key == "cpu_count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad()
        return value
    if key in ("memory_gb", "disk_free_gb"):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise bad()
        if value < 0 or (key == "memory_gb" and value == 0):
            raise bad()
        return float(value)
    if key == "address":
        if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value.strip()):
            raise bad()
        return value.strip()
    if key in ("hide_devices", "backends"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise bad()
        items = tuple(v.strip() for v in value)
        return config.parse_device_refs(where, items) if key == "hide_devices" else items
    # frameworks
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise bad()
    for name, version in value.items():
        if not config.is_version(version.strip()):
            raise InvalidInput(f"{where}.{name} = {version!r}: not a version; expected a PEP 440 version such as "
                               '"2.4.0", or "" for a framework that is absent')
    return {str(k): v.strip() for k, v in value.items()}


def _from_file(path: Path, *, explicit: str | None) -> list[Override]:
    named = f"{explicit} {str(path)!r}" if explicit else str(path)  # (the flag, where one gave it)
    try:
        text = path.read_text()
    except FileNotFoundError:
        if explicit:
            raise InvalidInput(f"{named}: no such file") from None
        return []
    except OSError as exc:
        raise InvalidInput(f"{named}: cannot read it: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{named}: not valid TOML: {exc}") from None
    out = []
    for key, value in data.items():
        if key not in KEYS:
            raise InvalidInput(f"{path}: unknown key {key!r}; the keys are {', '.join(KEYS)}")
        out.append(Override(key, _check(f"{path}: {key}", key, value), f"{path}: {key}"))
    return out


def load(path: str | Path | None = None, *, option: str = "--resources") -> list[Override]:
    """The overrides in effect: ``path`` (must exist) or ``$GPULAYER_HOME/resources.toml``
    (when it exists), then the ``GPULAYER_OVERRIDE_*`` variables over it."""
    explicit = option if path is not None else None
    if path is not None and not str(path):  # (a Path of '' is the folder it runs in)
        raise InvalidInput(f"{option} '': empty; accepted: the path of a resources file (TOML)")
    from_file = _from_file(Path(path) if path is not None else default_path(), explicit=explicit)
    env = config.settings()
    from_env = [Override(key, getattr(env, attr), variable(key))
                for key, (attr, _) in KEYS.items() if getattr(env, attr) is not None]
    # frameworks are merged name by name (applied in order, the variable last); any other
    # key the variable sets replaces the file's
    replaced = {o.key for o in from_env if o.key != "frameworks"}
    return [o for o in from_file if o.key not in replaced] + from_env


def _set(prov: dict[str, Provenance], key: str, origin: str, detected: str | None) -> None:
    before = prov.get(key)
    prov[key] = Provenance(plugin=None, source="override", override=origin,
                           detected=None if detected is None else
                           f"{detected}, from {before.source}" if before is not None else detected)


def apply(caps: Capabilities, overrides: list[Override]) -> Capabilities:
    """``caps`` with ``overrides`` applied, each recorded in its provenance."""
    if not overrides:
        return caps
    host = caps.host.model_copy()
    prov = dict(caps.provenance)
    devices = list(caps.devices)
    hidden = list(caps.hidden_devices)
    frameworks = dict(caps.frameworks)
    backends = list(caps.distributed_backends)
    diagnostics = list(caps.diagnostics)
    for o in overrides:
        if o.key == "cpu_count":
            _set(prov, "host.cpu_count", o.origin, str(host.cpu_count))
            host.cpu_count = o.value
        elif o.key == "memory_gb":
            _set(prov, "host.memory_bytes", o.origin, f"{format_gb(host.memory_bytes)} GB")
            host.memory_bytes = int(o.value * GB)
        elif o.key == "disk_free_gb":
            _set(prov, "host.disk_free_bytes", o.origin, f"{format_gb(host.disk_free_bytes)} GB")
            host.disk_free_bytes = int(o.value * GB)
        elif o.key == "address":
            _set(prov, "host.address", o.origin, host.address)
            host.address = o.value
        elif o.key == "hide_devices":
            for kind, index in o.value:
                matched = [d for d in devices if d.kind == kind and (index is None or d.index == index)]
                if not matched:
                    ref = kind if index is None else f"{kind}:{index}"
                    diagnostics.append(f"override {o.origin}: no {ref} device was detected, nothing to hide")
                for d in matched:
                    devices.remove(d)
                    hidden.append(d)
                    _set(prov, f"device.{d.kind}:{d.index}", o.origin, d.name)
        elif o.key == "backends":
            _set(prov, "backends", o.origin, ", ".join(backends) or "none")
            backends = list(o.value)
        elif o.key == "frameworks":
            for name, version in o.value.items():
                origin = f"{o.origin}.{name}" if o.origin.endswith(": frameworks") else o.origin
                _set(prov, f"framework.{name}", origin, frameworks.get(name, "not installed"))
                if version:
                    frameworks[name] = version
                else:
                    frameworks.pop(name, None)
    return caps.model_copy(update={
        "host": host, "devices": devices, "hidden_devices": hidden, "diagnostics": diagnostics,
        "frameworks": dict(sorted(frameworks.items())), "distributed_backends": backends,
        "provenance": dict(sorted(prov.items())),
        "overrides": {k: p.override for k, p in sorted(prov.items()) if p.override is not None},
    })
