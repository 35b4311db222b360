"""``gpulayer worker start | list | status``."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import typer

from gpulayer.cli.commands import help_of
from gpulayer.cli.conventions import (
    EXIT_BAD_INPUT,
    echo_json,
    existing_program,
    json_option,
    refuse_a_program_that_is_no_python,
)
from gpulayer.cli.display import cell, printable
from gpulayer.errors import InvalidInput, NotFound
from gpulayer.units import format_gb

worker_app = typer.Typer(help=help_of("worker"), no_args_is_help=True, rich_markup_mode=None)


def register(app: typer.Typer) -> None:
    app.add_typer(worker_app, name="worker")


@worker_app.command("start")
def worker_start(
    cpu_slots: Optional[int] = typer.Option(None, "--cpu-slots", min=0, max=100_000, metavar="N",
                                            help="CPU-only tasks at once (default: min(4, CPUs))"),
    name: Optional[str] = typer.Option(None, "--name", help="a name to show (default: host name)"),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH", help="the Python that runs jobs (default: this one)"),
    label: list[str] = typer.Option([], "--label", metavar="K=V", help="KEY=VALUE label jobs can require (repeatable)"),
    token: Optional[str] = typer.Option(None, "--token", metavar="JOIN", help="join token (with --url)"),
    grace: float = typer.Option(10.0, "--grace", min=0, metavar="S", help="seconds running tasks get to finish on SIGTERM"),
    idle_exit: Optional[float] = typer.Option(None, "--idle-exit", min=0, metavar="S", help="stop after this many idle seconds"),
    preload: list[str] = typer.Option(
        [], "--preload", metavar="MODULES",
        help="modules to import once, before each FunctionJob's process is forked from them, comma separated "
             "(repeatable; default: $GPULAYER_PRELOAD)"),
    as_json: bool = json_option("once registered, print the worker's record as one line of JSON on stdout"),
    resources: Optional[str] = typer.Option(
        None, "--resources", metavar="FILE",
        help="overrides of detected values (default: $GPULAYER_HOME/resources.toml if it exists)"),
) -> None:
    """Start a worker: embedded (this machine's $GPULAYER_HOME) or, with --url, for a server."""
    import logging
    import signal

    from gpulayer.worker.stop_signals import StopSignals

    # a SIGTERM before the worker serves (during its detection, its join) stops it as soon as it
    # does, drained and deregistered: it killed the process, which left its record online
    asked = StopSignals()
    asked.install(signal.SIGTERM)

    from gpulayer import config
    from gpulayer.resources import detect_capabilities
    from gpulayer.worker.agent import Agent

    if not math.isfinite(grace):
        raise typer.BadParameter(f"'{grace}': not a finite number; accepted: a number of seconds from 0",
                                 param_hint="'--grace'")
    env = config.settings()
    if token is not None and not env.url:  # (it would start an embedded worker, the token unused)
        raise typer.BadParameter("a join token is for a server: give its address too (gpulayer --url URL worker "
                                 "start --token TOKEN, or GPULAYER_URL); without one the worker serves this "
                                 "machine's home and needs no token", param_hint="'--token'")
    logging.basicConfig(level=env.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    labels = {}
    for item in label:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE, with a KEY", param_hint="--label")
        k, v = item.split("=", 1)
        labels[k] = v
    preloads = config.module_names("--preload", ",".join(preload)) if preload else None
    python = existing_program(python)
    if python is not None:
        refuse_a_program_that_is_no_python(python)
    caps = detect_capabilities(python=python, resources_file=resources)
    if labels:
        caps = caps.model_copy(update={"labels": {**caps.labels, **labels}})
    api: Any
    registered = None
    url = env.url
    if url:  # a server: spend the join token, then act with the credential it gives
        from gpulayer.http_client import connect_http

        join = token or env.token
        if not join:
            raise InvalidInput("a worker joins a server with a join token: gpulayer --url URL worker start "
                               "--token TOKEN (create one with 'gpulayer token create --join')")
        # each call keeps retrying through a short outage (every 2 s at most), so the worker
        # is back within moments of its server; the agent's own loops retry beyond that
        api = connect_http(url, ca=env.ca, retry_for=30.0)
        # a machine a provider booted joins as that machine (GPULAYER_MACHINE_ID)
        name = name or env.machine_id
        reply = api.join_worker(caps, join_token=join, name=name, cpu_slots=_slots(cpu_slots, caps), pid=os.getpid(),
                                machine_id=env.machine_id)
        api.token = reply.token
        registered = reply.worker
    else:
        from gpulayer.client import connect

        api = connect().control
    agent = Agent(api, capabilities=caps, registered=registered, name=name, cpu_slots=cpu_slots,
                  python=python, grace=grace, idle_exit=idle_exit, preload=preloads)
    record = agent.start()
    # embedded: command lines on this home are answered by a warm interpreter while this
    # worker runs (gpulayer.cli.warm)
    cli_server = None if url else _start_cli_server()
    typer.echo(f"worker {record.id} ({record.name}) serving {record.target} jobs: "
               f"{len(caps.devices)} device(s), {agent.cpu_slots} CPU slot(s)", err=True)
    if as_json:
        echo_json({"id": record.id, "name": record.name, "target": record.target, "pid": os.getpid(),
                   "devices": [f"{d.kind}:{d.index}" for d in caps.devices], "cpu_slots": agent.cpu_slots},
                  lines=True)
    try:
        agent.run_forever(asked=asked)
    finally:
        if cli_server is not None:
            _stop_cli_server(cli_server)
    if agent.refused is not None:  # (its token revoked: the server let it go)
        typer.echo(f"worker: stopped: the control plane refused its token ({agent.refused})", err=True)
        raise typer.Exit(1)
    typer.echo("worker: stopped", err=True)


#: how long a worker that stops waits for its CLI server to end on SIGTERM before it kills it
CLI_SERVER_GRACE = 5.0


def _stop_cli_server(proc: Any) -> None:
    """End the worker's CLI server: SIGTERM, then SIGKILL if it is still there after
    :data:`CLI_SERVER_GRACE` (a worker that stops must not wait on it for ever)."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(CLI_SERVER_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _start_cli_server() -> Any:
    """The home's CLI server (a process of its own; it dies with this one), or None."""
    import subprocess
    import sys

    from gpulayer import config
    from gpulayer.cli import warm
    from gpulayer.worker.deathsig import die_with_parent

    path = warm.socket_path(str(config.home()))
    if not sys.platform.startswith("linux") or len(os.fsencode(path)) > warm.MAX_SOCKET_PATH or not config.settings().warm_cli:
        return None
    return subprocess.Popen(warm.server_argv(path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with_parent(os.getpid()))


def _slots(cpu_slots: int | None, caps: Any) -> int:
    from gpulayer.worker.agent import default_cpu_slots

    return cpu_slots if cpu_slots is not None else default_cpu_slots(caps)


def _worker_rows(as_json: bool) -> tuple[list[Any], dict[str, Any]]:
    from gpulayer.client import connect

    api = connect().api
    return api.list_workers(), api.worker_usage()


@worker_app.command("list")
def worker_list(as_json: bool = json_option()) -> None:
    """Registered workers, with availability."""
    workers, usage = _worker_rows(as_json)
    if as_json:
        typer.echo(json.dumps([_status(w, usage) for w in workers], indent=2))
        return
    if not workers:
        typer.echo("no workers registered")
        return
    typer.echo(f"{'WORKER':<18}{'NAME':<16}{'TARGET':<8}{'STATE':<9}{'DEVICES':<22}{'CPU SLOTS':<10}")
    for w in workers:
        st = _status(w, usage)
        devs = ", ".join(f"{k} {v['free']}/{v['total']} free" for k, v in st["availability"]["devices"].items()) or "-"
        slots = f"{st['availability']['free_cpu_slots']}/{w.cpu_slots}"
        typer.echo(f"{w.id:<18}{cell(cell(printable(w.name), 15), 16)}{w.target:<8}{st['state']:<9}{devs:<22}{slots:<10}")


def _status(w: Any, usage: dict[str, Any]) -> dict[str, Any]:
    u = usage.get(w.id)
    busy = set(u.busy_devices) if u is not None else set()
    busy_slots = u.busy_cpu_slots if u is not None else 0
    kinds: dict[str, dict[str, int]] = {}
    for d in w.capabilities.devices:
        k = kinds.setdefault(d.kind, {"total": 0, "free": 0})
        k["total"] += 1
        if d.usable and f"{d.kind}:{d.index}" not in busy:
            k["free"] += 1
    state = ("offline" if not w.online else "draining" if w.draining else "paused" if w.paused else "online")
    return {
        "id": w.id, "name": w.name, "origin": w.origin, "target": w.target, "state": state,
        "last_heartbeat": w.last_heartbeat,
        "availability": {"online": w.online, "free_cpu_slots": max(0, w.cpu_slots - busy_slots) if w.online else 0,
                         "devices": kinds, "busy_devices": sorted(busy)},
        "capabilities": json.loads(w.capabilities.model_dump_json()),
        "frameworks": w.capabilities.frameworks,
        # what the worker's site overrode (resources.toml, GPULAYER_OVERRIDE_*), and what
        # its detectors had trouble with: the two things that explain surprising capabilities
        "overrides": w.capabilities.overrides,
        "detector_problems": w.capabilities.detector_problems,
    }


@worker_app.command("status")
def worker_status(
    worker_id: Optional[str] = typer.Argument(None, metavar="WORKER", help="one worker (default: all)"),
    as_json: bool = json_option(),
) -> None:
    """Capabilities (devices, frameworks, host) and availability of workers."""
    workers, usage = _worker_rows(as_json)
    if worker_id is not None:
        workers = [w for w in workers if w.id == worker_id]
        if not workers:
            typer.echo(f"error: worker {worker_id!r}: no such worker", err=True)
            raise typer.Exit(EXIT_BAD_INPUT)
    data = [_status(w, usage) for w in workers]
    if as_json:
        typer.echo(json.dumps(data if worker_id is None else data[0], indent=2))
        return
    if not data:
        typer.echo("no workers registered")
        return
    for w, st in zip(workers, data, strict=True):
        h = w.capabilities.host
        typer.echo(f"worker    {w.id} ({printable(w.name)}) {st['state']}, serves {w.target} jobs")
        typer.echo(f"host      {h.os} {h.arch}, {h.cpu_count} CPUs, {format_gb(h.memory_bytes)} GB RAM, "
                   f"python {h.python_version}, address {h.address}")
        for d in w.capabilities.devices:
            busy = " (busy)" if f"{d.kind}:{d.index}" in st["availability"]["busy_devices"] else ""
            typer.echo(f"device    {d.describe()}{busy}")
        if w.capabilities.frameworks:
            typer.echo("frameworks " + json.dumps(w.capabilities.frameworks))
        typer.echo(f"slots     {st['availability']['free_cpu_slots']}/{w.cpu_slots} CPU slot(s) free")
        typer.echo("")


def _pause(worker_ids: list[str], paused: bool, as_json: bool) -> None:
    from gpulayer.client import connect

    api = connect().api
    done, failed = [], False
    for worker_id in dict.fromkeys(worker_ids):
        try:
            w = api.pause_worker(worker_id, paused=paused)
        except NotFound:
            if any(w.id == worker_id for w in api.list_workers()):  # (a server without the route: its 404)
                raise InvalidInput("the control plane's server is older than gpulayer worker pause and resume; "
                                   "upgrade it") from None
            failed = True
            typer.echo(f"error: worker {worker_id!r}: no such worker (gpulayer worker list names them)", err=True)
            continue
        done.append({"id": w.id, "paused": w.paused, "online": w.online})
        if not as_json:
            typer.echo(f"{w.id} {'paused: it takes no new work' if w.paused else 'resumed'}"
                       + ("" if w.online else " (offline now)"))
    if as_json:
        echo_json(done)
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


@worker_app.command("pause")
def worker_pause(
    worker_ids: list[str] = typer.Argument(..., metavar="WORKER", help="one or more worker ids"),
    as_json: bool = json_option("print one record per worker: id, paused, online"),
) -> None:
    """Pause workers: they take no new work, and what they were handed but had not started
    goes back to the queue; what they run goes on. Jobs only they could run wait (they do not
    fail) until gpulayer worker resume. A pause outlives a worker's restarts."""
    _pause(worker_ids, True, as_json)


@worker_app.command("resume")
def worker_resume(
    worker_ids: list[str] = typer.Argument(..., metavar="WORKER", help="one or more worker ids"),
    as_json: bool = json_option("print one record per worker: id, paused, online"),
) -> None:
    """Resume paused workers: they take work again."""
    _pause(worker_ids, False, as_json)


@worker_app.command("prune")
def worker_prune(
    older_than: Optional[str] = typer.Option(None, "--older-than", metavar="AGE",
                                             help="only workers silent for at least this long, e.g. 1h, 7d"),
    as_json: bool = json_option("print the ids removed as JSON"),
) -> None:
    """Forget offline workers (of any origin); their credentials are revoked."""
    from gpulayer.client import connect
    from gpulayer.units import parse_duration

    try:
        seconds = parse_duration(older_than) if older_than else 0.0
    except InvalidInput as exc:
        raise InvalidInput(f"--older-than {older_than!r}: {str(exc).split(': ', 1)[-1]}") from None
    gone = connect().api.prune_workers(older_than=seconds)
    if as_json:
        echo_json(gone)
        return
    typer.echo(f"removed {len(gone)} offline worker(s)" + (": " + ", ".join(gone) if gone else ""))
