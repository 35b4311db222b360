"""``gpulayer dashboard``: the web dashboard over the embedded control plane, on loopback.

The embedded control plane has no tokens, so this command makes a login token of its own
for each run, prints it once and keeps it in memory only (see
:class:`gpulayer.server.dashboard.sessions.Login`). A self-hosted server serves the same
dashboard at its own ``/``, behind its tokens.
"""

from __future__ import annotations

from typing import Any

import typer

from gpulayer import config
from gpulayer.cli.commands import help_of
from gpulayer.cli.conventions import EXIT_BAD_INPUT, echo_json, json_option, listening_socket

#: the dashboard's default port (the server's is 8765)
DEFAULT_PORT = 8766
#: worker threads for the control-plane calls of a few browser tabs
THREADS = 16
#: seconds between looks at the database: every change here is made by another process
#: (the CLI, the SDK, a worker), which wakes nobody in this one
RECHECK = 1.0


def register(app: typer.Typer) -> None:
    app.command("dashboard", help=f"{help_of('dashboard')}\n\n{_MORE}")(dashboard)


_MORE = ("It shows the jobs and workers of $GPULAYER_HOME; log in with the token it prints. A "
         "server (gpulayer server start) serves its own dashboard at its URL.")


def dashboard(
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535, help="port on 127.0.0.1 (0: any free one)"),
    log_level: str = typer.Option("warning", "--log-level", metavar="LEVEL", help="uvicorn log level"),
    as_json: bool = json_option("once listening, print url, token and home as one line of JSON on stdout"),
) -> None:
    # its help: help_of("dashboard") and _MORE
    import logging

    import uvicorn

    from gpulayer.control import ControlPlane
    from gpulayer.server.app import create_app
    from gpulayer.server.dashboard import DashboardOptions
    from gpulayer.server.dashboard.sessions import new_run_token
    from gpulayer.server.protocol import BoundedHttpToolsProtocol
    from gpulayer.store import Store

    if log_level.lower() not in uvicorn.config.LOG_LEVELS:  # (uvicorn's KeyError, once the token was out)
        raise typer.BadParameter(f"{log_level!r}: accepted: {', '.join(uvicorn.config.LOG_LEVELS)}",
                                 param_hint="--log-level")
    settings = config.settings()
    if settings.url:
        typer.echo(f"error: GPULAYER_URL is {settings.url}: that server serves its own dashboard at "
                   f"{settings.url.rstrip('/')}/ (log in with an admin or client token). 'gpulayer dashboard' "
                   "shows the embedded control plane; unset GPULAYER_URL (or drop --url) for it.", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sock = listening_socket("127.0.0.1", port)
    bound = sock.getsockname()[1]
    store = Store(settings.database_url)
    token = new_run_token()
    app = create_app(ControlPlane(store, results_as_text=True), background=False, threads=THREADS,
                     dashboard=DashboardOptions(run_token=token, recheck=RECHECK))
    config_kw: dict[str, Any] = {"log_level": log_level.lower(), "access_log": False, "lifespan": "on",
                                 "timeout_graceful_shutdown": 5, "http": BoundedHttpToolsProtocol}
    uv = uvicorn.Server(uvicorn.Config(app, **config_kw))
    orig_exit = uv.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        app.state.server.begin_shutdown()  # live streams end now instead of holding the exit
        orig_exit(sig, frame)

    uv.handle_exit = handle_exit  # type: ignore[method-assign]
    typer.echo(f"gpulayer dashboard on http://127.0.0.1:{bound}/ (embedded control plane, {config.home()})", err=True)
    typer.echo("log in with this token (good until this command stops; it is not stored anywhere):", err=True)
    typer.echo(f"  {token}", err=True)
    if as_json:
        echo_json({"url": f"http://127.0.0.1:{bound}/", "token": token, "home": str(config.home())}, lines=True)
    try:
        uv.run(sockets=[sock])  # after a graceful stop uvicorn raises the signal again: SIGTERM ends us
    finally:
        sock.close()
