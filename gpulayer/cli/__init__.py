"""The ``gpulayer`` command line (Typer).

Each command group lives in its own module and is added to :data:`app` here. Global options
(``--url``, ``--token``, ``--ca``, ``--home``) select the control plane for every command.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer

from gpulayer.errors import GpulayerError

app = typer.Typer(
    name="gpulayer",
    help="Run jobs on any GPU or CPU machine you have.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _global(
    url: Optional[str] = typer.Option(None, "--url", help="control plane URL (default: $GPULAYER_URL, else embedded)"),
    token: Optional[str] = typer.Option(None, "--token", help="API token (default: $GPULAYER_TOKEN)"),
    ca: Optional[str] = typer.Option(None, "--ca", help="CA bundle or certificate to trust (default: $GPULAYER_CA)"),
    home: Optional[str] = typer.Option(None, "--home", help="state directory (default: $GPULAYER_HOME, ~/.gpulayer)"),
) -> None:
    # Options become the environment so that every layer (client, worker, SDK) agrees.
    if url is not None:
        os.environ["GPULAYER_URL"] = url
    if token is not None:
        os.environ["GPULAYER_TOKEN"] = token
    if ca is not None:
        os.environ["GPULAYER_CA"] = ca
    if home is not None:
        os.environ["GPULAYER_HOME"] = home


def _add_groups() -> None:
    from gpulayer.cli import resources

    resources.register(app)
    for modname in ("bundle", "jobs", "explain", "worker", "server", "token", "dashboard", "machines"):
        try:
            mod = __import__(f"gpulayer.cli.{modname}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"gpulayer.cli.{modname}":
                raise
            continue
        mod.register(app)


_add_groups()


def main() -> None:
    try:
        app()
    except GpulayerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
