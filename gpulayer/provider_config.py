"""Loading providers.toml: one section per provider instance, each validated by its adapter.

A section names an adapter (the ``type`` key: the ``name`` of a
:class:`~gpulayer.hookrecords.ProviderAdapter` from the ``gpulayer_provider_adapters`` hook)
and holds the core's own keys (:data:`CORE_KEYS`: caps and timeouts); everything else is
validated by the adapter's ``config`` model. Every error names the file, the section and
the key as the user wrote them (a key of a nested table or list by its dotted path from the
section, ``hosts.0.port``, ``regions.us-east-1.ami``), says what is accepted there, and
shows a value only when it is the one scalar at that key (never a table, which may hold
secrets)::

    providers.toml: [gpu-a100] max_machines: expected a whole number >= 0, got 'many'
    providers.toml: [ec2] type: 'ec3' is not an installed provider adapter; installed: ec2, slurm, ssh
    providers.toml: [aws] regions.us-east-1.amii: not a setting of regions.us-east-1 (did you mean ami?); accepted: ami, ...

The file is ``--providers FILE`` of ``gpulayer server start``, else ``GPULAYER_PROVIDERS``,
else ``$GPULAYER_HOME/providers.toml`` when it exists (no file: no providers).
"""

from __future__ import annotations

import difflib
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpulayer import config, plugins
from gpulayer.errors import InvalidInput, one_line
from gpulayer.hookrecords import Provider, ProviderAdapter
from gpulayer.wording import fields_at

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: the keys of a section the core reads itself (the adapter's model never sees them)
CORE_KEYS = ("type", "max_machines", "max_price_per_hour", "idle_timeout", "join_timeout")
DEFAULT_MAX_MACHINES = 10
DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_JOIN_TIMEOUT = 600.0


@dataclass(frozen=True)
class Limits:
    """A provider instance's caps and timeouts (the core keys of its section)."""

    max_machines: int = DEFAULT_MAX_MACHINES
    #: offers priced above this are never launched; None: no cap (owned capacity is free)
    max_price_per_hour: float | None = None
    #: seconds a machine may sit without a task before it is drained and terminated
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    #: seconds from launch by which its worker must have joined
    join_timeout: float = DEFAULT_JOIN_TIMEOUT


@dataclass
class ConfiguredProvider:
    """One section of providers.toml, made into a provider."""

    name: str
    type: str
    adapter: ProviderAdapter
    settings: BaseModel
    limits: Limits
    provider: Provider
    #: the plugin the adapter comes from
    plugin: str = ""


def providers_file(explicit: str | Path | None = None) -> tuple[Path | None, str | None]:
    """The file to read and how the user named it, for errors (``--providers FILE``,
    ``GPULAYER_PROVIDERS='FILE'``; None for the default file). A named file must exist."""
    if explicit:
        return Path(explicit).expanduser(), f"--providers {explicit}"
    named = config.settings().providers
    if named:
        return Path(named).expanduser(), f"GPULAYER_PROVIDERS={named!r}"
    default = config.home() / "providers.toml"
    return (default, None) if default.is_file() else (None, None)


def load(explicit: str | Path | None = None) -> list[ConfiguredProvider]:
    """The providers of the providers file (see the module doc); none without a file."""
    path, named = providers_file(explicit)
    if path is None:
        return []
    if not path.exists():
        if named:
            raise InvalidInput(f"{named}: no such file")
        return []
    return parse(read(path, named), str(path))


def read(path: Path, named: str | None = None) -> str:
    """The text of a providers file; InvalidInput naming it when it cannot be read or is
    not UTF-8 (as TOML must be)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"{named or path}: cannot read it: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InvalidInput(f"{path}: line {line}: not UTF-8 text (byte {data[exc.start]:#04x}); "
                           f"a TOML file is UTF-8: save it as UTF-8") from None


def parse(text: str, where: str = "providers.toml",
          adapters: dict[str, ProviderAdapter] | None = None) -> list[ConfiguredProvider]:
    """The providers of a providers.toml text (``where`` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{where}: not valid TOML: {exc}") from None
    if adapters is None:
        adapters = plugins.providers()
    out = []
    for section, body in data.items():
        if not isinstance(body, dict):
            raise InvalidInput(f"{where}: {section!r}: expected a section [{section}] with a type key, "
                               f"got a bare value")
        out.append(_section(where, section, body, adapters))
    return out


def _section(where: str, section: str, body: dict[str, Any],
             adapters: dict[str, ProviderAdapter]) -> ConfiguredProvider:
    def bad(key: str, msg: str) -> InvalidInput:
        return InvalidInput(f"{where}: [{section}] {key}: {msg}")

    kind = body.get("type")
    installed = ", ".join(sorted(adapters)) or "none"
    if kind is None:
        raise bad("type", f"missing; name a provider adapter (installed: {installed})")
    if not isinstance(kind, str) or kind not in adapters:
        raise bad("type", f"{kind!r} is not an installed provider adapter; installed: {installed}")
    limits = Limits(
        max_machines=_count(body, "max_machines", DEFAULT_MAX_MACHINES, bad),
        max_price_per_hour=_number(body, "max_price_per_hour", None, bad, allow_zero=True),
        idle_timeout=_duration(body, "idle_timeout", DEFAULT_IDLE_TIMEOUT, bad),
        join_timeout=_duration(body, "join_timeout", DEFAULT_JOIN_TIMEOUT, bad),
    )
    adapter = adapters[kind]
    rest = {k: v for k, v in body.items() if k not in CORE_KEYS}
    owner = plugins.get_manager().owner("gpulayer_provider_adapters", kind) or ""
    who = f"provider adapter {kind!r}" + (f" (plugin {owner!r})" if owner else "")
    try:
        settings = adapter.config.model_validate(rest)
    except ValidationError as exc:
        raise InvalidInput(f"{where}: [{section}] {explain(exc, adapter.config, kind)}") from None
    except plugins.PLUGIN_FAULTS as exc:  # a validator's bug (pydantic passes on all but ValueError)
        raise InvalidInput(f"{where}: [{section}] {who} could not read this section: its config model raised "
                           f"{one_line(exc)}") from None
    try:
        provider = adapter.create(section, settings)
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: [{section}] {exc}") from None
    except plugins.PLUGIN_FAULTS as exc:  # the adapter's own failure: said naming it, not as a traceback
        raise InvalidInput(f"{where}: [{section}] {who} could not make this provider: create() raised "
                           f"{one_line(exc)}") from None
    return ConfiguredProvider(name=section, type=kind, adapter=adapter, settings=settings, limits=limits,
                              provider=provider, plugin=owner)


def _count(body: dict[str, Any], key: str, default: int, bad: Any) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad(key, f"expected a whole number >= 0, got {value!r}")
    return value


def _number(body: dict[str, Any], key: str, default: float | None, bad: Any, *, allow_zero: bool) -> float | None:
    value = body.get(key, default)
    if value is None:
        return None
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        raise bad(key, f"expected a number >= 0, got {value!r}")
    return float(value)


def _duration(body: dict[str, Any], key: str, default: float, bad: Any) -> float:
    from gpulayer.units import parse_duration

    value = body.get(key, default)
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except InvalidInput:
            pass
    elif not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0:
        return float(value)
    raise bad(key, f"expected seconds > 0 or a duration such as 90s, 15m, 1h; got {value!r}")


# --------------------------------------------------------------------------- adapters' errors

#: pydantic's error types, said in GPUlayer's words (``{ctx}`` filled from the error's context)
_WORDS = {
    "missing": "missing; it is required",
    "int_type": "expected a whole number", "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number", "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false", "bool_parsing": "expected true or false",
    "string_type": "expected a string (in quotes)",
    "list_type": "expected a list [...]",
    "dict_type": "expected a table", "model_type": "expected a table", "model_attributes_type": "expected a table",
    "greater_than": "expected a number > {gt}", "greater_than_equal": "expected a number >= {ge}",
    "less_than": "expected a number < {lt}", "less_than_equal": "expected a number <= {le}",
    "literal_error": "expected {expected}",
    "string_too_short": "expected at least {min_length} character(s)",
    "string_too_long": "expected at most {max_length} character(s)",
    "too_short": "expected at least {min_length} item(s)",
    "too_long": "expected at most {max_length} item(s)",
}


def explain(exc: ValidationError, model: type[BaseModel], kind: str) -> str:
    """``KEY: what is wrong`` for the error of ``exc`` most worth telling: a key that is not
    a setting first (a misspelt key also makes the key meant go missing)."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc)
    if err["type"] == "extra_forbidden":
        known = fields_at(model, tuple(err["loc"][:-1]))
        if not err["loc"][:-1]:
            known = sorted({*known, *CORE_KEYS})
        meant = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f" (did you mean {meant[0]}?)" if meant else ""
        where = f"{kind} providers" if len(loc) == 1 else ".".join(loc[:-1])
        accepted = f"; accepted: {', '.join(known)}" if known else ""
        return f"{key}: not a setting of {where}{hint}{accepted}"
    msg = _WORDS.get(err["type"], "")
    if err["type"] in ("value_error", "assertion_error") and "error" in err.get("ctx", {}):
        msg = str(err["ctx"]["error"])  # the validator's own words, without pydantic's prefix
    elif msg:
        # bounds as written (ge=0 on a float field is 0.0 in the context)
        ctx = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in err.get("ctx", {}).items()}
        try:
            msg = msg.format(**ctx)
        except (KeyError, IndexError):
            msg = err["msg"]
    else:
        msg = err["msg"]
    if _echoable(err) and repr(err["input"]) not in msg:  # (a validator's words may show it already)
        msg = f"{msg}, got {err['input']!r}"
    return f"{key}: {msg}" if key else msg


def _echoable(err: ErrorDetails) -> bool:
    """Whether the value is worth showing: one scalar the user wrote at that key (a table
    or a list is named by its key instead: it may hold secrets, and is long)."""
    value = err.get("input")
    return (err["type"] not in ("missing", "extra_forbidden") and err["loc"] != ()
            and isinstance(value, (str, int, float, bool)) and len(repr(value)) <= 80)


__all__ = ["CORE_KEYS", "ConfiguredProvider", "Limits", "load", "parse", "providers_file", "read"]
