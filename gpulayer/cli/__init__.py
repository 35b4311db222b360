"""The ``gpulayer`` command line (Typer).

Each command group lives in its own module, listed with its one-line help in
:mod:`gpulayer.cli.commands` and imported only when one of its commands runs. Global options
(``--url``, ``--token``, ``--ca``, ``--home``) select the control plane for every command;
``--version`` prints the version. What every command shares (exit codes, ``--json``, help
rendering) is in :mod:`gpulayer.cli.conventions`; the root group and its global options are
in :mod:`gpulayer.cli.root` (:data:`app` here is that app, imported on first use).

Start-up time matters here (``gpulayer --help`` should cost little more than Python's own
start): a command module imports only Typer, the standard library and GPUlayer's light
modules (errors, config, units) at module level, and everything else (records, the
client, the control plane, pydantic) inside the command that needs it. Before any of that,
:func:`main` hands the few pure reads it can answer without Typer, pydantic or SQLAlchemy
(``jobs list`` on the embedded database) to :mod:`gpulayer.cli.light`, which prints the same
bytes; then, where a local worker runs a CLI server, it hands ``submit``, ``explain``,
``jobs`` and ``bundle`` command lines to that warm interpreter (:mod:`gpulayer.cli.warm`).
tests/unit/test_cli_startup.py checks what each of these loads.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from gpulayer.errors import GpulayerError

if TYPE_CHECKING:
    import typer

    app: typer.Typer


def __getattr__(name: str) -> Any:
    if name == "app":  # the Typer app: Typer is imported only when a command needs it
        from gpulayer.cli.root import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _show_plugin_warnings() -> None:
    """A plugin warning met while a command runs (a plugin that failed in a hook) is one
    ``warning:`` line on stderr, not a Python warning with a source line. Matched by name,
    so the CLI's start-up does not import the plugin machinery."""
    import warnings

    import typer

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


#: what a command exits with when the control plane could not be reached (connection
#: refused, TLS handshake, HTTP 502/503/504) once its retries ran out: sysexits' EX_UNAVAILABLE.
#: Not 2: nothing the command was given is wrong (a job's wait or submit may be tried again).
EXIT_UNREACHABLE = 69

#: what a command exits with when the reader of its output left before it was done
#: (``gpulayer jobs logs JOB | head -1``): 128 + SIGPIPE, what a shell reports for a filter
#: such as ``cat`` that the same broken pipe ended
EXIT_READER_LEFT = 141


def _reader_gone(fd: int) -> bool:
    """Whether ``fd`` is a pipe or socket whose reading end is closed."""
    import select

    try:
        poll = select.poll()
        poll.register(fd, 0)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


def reader_left(exc: BrokenPipeError) -> NoReturn:
    """End the command as a Unix filter ends when its reader leaves: quietly, with
    :data:`EXIT_READER_LEFT`. Typer said nothing and exited 1, which the exit-code table
    reads as a job that failed; the light path printed a traceback. A broken pipe that is
    not one of our standard streams' (a socket) is raised on as it was.

    The stream is pointed at ``/dev/null`` first, so that what is still buffered for it,
    and any later write (an exit handler's), goes nowhere instead of failing again."""
    gone = [fd for fd in (1, 2) if _reader_gone(fd)]
    if not gone:
        raise exc
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in gone:
        os.dup2(devnull, fd)
    os.close(devnull)
    raise SystemExit(EXIT_READER_LEFT)


def _text_out() -> None:
    """Standard streams that can write whatever a command prints (a job's output, names,
    paths), as Click's ``echo`` already wrote most of it: under an ASCII locale (``LC_ALL=C``
    with ``PYTHONUTF8=0``, ``PYTHONIOENCODING=ascii``) as UTF-8, Python's own choice in the C
    locale; under another encoding that cannot write every character (``latin-1``) a
    character it cannot as its escape (``\\u8bad``). The light path's ``jobs list`` and
    ``jobs logs`` and ``submit``'s stream of the job's output ended in UnicodeEncodeError."""
    import codecs

    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # (None: a closed stream; a replaced one)
        try:
            name = codecs.lookup(stream.encoding).name
        except (AttributeError, LookupError, TypeError):
            continue
        if reconfigure is None:
            continue
        if name == "ascii":  # (surrogateescape: an argument's bytes, written back as they came)
            reconfigure(encoding="utf-8", errors="surrogateescape" if stream.errors == "surrogateescape"
                        else "backslashreplace")
        elif stream.errors == "strict" or not name.startswith("utf-"):
            reconfigure(errors="backslashreplace")


def main() -> None:
    atexit.register(_at_last)
    _text_out()
    try:
        from gpulayer.cli import light

        if light.answer(sys.argv[1:]):
            return
        from gpulayer.cli import warm

        code = warm.forward(sys.argv[1:])
        if code is not None:  # a local worker's CLI server ran it
            sys.exit(code)
        from gpulayer.cli.root import command

        _show_plugin_warnings()
        command()()
    except GpulayerError as exc:
        import typer

        from gpulayer.errors import ConnectionFailed, DatabaseFailed

        typer.echo(f"error: {exc}", err=True)
        # (the control plane could not store it now, a full disk: no fault of the input)
        sys.exit(EXIT_UNREACHABLE if isinstance(exc, ConnectionFailed) else 1 if isinstance(exc, DatabaseFailed)
                 else 2)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError as exc:  # (the light path's; the full path's: gpulayer.cli.root)
        reader_left(exc)
    except Exception as exc:
        # the database of the embedded control plane failed under the command (a full disk:
        # "database or disk is full"): said in one line, not as SQLAlchemy's traceback
        db_errors = sys.modules.get("sqlalchemy.exc")
        if db_errors is None or not isinstance(exc, db_errors.OperationalError):
            raise
        import typer

        typer.echo(f"error: the control plane's database failed: {exc.orig}", err=True)
        sys.exit(1)

