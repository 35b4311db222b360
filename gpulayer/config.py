"""Every ``GPULAYER_*`` setting, parsed in one place; and where GPUlayer keeps its state.

:func:`settings` reads the environment into one :class:`Settings` record. A value that
cannot be used is an :class:`~gpulayer.errors.InvalidInput` naming the variable, the value
and what is accepted (``GPULAYER_HEARTBEAT_TIMEOUT='abc': expected a number of seconds >
0``), never a bare ``ValueError`` from deep inside. The result is cached while the
environment's GPULAYER variables stay the same (tests and the CLI's global options change
them), so reading a setting costs a few dictionary lookups.

:data:`SETTINGS` is the table of every variable with its default and meaning;
docs/settings.md shows the same table and a test keeps the two in step.

Variables GPUlayer sets *inside* a job (``GPULAYER_JOB_ID``, ``GPULAYER_ACCELERATOR``, ...)
and a plugin's own switches are not settings of GPUlayer's and are documented where they
belong (docs/concepts.md, the plugin's docstring).
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from gpulayer.errors import DatabaseFailed, InvalidInput

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["SETTINGS", "Setting", "Settings", "home", "max_artifacts_bytes", "max_bundle_bytes", "parse_device_refs", "settings"]


# (named tuples, not dataclasses: the CLI's start-up reads the settings, and dataclasses
# import inspect, ast and dis, a fifth of what `gpulayer jobs list` costs over Python's own start)
class Setting(NamedTuple):
    """One environment variable: its name, its attribute on :class:`Settings`, how to read
    it, its default (shown in the docs as written), and what it means."""

    name: str
    attr: str
    parse: Callable[[str, str], Any]
    default: Any
    shown: str
    help: str


# ---------------------------------------------------------------------------------- parsers


def _text(name: str, raw: str) -> str | None:
    return raw.strip() or None


def _control_url(name: str, raw: str) -> str | None:
    """A control plane's URL: ``http(s)://HOST[:PORT]``, with a path where a proxy serves it
    under one (``https://proxy/gpulayer``: the API's paths follow it); no user name and
    password (they would replace the token's header), no query or fragment (no route has one)."""
    from urllib.parse import urlsplit

    text = raw.strip()
    if not text:
        return None
    accepted = "expected http://HOST:PORT or https://HOST:PORT (a proxy's path may follow)"
    try:
        parts = urlsplit(text)
        port = parts.port  # (ValueError for a port that is no number 0-65535)
    except ValueError as exc:
        raise InvalidInput(f"{name}={raw!r}: {exc}; {accepted}") from None
    why = ("not http:// or https://" if parts.scheme not in ("http", "https") else
           "no host" if not parts.hostname else
           "a user name or password in it (give the token with --token / GPULAYER_TOKEN)"
           if parts.username is not None or parts.password is not None else
           "a query or fragment after the address" if parts.query or parts.fragment
           else "port 0" if port == 0 else None)
    if why is not None:
        raise InvalidInput(f"{name}={raw!r}: {why}; {accepted}")
    return text


def _api_token(name: str, raw: str) -> str | None:
    text = raw.strip()
    if text and not (text.isascii() and text.isprintable() and " " not in text):
        raise InvalidInput(f"{name}: not an API token (it holds a space, a control character or a character "
                           "that is not ASCII); expected the glt_... text that gpulayer token create printed")
    return text or None


def _ca(name: str, raw: str) -> str | None:
    text = raw.strip()
    if text.lower().startswith("sha256:"):
        digits = text[len("sha256:"):].replace(":", "")
        if len(digits) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise InvalidInput(f"{name}={raw!r}: not a SHA-256 fingerprint; expected sha256: and 64 hex digits "
                               "(colons between pairs allowed), as gpulayer server start prints it, or a CA file")
    return text or None


def check_connection_flags(url: str | None, token: str | None, ca: str | None) -> None:
    """The CLI's ``--url``, ``--token`` and ``--ca`` checked as their variables are, each
    refused naming the flag (they become the variables, which would be named otherwise)."""
    for flag, value, parse in (("--url", url, _control_url), ("--token", token, _api_token), ("--ca", ca, _ca)):
        if value is not None:
            parse(flag, value)


def _address(name: str, raw: str) -> str | None:
    """An address peers reach: an IP address or a host name (labels of letters, digits and
    hyphens, dot-separated): what torchrun's rendezvous endpoint accepts."""
    import ipaddress
    import re

    text = raw.strip()
    if not text:
        return None
    try:
        ipaddress.ip_address(text)
        return text
    except ValueError:
        pass
    label = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
    if len(text) > 253 or not re.fullmatch(rf"{label}(\.{label})*\.?", text) or re.fullmatch(r"[0-9.]+", text):
        raise InvalidInput(f"{name}={raw!r}: not an address; expected an IP address (10.0.0.5, fd00::5) or a "
                           "host name (gpu-box.example.com)")
    return text


def _names(name: str, raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _seconds(minimum: float, *, inclusive: bool = False) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value >= minimum if inclusive else value > minimum)
        if not ok:
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise InvalidInput(f"{name}={raw!r}: expected a number of seconds {bound}")
        return value
    return parse


def _positive(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InvalidInput(f"{name}={raw!r}: expected a number > 0")
    return value


#: the most artifacts of one task a control plane can store, in MB: one database value
#: (SQLite's longest, 10^9 bytes by default; PostgreSQL's, 1 GB), less room to spare
MAX_ARTIFACTS_MB = 900.0


def _artifacts_mb(name: str, raw: str) -> float:
    value = _positive(name, raw)
    if value > MAX_ARTIFACTS_MB:
        raise InvalidInput(f"{name}={raw!r}: expected a number > 0 and at most {MAX_ARTIFACTS_MB:g} (a task's "
                           "artifacts are one value in the control plane's database)")
    return value


def _count(minimum: int) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise InvalidInput(f"{name}={raw!r}: expected a whole number >= {minimum}") from None
        if value < minimum:
            raise InvalidInput(f"{name}={raw!r}: expected a whole number >= {minimum}")
        return value
    return parse


def _port_range(name: str, raw: str) -> tuple[int, int]:
    try:
        low, high = (int(p) for p in raw.split("-", 1))
    except ValueError:
        raise InvalidInput(f"{name}={raw!r}: expected LOW-HIGH, e.g. 20000-32767") from None
    if not 1024 <= low <= high <= 65535:
        raise InvalidInput(f"{name}={raw!r}: expected 1024 <= LOW <= HIGH <= 65535")
    return low, high


def _nonnegative(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise InvalidInput(f"{name}={raw!r}: expected a number >= 0")
    return value


def parse_device_refs(where: str, items: tuple[str, ...]) -> tuple[tuple[str, int | None], ...]:
    """``("cuda:1", "rocm")`` as ``(("cuda", 1), ("rocm", None))``; ``where`` names the input."""
    refs: list[tuple[str, int | None]] = []
    for item in items:
        kind, sep, index = item.strip().partition(":")
        if not kind or (sep and not index.isdigit()):
            raise InvalidInput(f"{where}: {item!r} is not KIND or KIND:INDEX (e.g. cuda:1, or cuda for every "
                               "cuda device)")
        refs.append((kind.lower(), int(index) if sep else None))
    return tuple(refs)


def _device_refs(name: str, raw: str) -> tuple[tuple[str, int | None], ...]:
    return parse_device_refs(f"{name}={raw!r}", _names(name, raw))


def _framework_versions(name: str, raw: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in _names(name, raw):
        fw, sep, version = item.partition("=")
        if not sep or not fw.strip():
            raise InvalidInput(f"{name}={raw!r}: expected NAME=VERSION pairs, comma separated "
                               "(NAME= for a framework that is absent), e.g. torch=2.4.0,jax=")
        if not is_version(version.strip()):
            raise InvalidInput(f"{name}={raw!r}: {fw.strip()}={version.strip()!r}: not a version; accepted: a PEP 440 "
                               "version such as 2.4.0, or nothing (jax=) for a framework that is absent")
        out[fw.strip()] = version.strip()
    return out


def is_version(text: str) -> bool:
    """Whether ``text`` is a version a job's specifier can be checked against (PEP 440), or
    empty: a framework version an override reports (another, ``abc``, satisfies no
    specifier, and was taken)."""
    if not text:
        return True
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _switch(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise InvalidInput(f"{name}={raw!r}: expected 1 or 0 (also true/false, yes/no, on/off)")


def _one_of(*choices: str) -> Callable[[str, str], str]:
    """One of ``choices``, in any case (given back in theirs: all upper or all lower)."""
    fold = str.upper if choices[0].isupper() else str.lower

    def parse(name: str, raw: str) -> str:
        if fold(raw.strip()) not in choices:
            raise InvalidInput(f"{name}={raw!r}: expected one of {', '.join(choices)}")
        return fold(raw.strip())
    return parse


def module_names(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated Python module names (``torch,numpy.linalg``), in order, each once;
    ``name`` is how the user wrote the input (a variable, a CLI flag) in the error."""
    out: dict[str, None] = {}
    for part in raw.split(","):
        module = part.strip()
        if not module:
            continue
        if not all(piece.isidentifier() for piece in module.split(".")):
            given = f"{name} {raw!r}" if name.startswith("-") else f"{name}={raw!r}"  # (a flag, a variable)
            raise InvalidInput(f"{given}: {module!r} is not a module name; expected Python module names, "
                               "comma separated (torch,numpy.linalg)")
        out[module] = None
    return tuple(out)


def _duration(name: str, raw: str) -> float:
    from gpulayer.units import parse_duration

    try:
        return parse_duration(raw)
    except InvalidInput as exc:
        raise InvalidInput(f"{name}={raw!r}: {str(exc).split(': ', 1)[-1]}") from None


_sqlite_sync = _one_of("full", "normal")
_on_off = _one_of("on", "off")
_level = _one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


# ---------------------------------------------------------------------------------- the table

SETTINGS: tuple[Setting, ...] = (
    Setting("GPULAYER_HOME", "home", _text, None, "`~/.gpulayer`",
            "state directory: the embedded SQLite database, bundle cache, worker scratch space, tokens"),
    Setting("GPULAYER_URL", "url", _control_url, None, "unset (embedded)",
            "a self-hosted control plane (`http(s)://HOST:PORT`); unset means embedded"),
    Setting("GPULAYER_TOKEN", "token", _api_token, None, "unset", "the API token for `GPULAYER_URL`"),
    Setting("GPULAYER_CA", "ca", _ca, None, "unset (system trust store)",
            "CA bundle or certificate file to trust for `GPULAYER_URL`, or a pin `sha256:AB:CD:...`"),
    Setting("GPULAYER_DATABASE_URL", "database_url", _text, None, "SQLite in `GPULAYER_HOME`",
            "the database of the embedded control plane and of `gpulayer server start` "
            "(`sqlite:///PATH` or `postgresql://USER@HOST/DB`)"),
    Setting("GPULAYER_SQLITE_SYNC", "sqlite_sync", _sqlite_sync, "full", "`full`",
            "how this process commits to an SQLite database: `full` writes each commit through to the disk "
            "before it is acknowledged, so a power loss or an operating system crash loses no acknowledged "
            "change; `normal` leaves that to SQLite's checkpoints: fewer disk syncs, and the last changes "
            "before such a crash may be lost (a crash of GPUlayer's own processes loses nothing either way). "
            "Each process that writes (a worker, a server, your program) follows its own: set it alike"),
    Setting("GPULAYER_SLOT_LENDING", "slot_lending", _on_off, "on", "`on`",
            "whether a task that waits for jobs may lend its CPU slot to the queue meanwhile (docs/concepts.md, "
            "Jobs that submit jobs); read by the control plane (a server's, or each process's embedded): `off` "
            "keeps every task's slot for its whole run, so no owner's jobs can run past the workers' slots"),
    Setting("GPULAYER_KEEP_JOBS", "keep_jobs", _duration, None, "unset (every job is kept)",
            "how long a job is kept after it ended, e.g. `30d` (units s, m, h, d): older ones are deleted with "
            "their output, result and events, and bundles no kept job names with them (docs/concepts.md, Deleting "
            "jobs); read where the control plane runs: a server checks every 10 minutes (or every half of the kept "
            "time, if that is shorter), and on an embedded one each worker does (a script's own worker, "
            "`gpulayer worker start`)"),
    Setting("GPULAYER_PLUGINS", "plugins", _names, (), "none",
            "extra plugin modules to load, comma separated (a plugin under development, tests)"),
    Setting("GPULAYER_DISABLE_PLUGINS", "disable_plugins", _names, (), "none",
            "plugins not to load, by name, comma separated"),
    Setting("GPULAYER_DETECTORS", "detectors", _names, (), "all installed",
            "accelerator kinds whose installed detectors run, comma separated, or `none` "
            "(fake devices of the test helpers always run)"),
    Setting("GPULAYER_MAX_BUNDLE_MB", "max_bundle_mb", _positive, 100.0, "`100`",
            "largest source bundle accepted, in MB (2^20 bytes)"),
    Setting("GPULAYER_MAX_BUNDLE_UNPACKED_MB", "max_bundle_unpacked_mb", _positive, 1000.0, "`1000`",
            "most content a source bundle may extract to, in MB (2^20 bytes); a bundle that declares more is "
            "refused at upload and by workers before anything is written"),
    Setting("GPULAYER_MAX_BUNDLE_RATIO", "max_bundle_ratio", _positive, 200.0, "`200`",
            "highest compression ratio (extracted / compressed size) of a source bundle, and of each of its "
            "files over 1 MB; a higher one is refused as a compression bomb"),
    Setting("GPULAYER_MAX_BUNDLE_FILES", "max_bundle_files", _count(1), 100_000, "`100000`",
            "most entries a source bundle may hold"),
    Setting("GPULAYER_MAX_ARTIFACTS_MB", "max_artifacts_mb", _artifacts_mb, 500.0, "`500`",
            "largest zip of the files one task leaves in `GPULAYER_ARTIFACTS_DIR` that a control plane stores, "
            "in MB (2^20 bytes), at most 900 (one value in its database); a worker checks it before it sends "
            "them, a server as they come"),
    Setting("GPULAYER_BUNDLE_CACHE_MB", "bundle_cache_mb", _positive, 10240.0, "`10240`",
            "size a worker's extracted bundles (`$GPULAYER_HOME/bundles`) may reach before the least recently "
            "used are deleted, in MB (2^20 bytes); bundles of running tasks are kept"),
    Setting("GPULAYER_BUNDLE_CACHE_DAYS", "bundle_cache_days", _positive, 7.0, "`7`",
            "days after its last use an extracted bundle is deleted"),
    Setting("GPULAYER_MAX_ARGS_MB", "max_args_mb", _positive, 1.0, "`1`",
            "largest JSON arguments (args and kwargs together) of a function job, in MB (2^20 bytes)"),
    Setting("GPULAYER_MAX_ARGS_VALUES", "max_args_values", _count(1), 100_000, "`100000`",
            "most values (list items, mapping values, nested ones counted) in a function job's arguments"),
    Setting("GPULAYER_MAX_RESULT_MB", "max_result_mb", _positive, 8.0, "`8`",
            "largest JSON result of a function job, in MB (2^20 bytes); larger ones fail the job, saying so"),
    Setting("GPULAYER_HEARTBEAT_TIMEOUT", "heartbeat_timeout", _seconds(0), 10.0, "`10`",
            "seconds without a heartbeat after which a worker is offline and its running tasks lost"),
    Setting("GPULAYER_HEARTBEAT_INTERVAL", "heartbeat_interval", _seconds(0), None,
            "`0.5` embedded, `1` remote", "seconds between a worker's heartbeats"),
    Setting("GPULAYER_HTTP_RETRY_SECONDS", "http_retry_seconds", _seconds(0, inclusive=True), 30.0, "`30`",
            "how long a client keeps retrying a call through an outage of the server"),
    Setting("GPULAYER_CPU_SLOTS", "cpu_slots", _count(0), None, "min(4, CPUs)",
            "CPU-only tasks the in-process worker of the SDK and CLI runs at once"),
    Setting("GPULAYER_PRELOAD", "preload", module_names, (), "none",
            "modules a worker's fork server imports once, before it forks each FunctionJob's process, "
            "comma separated (`torch,numpy`): what `gpulayer worker start --preload` sets, and what the "
            "in-process worker of the SDK and CLI reads (docs/concepts.md#preloaded-modules)"),
    Setting("GPULAYER_EXIT_GRACE", "exit_grace", _seconds(0, inclusive=True), 2.0, "`2`",
            "seconds the in-process worker gives running tasks when its process exits"),
    Setting("GPULAYER_ADVERTISE_ADDRESS", "advertise_address", _address, None, "the default route's address",
            "the address a worker reports for peers to reach it (distributed jobs' rendezvous)"),
    Setting("GPULAYER_RENDEZVOUS_PORTS", "rendezvous_ports", _port_range, (20000, 32767), "`20000-32767`",
            "ports the control plane draws a distributed job's rendezvous port from"),
    Setting("GPULAYER_SERVER_THREADS", "server_threads", _count(1), 200, "`200`",
            "threads of `gpulayer server start` for database calls"),
    Setting("GPULAYER_SERVER_HEADER_TIMEOUT", "server_header_timeout", _seconds(0), 20.0, "`20`",
            "seconds `gpulayer server start` (and `gpulayer dashboard`) gives a connection to send a request's "
            "line and headers, from when it opens or from the first byte of a later request on it; one that "
            "takes longer is closed (docs/server.md#security-model)"),
    Setting("GPULAYER_PROVIDERS", "providers", _text, None, "`$GPULAYER_HOME/providers.toml` if it exists",
            "the providers file of `gpulayer server start` (what `--providers FILE` sets): docs/providers.md"),
    Setting("GPULAYER_PUBLIC_URL", "public_url", _control_url, None, "the URL the server listens on",
            "the URL machines booted by providers reach `gpulayer server start` at"),
    Setting("GPULAYER_MACHINE_ID", "machine_id", _text, None, "unset",
            "set by a provider on a machine it boots: `gpulayer worker start` joins as that machine"),
    Setting("GPULAYER_LOG_LEVEL", "log_level", _level, "INFO", "`INFO`",
            ("log level of `gpulayer worker start`, `gpulayer server start` and `gpulayer dashboard` (their "
            "`--log-level` is uvicorn's)")),
    Setting("GPULAYER_WARM_CLI", "warm_cli", _switch, True, "`1`",
            "`0`: `gpulayer worker start` starts no CLI server, and commands run in their own "
            "process even where one runs, nor start one (docs/cli.md#the-warm-cli)"),
    Setting("GPULAYER_CLI_SERVER_IDLE", "cli_server_idle", _seconds(0, inclusive=True), 600.0, "`600`",
            "seconds a CLI server that a command started (no worker running on the home) waits for the "
            "next command line before it exits; `0`: a command starts none (docs/cli.md#the-warm-cli)"),
    # Overrides of detected values; the same keys as resources.toml (gpulayer/overrides.py).
    Setting("GPULAYER_OVERRIDE_CPU_COUNT", "override_cpu_count", _count(1), None, "detected",
            "the CPUs a worker reports (a container's CPU quota); resources.toml `cpu_count`"),
    Setting("GPULAYER_OVERRIDE_MEMORY_GB", "override_memory_gb", _positive, None, "detected",
            "the RAM a worker reports, in GB (2^30 bytes); resources.toml `memory_gb`"),
    Setting("GPULAYER_OVERRIDE_DISK_FREE_GB", "override_disk_free_gb", _nonnegative, None, "detected",
            "the free disk a worker reports, in GB; resources.toml `disk_free_gb`"),
    Setting("GPULAYER_OVERRIDE_ADDRESS", "override_address", _address, None, "detected",
            "the address a worker reports for peers (behind NAT); resources.toml `address`"),
    Setting("GPULAYER_OVERRIDE_HIDE_DEVICES", "override_hide_devices", _device_refs, None, "none",
            "devices a worker does not offer, comma separated: `cuda:1`, or `cuda` for all of a kind; "
            "resources.toml `hide_devices`"),
    Setting("GPULAYER_OVERRIDE_BACKENDS", "override_backends", _names, None, "detected",
            "the distributed backends a worker reports, comma separated; resources.toml `backends`"),
    Setting("GPULAYER_OVERRIDE_FRAMEWORKS", "override_frameworks", _framework_versions, None, "detected",
            "framework versions a worker reports: `torch=2.4.0,jax=` (empty: absent); "
            "resources.toml `[frameworks]`"),
)


class Settings(NamedTuple):
    home: str | None
    url: str | None
    token: str | None
    ca: str | None
    database_url: str | None
    sqlite_sync: str
    slot_lending: str
    keep_jobs: float | None
    plugins: tuple[str, ...]
    disable_plugins: tuple[str, ...]
    detectors: tuple[str, ...]
    max_bundle_mb: float
    max_bundle_unpacked_mb: float
    max_bundle_ratio: float
    max_bundle_files: int
    max_artifacts_mb: float
    bundle_cache_mb: float
    bundle_cache_days: float
    max_args_mb: float
    max_args_values: int
    max_result_mb: float
    heartbeat_timeout: float
    heartbeat_interval: float | None
    http_retry_seconds: float
    cpu_slots: int | None
    preload: tuple[str, ...]
    exit_grace: float
    advertise_address: str | None
    rendezvous_ports: tuple[int, int]
    server_threads: int
    server_header_timeout: float
    providers: str | None
    public_url: str | None
    machine_id: str | None
    log_level: str
    warm_cli: bool
    cli_server_idle: float
    override_cpu_count: int | None
    override_memory_gb: float | None
    override_disk_free_gb: float | None
    override_address: str | None
    override_hide_devices: tuple[tuple[str, int | None], ...] | None
    override_backends: tuple[str, ...] | None
    override_frameworks: dict[str, str] | None


_cache: tuple[tuple[Any, ...], Settings] | None = None
#: the settings' variables as os.environ stores them (see _stored_values)
_keys: tuple[Any, ...] | None = None


def _stored_values() -> tuple[Any, ...] | None:
    """The settings' variables as ``os.environ`` stores them (encoded), looked up without
    decoding each one: whether they changed is then known in 1 µs, not the 20 µs of 37
    ``os.environ.get`` (a job reads the settings several times). None where ``os.environ``
    is not CPython's ``os._Environ``."""
    global _keys
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encode is None or not hasattr(os.environ, "decodevalue"):
        return None
    if _keys is None:
        _keys = tuple(encode(s.name) for s in SETTINGS)
    return tuple(map(data.get, _keys))


def settings() -> Settings:
    """The settings in the environment now (cached while it stays the same)."""
    global _cache
    key = _stored_values()
    raw: tuple[str | None, ...] | None = None
    if key is None:
        key = raw = tuple(os.environ.get(s.name) for s in SETTINGS)
    if _cache is not None and _cache[0] == key:
        return _cache[1]
    if raw is None:  # the values of this key, decoded (not read again: they may change meanwhile)
        decode = os.environ.decodevalue
        raw = tuple(None if v is None else decode(v) for v in key)
    values = {}
    for s, value in zip(SETTINGS, raw, strict=True):
        values[s.attr] = s.default if value is None or value.strip() == "" else s.parse(s.name, value)
    parsed = Settings(**values)
    _cache = (key, parsed)
    return parsed


_homes: dict[str, Path] = {}
#: the CLI's ``--home`` as given (it becomes GPULAYER_HOME): an error names the flag, not the variable
home_flag: str | None = None


def home() -> Path:
    """The state directory, created on first use (readable by its owner only: it holds the
    database, with job specs, code, logs and results, and tokens)."""
    from pathlib import Path

    raw = settings().home or str(Path.home() / ".gpulayer")
    known = _homes.get(raw)
    if known is not None and known.is_dir():  # (looked at several times per job: one stat)
        return known
    path = Path(raw).expanduser().resolve()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:  # (a file of that name, a folder it may not write in)
        if home_flag is not None and home_flag == settings().home:
            given = f"--home {raw!r}"
        else:
            given = f"GPULAYER_HOME={raw!r}" if settings().home else f"the default home (~/.gpulayer)={raw!r}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):  # (a full disk: no fault of the home given)
            raise DatabaseFailed(f"{given}: cannot create the state directory: {exc.strerror}",
                                 reason=exc.strerror) from None
        raise InvalidInput(f"{given}: cannot be the state directory: {exc.strerror}; expected a folder "
                           "this user may create or write in") from None
    st = path.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:  # made before, or by something else
        os.chmod(path, 0o700)
    if os.path.isabs(raw):  # (a relative one follows the working directory)
        _homes[raw] = path
    return path


def max_bundle_bytes() -> int:
    return int(settings().max_bundle_mb * 1024 * 1024)


def max_artifacts_bytes() -> int:
    return int(settings().max_artifacts_mb * 1024 * 1024)
