"""The root of the ``gpulayer`` Typer app: the group, its global options and ``--version``.

Imported by :func:`gpulayer.cli.main` when a command is not one the light path answers
(:mod:`gpulayer.cli.light`), and by whoever reads :data:`gpulayer.cli.app`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Optional

import typer
import typer.core

from gpulayer import config
from gpulayer.cli import commands, conventions


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

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:  # (Typer would exit 1, the code of a job that failed)
            from gpulayer.cli import reader_left

            reader_left(exc)

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
    ca: Optional[str] = typer.Option(None, "--ca", metavar="FILE|sha256:PIN",
                                     help="CA bundle or certificate to trust, or the server's certificate "
                                          "fingerprint (default: $GPULAYER_CA)"),
    home: Optional[str] = typer.Option(None, "--home", help="state directory (default: $GPULAYER_HOME, ~/.gpulayer)"),
) -> None:
    # Options become the environment so that every layer (client, worker, SDK) agrees.
    config.check_connection_flags(url, token, ca)
    if url is not None:
        os.environ["GPULAYER_URL"] = url
    if token is not None:
        os.environ["GPULAYER_TOKEN"] = token
    if ca is not None:
        os.environ["GPULAYER_CA"] = ca
    if home is not None:
        os.environ["GPULAYER_HOME"] = home
        config.home_flag = home


_command: Any = None


def command() -> Any:
    """:data:`app` as its click group, converted once per process: what :func:`gpulayer.cli.main`
    runs (Typer's ``app()`` converts it again on every call). A CLI server converts it, and
    loads the commands it answers, before it forks (:mod:`gpulayer.cli.warm`)."""
    global _command
    if _command is None:
        _command = typer.main.get_command(app)
    return _command


def warm_up(names: Iterable[str]) -> None:
    """Load the top-level commands ``names`` into :func:`command` and build the value
    coercion of each of their parameters and of the global options, which Typer builds on
    a parameter's first use, every run (a pydantic TypeAdapter each: ~0.3 ms apiece). For a
    CLI server, before it forks."""
    group = command()
    todo = [group, *(group.commands[n] for n in names)]
    while todo:
        cmd = todo.pop()
        for param in cmd.params:
            build = getattr(param, "get_runtime_param", None)  # (Typer's parameters)
            if build is not None:
                build()
        if cmd is not group:  # (the root's own commands load on first read: only those named)
            todo.extend(getattr(cmd, "commands", {}).values())
