"""The ``gpulayer`` command line (Typer).

Each command group lives in its own module, listed with its one-line help in
:mod:`gpulayer.cli.commands` and imported only when one of its commands runs. Global options
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

import atexit
import gc
import os
import sys
from typing import Any, Optional

import typer
import typer.core

from gpulayer.cli import commands, conventions
from gpulayer.errors import GpulayerError


class _Root(typer.core.TyperGroup):
    """The root group: its commands are :class:`commands.LazyCommands` (a command's module
    is imported when it runs), its help lists them from :data:`commands.COMMANDS`, and it
    applies :func:`conventions.prepare` to itself before it runs, however it is run (the
    ``gpulayer`` script, ``python -m gpulayer.cli``, Typer's CliRunner); a command loaded
    later is prepared as it loads."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = commands.LazyCommands(self.commands)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        conventions.prepare(self)
        kwargs.setdefault("prog_name", "gpulayer")
        return super().main(*args, **kwargs)

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # names only (Typer's reads every value)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # the one-line help of each command, without importing its module
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, typer.core.TyperCommand(name=n, help=commands.help_of(n)).get_short_help_str(limit))
                for n in names if n in commands.COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


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


def _at_last() -> None:
    """The last exit handler of a command (registered before any other of its own, so it
    runs after them: the client's wait for the jobs this process submitted comes first).

    It closes the clients (their databases and connection pools), then freezes the
    garbage collector: what the command built (SQLAlchemy's and pydantic's object graphs,
    full of cycles) would otherwise be traversed and freed piece by piece by the
    collections the interpreter runs as it exits, ~20% of the CPU time of a jobs list or
    a submit (bench/cli_startup.py). Frozen, it is left to the end of the process."""
    client = sys.modules.get("gpulayer.client")
    if client is not None:
        client.reset()  # what freeing the engine would do: SQLite checkpoints and drops its WAL
    gc.freeze()


def main() -> None:
    atexit.register(_at_last)
    _show_plugin_warnings()
    try:
        app()
    except GpulayerError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)

