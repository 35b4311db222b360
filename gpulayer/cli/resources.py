"""``gpulayer resources detect``, ``gpulayer plugins list`` and ``gpulayer profiles list``.

None of these import a framework or call a driver in this process: detection goes through
:mod:`gpulayer.resources`, which runs vendor tools and framework probes as bounded
subprocesses.
"""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING

import typer

from gpulayer.cli.commands import help_of
from gpulayer.cli.conventions import existing_program, refuse_a_program_that_is_no_python
from gpulayer.units import format_gb

if TYPE_CHECKING:  # pydantic records and pluggy: loaded by the commands, not by --help
    from gpulayer import plugins
    from gpulayer.hookrecords import Capabilities

resources_app = typer.Typer(help=help_of("resources"), no_args_is_help=True, rich_markup_mode=None)
plugins_app = typer.Typer(help=help_of("plugins"), no_args_is_help=True, rich_markup_mode=None)
profiles_app = typer.Typer(help=help_of("profiles"),
                           no_args_is_help=True, rich_markup_mode=None)

_W = 10  # label column width: "device    [0] ..."


def _load_plugins(*, skip_unknown_disabled: bool = False, strict: bool = True) -> plugins.PluginManager:
    """Load plugins, turning the manager's warnings into ``warning:`` lines on stderr.
    ``strict``: a hard plugin error (a plugin named in GPULAYER_PLUGINS that does not
    import, ...) raises; else the caller reports it."""
    from gpulayer import plugins

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", plugins.PluginWarning)
        manager = plugins.get_manager(strict=strict)
    for w in caught:
        if issubclass(w.category, plugins.PluginWarning):
            if skip_unknown_disabled and str(w.message).startswith(plugins.DISABLE_ENV):
                continue  # the caller reports it in its own output
            typer.echo(f"warning: {w.message}", err=True)
        else:  # pragma: no cover - not ours to swallow
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return manager


def _gb(n: int) -> str:
    return f"{format_gb(n)} GB"


def render_capabilities(caps: Capabilities) -> list[str]:
    """The human-readable report of ``resources detect``, one line per fact."""
    h = caps.host
    lines = [
        f"{'host':<{_W}}{h.os} {h.arch}, {h.cpu_count} CPUs, {_gb(h.memory_bytes)} RAM, "
        f"{_gb(h.disk_free_bytes)} free disk, python {h.python_version} ({h.python_path})",
        f"{'address':<{_W}}{h.address}",
    ]
    if caps.devices:
        lines.extend(f"{'device':<{_W}}{d.describe()}" for d in caps.devices)
    else:
        lines.append(f"{'device':<{_W}}none found")
    if caps.frameworks:
        lines.extend(f"{'framework':<{_W}}{name} {version}" for name, version in caps.frameworks.items())
    else:
        lines.append(f"{'framework':<{_W}}none found")
    lines.append(f"{'backends':<{_W}}{', '.join(caps.distributed_backends) or 'none'}")
    lines.extend(f"{'label':<{_W}}{k}={v}" for k, v in caps.labels.items())
    lines.extend(f"{'diagnostic':<{_W}} {d}" for d in caps.diagnostics)
    return lines


def _from(caps: Capabilities, key: str) -> str:
    """``plugin cuda: NVML`` / ``os.cpu_count()`` / ``override FILE: key (detected 8, os.cpu_count())``."""
    p = caps.provenance.get(key)
    if p is None:
        return "unknown"
    if p.override is not None:
        return f"override {p.override}" + (f" (detected {p.detected})" if p.detected else "")
    return f"plugin {p.plugin}: {p.source}" if p.plugin else p.source


def render_explain(caps: Capabilities) -> list[str]:
    """``resources detect --explain``: every value, and where it came from."""
    h = caps.host
    rows: list[tuple[str, str, str]] = [
        ("cpus", str(h.cpu_count), _from(caps, "host.cpu_count")),
        ("memory", _gb(h.memory_bytes), _from(caps, "host.memory_bytes")),
        ("disk free", _gb(h.disk_free_bytes), _from(caps, "host.disk_free_bytes")),
        ("address", h.address, _from(caps, "host.address")),
        ("python", f"{h.python_version} ({h.python_path})", _from(caps, "host.python_version")),
    ]
    for d in caps.devices:
        facts = [d.name]
        if d.memory_bytes is not None:
            facts.append(f"{_gb(d.memory_bytes)}{' unified' if d.unified_memory else ''}")
        if d.compute_capability:
            facts.append(f"cc={d.compute_capability}")
        if not d.usable:
            facts.append(f"unusable ({d.unusable_reason or 'no reason given'})")
        rows.append((f"device {d.kind}:{d.index}", ", ".join(facts), _from(caps, f"device.{d.kind}:{d.index}")))
    for d in caps.hidden_devices:
        rows.append((f"device {d.kind}:{d.index}", f"hidden ({d.name})", _from(caps, f"device.{d.kind}:{d.index}")))
    for name, version in caps.frameworks.items():
        rows.append((f"framework {name}", version, _from(caps, f"framework.{name}")))
    for key in caps.overrides:  # frameworks an override removed
        if key.startswith("framework.") and key.removeprefix("framework.") not in caps.frameworks:
            rows.append((f"framework {key.removeprefix('framework.')}", "absent", _from(caps, key)))
    rows.append(("backends", ", ".join(caps.distributed_backends) or "none",
                 _from(caps, "backends") if "backends" in caps.provenance else "no probe reported one"))
    width = max(len(r[0]) for r in rows) + 2
    vwidth = min(max(len(r[1]) for r in rows), 40) + 2
    lines = [f"{'VALUE':<{width}}{'':<{vwidth}}FROM"]
    # (a value wider than its column, a long path, keeps two spaces before where it came from)
    lines.extend(f"{label:<{width}}{value:<{max(vwidth, len(value) + 2)}}{source}" for label, value, source in rows)
    for kind, problem in caps.detector_problems.items():
        lines.append(f"{'trouble':<{width}}{kind:<{vwidth}}{problem}")
    for problem in caps.probe_problems:
        lines.append(f"{'trouble':<{width}}{'frameworks':<{vwidth}}{problem}")
    return lines


@resources_app.command("detect")
def detect(
    as_json: bool = typer.Option(False, "--json", help="print the Capabilities record as JSON"),
    python: str | None = typer.Option(
        None, "--python", metavar="PATH", help="the Python that will run jobs (default: this one)"),
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, metavar="S", help="seconds per detector and probe"),
    refresh: bool = typer.Option(False, "--refresh", help="detect afresh: devices and framework probes, not the cached detection"),
    explain: bool = typer.Option(False, "--explain",
                                 help="show where every value came from (plugin and source, or override)"),
) -> None:
    """Show the accelerators, frameworks and host facts a worker here would report."""
    import sys

    from gpulayer import capability_cache
    from gpulayer.resources import detect_stored

    _load_plugins()
    python = existing_program(python)
    if python is not None:
        refuse_a_program_that_is_no_python(python)
    python = python or sys.executable
    caps, entry_id = detect_stored(python=python, timeout=timeout, use_cache=not refresh)
    if as_json:
        typer.echo(caps.model_dump_json(indent=2))
        return
    text = detect_text(caps, explain=explain)
    typer.echo(text, nl=False)
    if not caps.detector_problems and not caps.probe_problems:
        # the light path prints this again while the entry and the host's facts stay so
        # (gpulayer.cli.light); trouble is detected afresh every time instead
        capability_cache.remember_output(python, entry_id, explain=explain, text=text)


def detect_text(caps: Capabilities, *, explain: bool) -> str:
    """What ``resources detect`` (``--explain``) prints, every line ended."""
    text = "".join(f"{line}\n" for line in (render_explain(caps) if explain else render_capabilities(caps)))
    if explain and caps.diagnostics:
        text += "\n" + "".join(f"diagnostic {d}\n" for d in caps.diagnostics)
    return text


@plugins_app.command("list")
def list_plugins(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List plugins: name, status, source distribution and version, hooks implemented."""
    # Listing is how a user finds out what is broken, so it lists even when a plugin
    # GPUlayer cannot do without is broken, and fails afterwards.
    from gpulayer import plugins

    manager = _load_plugins(skip_unknown_disabled=True, strict=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", plugins.PluginWarning)
        infos = manager.list_plugins()  # calls every record hook: a raising one shows as failed
    for w in caught:
        if issubclass(w.category, plugins.PluginWarning):
            typer.echo(f"warning: {w.message}", err=True)
    if as_json:
        typer.echo(json.dumps({
            "plugins": [i.to_dict() for i in infos],
            "unknown_disabled": manager.unknown_disabled,
            "clashes": manager.clashes,
            "conflicts": [str(e) for e in manager.conflicts.values()],
        }, indent=2))
        manager.load()
        for error in manager.conflicts.values():
            raise error
        return
    width = max([len(i.name) for i in infos] + [4])
    sources = [f"{i.distribution} {i.version}" if i.distribution else f"module {i.module}" for i in infos]
    source_width = max([len(s) for s in sources] + [20])
    for info, source in zip(infos, sources, strict=True):
        hooks = ", ".join(h.removeprefix("gpulayer_") for h in info.hooks) or "-"
        typer.echo(f"{info.name:<{width}}  {info.status:<8}  {source:<{source_width}}  {hooks}")
        if info.error:
            typer.echo(f"{'':<{width}}  error: {info.error}")
        if info.status == "failed":
            typer.echo(f"{'':<{width}}  to stop loading it: {plugins.DISABLE_ENV}={info.name}")
    if not infos:
        typer.echo("no plugins installed")
    if manager.unknown_disabled:
        typer.echo(
            f"warning: {plugins.DISABLE_ENV} names no installed plugin: "
            f"{', '.join(manager.unknown_disabled)}",
            err=True,
        )
    manager.load()  # raises the first hard error, with its traceback, after the listing
    for error in manager.conflicts.values():  # (what every command that needs that hook says)
        raise error


@profiles_app.command("list")
def list_profiles(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List runtime profiles and what each fills in."""
    from gpulayer import plugins

    manager = _load_plugins()
    records = plugins.profiles()
    if as_json:
        typer.echo(json.dumps([
            {**p.model_dump(), "plugin": manager.owner("gpulayer_runtime_profiles", name)}
            for name, p in sorted(records.items())
        ], indent=2))
        return
    width = max([len(n) for n in records] + [4])
    for name, p in sorted(records.items()):
        frameworks = ", ".join(f"{k}{v}" for k, v in p.frameworks.items()) or "-"
        typer.echo(f"{name:<{width}}  accelerator={p.accelerator or 'none':<6}  "
                   f"frameworks={frameworks}  ({manager.owner('gpulayer_runtime_profiles', name)})")
    if not records:
        typer.echo("no profiles installed")


def register(app: typer.Typer) -> None:
    app.add_typer(resources_app, name="resources")
    app.add_typer(plugins_app, name="plugins")
    app.add_typer(profiles_app, name="profiles")

