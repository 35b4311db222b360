"""The ``gpulayer`` command line (Typer).

Each command group lives in its own module and is added to :data:`app` here. Global options
(``--url``, ``--token``, ``--ca``, ``--home``) select the control plane for every command;
``--version`` prints the version. What every command shares (exit codes, ``--json``, help
rendering) is in :mod:`gpulayer.cli.conventions`.

Start-up time matters here (``gpulayer --help`` should cost little more than Python's own
start): a command module imports only Typer, the standard library and GPUlayer's light
modules (errors, config, units) at module level, and everything else (records, the
client, the control plane, pydantic) inside the command that needs it.
tests/unit/test_cli_startup.py checks that ``--help`` loads no database or HTTP stack.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import typer
import typer.core

from gpulayer.cli import conventions
from gpulayer.errors import GpulayerError


class _Root(typer.core.TyperGroup):
    """The root group: applies :func:`conventions.prepare` to the tree before it runs, however
    it is run (the ``gpulayer`` script, ``python -m gpulayer.cli``, Typer's CliRunner)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        conventions.prepare(self)
        kwargs.setdefault("prog_name", "gpulayer")
        return super().main(*args, **kwargs)


app = typer.Typer(
    name="gpulayer",
    help="Run jobs on any GPU or CPU machine you have.",
    cls=_Root,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from gpulayer import __version__

        typer.echo(f"gpulayer {__version__}")
        raise typer.Exit(conventions.EXIT_OK)


@app.callback()
def _global(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="print the version and exit"),
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


def _show_plugin_warnings() -> None:
    """A plugin warning met while a command runs (a plugin that failed in a hook) is one
    ``warning:`` line on stderr, not a Python warning with a source line. Matched by name,
    so the CLI's start-up does not import the plugin machinery."""
    import warnings

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: object = None, line: str | None = None) -> None:
        if category.__name__ == "PluginWarning":
            typer.echo(f"warning: {message}", err=True)
            return
        shown(message, category, filename, lineno, file, line)  # type: ignore[arg-type]

    warnings.showwarning = show


def main() -> None:
    _show_plugin_warnings()
    try:
        app()
    except GpulayerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
