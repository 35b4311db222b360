"""``gpulayer providers list | offers`` and ``gpulayer machines list | terminate``: the cloud target."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import typer

from gpulayer.cli.commands import help_of
from gpulayer.cli.conventions import echo_json, json_option

providers_app = typer.Typer(help=help_of("providers"), no_args_is_help=True)
machines_app = typer.Typer(help=help_of("machines"), no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(providers_app, name="providers")
    app.add_typer(machines_app, name="machines")


#: what ``providers list`` and ``offers`` add on an embedded control plane, where a
#: providers.toml in $GPULAYER_HOME configures nothing
EMBEDDED_NOTE = ("this control plane is embedded (no GPULAYER_URL): providers.toml is read, and machines "
                 "brought up, only by 'gpulayer server start'; set GPULAYER_URL and GPULAYER_TOKEN to "
                 "see a server's providers (docs/providers.md)")
#: how long ``machines terminate`` waits for the machine to end, seconds
TERMINATE_WAIT = 60.0


def _api() -> Any:
    from gpulayer.client import connect

    return connect().api


def _embedded() -> bool:
    from gpulayer.client import connect

    return connect().embedded


def _price(p: float | None) -> str:
    return "owned" if p is None else f"${p:.2f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@providers_app.command("list")
def providers_list(as_json: bool = json_option()) -> None:
    """Providers: configured?, credentials ok?, machines running, why one is disabled."""
    rows = _api().list_providers()
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return
    embedded = _embedded()
    if not rows:
        typer.echo("no provider adapters installed and none configured (see docs/providers.md)")
        if embedded:
            typer.echo(EMBEDDED_NOTE)
        return
    unconfigured = "installed" if embedded else "no section in providers.toml"
    typer.echo(f"{'NAME':<16}{'TYPE':<15}{'PLUGIN':<22}{'CONFIGURED':<11}{'CREDENTIALS':<12}{'MACHINES':<10}STATUS")
    for r in rows:
        cred = "-" if not r.configured else {True: "ok", False: "failed", None: "unchecked"}[r.credentials_ok]
        machines = f"{r.machines_running}/{r.max_machines}" if r.configured else "-"
        status = r.disabled or (f"last error: {r.last_error}" if r.last_error else ("in use" if r.configured else
                                                                                       unconfigured))
        typer.echo(f"{r.name[:15]:<16}{r.type[:14]:<15}{r.plugin[:21]:<22}{'yes' if r.configured else 'no':<11}"
                   f"{cred:<12}{machines:<10}{status}")
    if embedded:
        typer.echo(EMBEDDED_NOTE)


@providers_app.command("offers")
def providers_offers(
    accelerator: Optional[str] = typer.Option(None, "--accelerator", metavar="KIND", help="cuda, rocm, mps, ... or cpu"),
    gpus: Optional[int] = typer.Option(None, "--gpus", metavar="N", help="devices per machine"),
    gpu_memory: Optional[float] = typer.Option(None, "--min-gpu-memory", metavar="GB", help="GB per device, at least"),
    cpus: Optional[int] = typer.Option(None, "--cpus", metavar="N", help="CPUs, at least"),
    memory: Optional[float] = typer.Option(None, "--memory", metavar="GB", help="GB of RAM, at least"),
    as_json: bool = json_option(),
) -> None:
    """Every provider offer that fits, cheapest first: provider, shape, region, price/h, availability."""
    from gpulayer.joboptions import CLI_SPELLING, check_device_options
    from gpulayer.specs import Requirements
    from gpulayer.wording import Spelling, build

    raw: dict[str, Any] = {"accelerator": accelerator, "gpus": gpus, "min_gpu_memory_gb": gpu_memory,
                           "cpus": cpus, "memory_gb": memory}
    prefix = "requirements."
    spelling = Spelling(names={k[len(prefix):]: v for k, v in CLI_SPELLING.names.items() if k.startswith(prefix)})
    req = build(Requirements, {k: v for k, v in raw.items() if v is not None}, spelling)
    check_device_options(req, raw, CLI_SPELLING)
    rows = _api().offers(req)
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return
    if not rows:
        typer.echo(EMBEDDED_NOTE if _embedded() else
                   "no provider offered a machine that fits (gpulayer providers list shows the providers)")
        return
    typer.echo(f"{'PROVIDER':<16}{'SHAPE':<22}{'REGION':<16}{'PRICE/H':<10}{'SPOT':<6}{'DEVICES':<22}AVAILABILITY")
    for o in rows:
        kinds: dict[str, int] = {}
        for d in o.capabilities.devices:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        devs = ", ".join(f"{n} {k}" for k, n in kinds.items()) or "-"
        typer.echo(f"{o.provider[:15]:<16}{o.shape[:21]:<22}{(o.region or '-')[:15]:<16}{_price(o.price_per_hour):<10}"
                   f"{'yes' if o.spot else 'no':<6}{devs[:21]:<22}{o.availability}")


@machines_app.command("list")
def machines_list(
    all_: bool = typer.Option(False, "--all", help="ended machines too"),
    as_json: bool = json_option(),
) -> None:
    """Machines: id, provider, shape, state, worker, idle for, cost so far."""
    rows = _api().list_machines()
    if not all_:
        rows = [m for m in rows if m.state not in ("terminated", "failed")]
    if as_json:
        typer.echo(json.dumps([m.model_dump(mode="json") for m in rows], indent=2))
        return
    if not rows:
        typer.echo("no machines" + ("" if all_ else " running (--all shows ended ones)"))
        return
    now = time.time()
    typer.echo(f"{'MACHINE':<16}{'PROVIDER':<14}{'SHAPE':<20}{'STATE':<12}{'WORKER':<18}{'IDLE FOR':<9}{'COST':<9}REASON")
    for m in rows:
        idle = _duration(now - m.idle_since) if m.state == "idle" and m.idle_since else "-"
        cost = "owned" if m.price_per_hour is None else f"${m.cost or 0:.2f}"
        typer.echo(f"{m.id:<16}{m.provider[:13]:<14}{m.shape[:19]:<20}{m.state:<12}{m.worker_id or '-':<18}"
                   f"{idle:<9}{cost:<9}{m.reason}")


@machines_app.command("terminate")
def machines_terminate(machine_id: str = typer.Argument(..., metavar="MACHINE", help="machine id (m-...)"),
                       as_json: bool = json_option("print the machine's record as JSON")) -> None:
    """Drain a machine's worker and terminate the machine (waits up to a minute for the provider)."""
    api = _api()
    m = api.terminate_machine(machine_id)
    deadline = time.monotonic() + TERMINATE_WAIT
    while m.state == "terminating" and time.monotonic() < deadline:
        time.sleep(0.5)
        m = next((x for x in api.list_machines() if x.id == machine_id), m)
    if as_json:
        echo_json(m)
    else:
        typer.echo(f"{m.id} {m.state}" + (f" ({m.reason})" if m.reason else ""))
    if m.state == "terminating":  # the provider's terminate failed (or takes longer): say why, not done
        p = next((p for p in api.list_providers() if p.name == m.provider), None)
        why = (p.last_error or p.disabled) if p is not None else None
        typer.echo(f"error: {m.id} is still terminating after {TERMINATE_WAIT:g} s"
                   + (f": provider {m.provider!r}: {why}" if why else "")
                   + "; the server calls the provider again every 30 s, or at once when this command is run again "
                   "(gpulayer machines list shows when it ends)",
                   err=True)
        raise typer.Exit(1)
