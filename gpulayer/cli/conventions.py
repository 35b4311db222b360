"""What every ``gpulayer`` command shares: exit codes, ``--json`` output, help rendering.

A command module is named in :data:`gpulayer.cli.commands.COMMANDS` and follows these
conventions (docs/cli.md, "Conventions", says the same for people):

* **Exit codes** are the constants below, never bare numbers: 0 done, 2 bad input (any
  :class:`~gpulayer.errors.GpulayerError` that reaches :func:`gpulayer.cli.main`, but
  :class:`~gpulayer.errors.ConnectionFailed`: :data:`EXIT_UNREACHABLE`, and
  :class:`~gpulayer.errors.DatabaseFailed`: :data:`EXIT_FAILED`), and for
  commands that report on a job the job's outcome (:func:`exit_code_for`); a wait that ran
  out before the job ended exits :data:`EXIT_STILL_RUNNING`, never a failure code.
* **``--json``**: every command that prints a result takes :func:`json_option` and prints
  one JSON document on stdout through :func:`echo_json` (a long-running command prints its
  ready record as one line of JSON, then keeps running); messages for people go to stderr.
* **Help**: options show a metavar (``--gpus N``), never a type placeholder such as
  ``<int>``, and flags show none; ``-h`` is ``--help`` everywhere. :func:`prepare` applies
  this to the whole command tree, so a new command only gives a ``metavar=`` where the
  upper-cased option name would read badly.

This module imports nothing heavy (only Typer and the standard library): every command's
``--help`` goes through it.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Any

import typer

from gpulayer.cli import EXIT_READER_LEFT as _EXIT_READER_LEFT
from gpulayer.cli import EXIT_UNREACHABLE as _EXIT_UNREACHABLE

if TYPE_CHECKING:
    from gpulayer.records import JobRecord

#: the command did what was asked (for a job: the job succeeded)
EXIT_OK = 0
#: the job failed without an exit code of its own; or the control plane's database could not
#: store what the command asked (:class:`~gpulayer.errors.DatabaseFailed`: a full disk)
EXIT_FAILED = 1
#: bad input (a flag, a spec, a bundle, an id that names nothing): the message names it
EXIT_BAD_INPUT = 2
#: a wait (``jobs wait --timeout``, ``jobs result --no-wait``) ended before the job did
EXIT_STILL_RUNNING = 75
#: the job timed out
EXIT_TIMED_OUT = 124
#: the job could not be placed (no eligible worker)
EXIT_UNSCHEDULABLE = 125
#: the job's worker was lost and no retry was left
EXIT_LOST = 126
#: the control plane could not be reached; nothing given was wrong, the job (if any) goes on
EXIT_UNREACHABLE = _EXIT_UNREACHABLE
#: the job was cancelled (or Ctrl-C cancelled it)
EXIT_CANCELLED = 130
#: the reader of the command's output left before it was done (``| head -1``)
EXIT_READER_LEFT = _EXIT_READER_LEFT

#: the exit-code table of docs/cli.md, as (code, meaning), for tests and ``--help`` text
EXIT_CODES = (
    ("N", "the job ran: its own exit code (0 on success)"),
    (str(EXIT_FAILED), "the job failed without an exit code of its own; or the control plane's database "
                       "could not store what the command asked (a full disk)"),
    (str(EXIT_BAD_INPUT), "bad input (a flag, a spec, a bundle, a job id): the message names it"),
    (str(EXIT_UNREACHABLE), "the control plane could not be reached (its retries ran out): try again"),
    (str(EXIT_STILL_RUNNING), "still running: the wait ended before the job did (not a failure)"),
    (str(EXIT_TIMED_OUT), "the job timed out"),
    (str(EXIT_UNSCHEDULABLE), "the job could not be placed"),
    (str(EXIT_LOST), "the job's worker was lost and no retry was left"),
    (str(EXIT_CANCELLED), "the job was cancelled"),
    (str(EXIT_READER_LEFT), "the reader of the command's output left (| head -1); the job goes on"),
)


def json_option(help: str = "print JSON") -> Any:
    """The ``--json`` flag, the same on every command."""
    return typer.Option(False, "--json", help=help)


def echo_json(data: Any, *, lines: bool = False) -> None:
    """Print ``data`` (plain data or a pydantic record) as JSON on stdout: indented, or on
    one line with ``lines`` (a ready line, or one record per line of a stream)."""
    import json  # here, not at the top: gpulayer --help goes through this module

    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    typer.echo(json.dumps(data, default=str, indent=None if lines else 2))


# --------------------------------------------------------------------------- job outcomes


def exit_code_for(job: JobRecord) -> int:
    """The exit code a command that waited for ``job`` exits with (``gpulayer submit``'s table)."""
    from gpulayer.records import JobState

    if not job.state.terminal:
        return EXIT_STILL_RUNNING
    if job.state is JobState.SUCCEEDED:
        return EXIT_OK
    if job.state is JobState.UNSCHEDULABLE:
        return EXIT_UNSCHEDULABLE
    if job.state is JobState.TIMED_OUT:
        return EXIT_TIMED_OUT
    if job.state is JobState.CANCELLED:
        return EXIT_CANCELLED
    if job.error and job.error.type == "lost":
        return EXIT_LOST
    if job.exit_code is not None and job.exit_code > 0:
        return job.exit_code
    return EXIT_FAILED


def outcome_text(job: JobRecord) -> str:
    """``job-... cancelled`` or ``job-... failed: exit code 3``: the state once, then what
    the error adds to it (nothing when it only repeats the state)."""
    return job.outcome()


def outcome_record(job: JobRecord) -> dict[str, Any]:
    """A job's outcome as ``--json`` prints it: id, state, exit code of the job and of the
    command, error (type and message) and, for a function job that succeeded, its result."""
    data: dict[str, Any] = {"id": job.id, "state": job.state.value, "exit_code": job.exit_code,
                            "code": exit_code_for(job),
                            "error": None if job.error is None else
                            {"type": job.error.type, "message": job.error.message}}
    if job.spec.kind == "function" and job.state.value == "succeeded":
        data["result"] = job.result
    return data


# --------------------------------------------------------------------------- help


def _metavar(param: Any) -> str:
    """The option's long name in capitals (``--idle-exit IDLE_EXIT``), or the argument's."""
    longs = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    name = (longs[0][2:] if longs else param.name or "value").replace("-", "_").upper()
    return {"JOB_ID": "JOB", "JOB_IDS": "JOB", "WORKER_ID": "WORKER", "TOKEN_ID": "TOKEN"}.get(name, name)


def _no_type(ctx: Any = None) -> None:
    return None


def _usage_name(p: Any) -> Any:
    def name() -> str:
        text = str(p.metavar) if p.required else f"[{p.metavar}]"
        return text + ("..." if p.nargs != 1 else "")

    return name


def prepare(command: Any) -> Any:
    """Apply the help conventions to ``command`` and everything under it (idempotent):
    plain help (Typer's rich panels show ``<bool>`` on flags and cost an import of rich),
    and a metavar on every option that takes a value and every argument."""
    # duck-typed: Typer ships its own copy of click, whose classes are not click's
    seen: set[int] = set()

    def walk(cmd: Any) -> None:
        if id(cmd) in seen:
            return
        seen.add(id(cmd))
        if hasattr(cmd, "rich_markup_mode"):
            cmd.rich_markup_mode = None
        for p in cmd.params:
            if p.param_type_name == "option" and (getattr(p, "is_flag", False) or getattr(p, "count", False)):
                continue
            _say_numbers_plainly(p)
            if p.metavar is None:
                p.metavar = _metavar(p)
            if p.param_type_name == "argument" and hasattr(p, "display_type_rich"):
                # Typer writes an argument as `{job_id} <str>`; we write `JOB` (`[JOB]` if optional)
                p.display_type_rich = _no_type
                p._usage_display_name = _usage_name(p)
        subs = getattr(cmd, "commands", {})
        # the root's lazy commands: only those loaded so far (the rest are prepared as they load)
        for sub in subs.loaded() if hasattr(subs, "loaded") else subs.values():
            walk(sub)

    walk(command)
    return command


def _say_numbers_plainly(param: Any) -> None:
    """A number option's bad value said as our other inputs are: the value as typed and
    what is accepted (Typer's own words were pydantic's: 'Input should be a valid number,
    unable to parse string as a number'). Typer's conversion runs as before."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    kind = {int: int, float: float}.get(annotation) if isinstance(annotation, type) else None
    if kind is None or getattr(param, "_plain_numbers", False) or getattr(param, "multiple", False):
        return
    what = "a whole number" if kind is int else "a number"
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    accepted = what + (f" from {low}" if low is not None else "") + (f" to {high}" if high is not None else "")
    convert = param.process_value

    def process_value(ctx: Any, value: Any) -> Any:
        try:
            return convert(ctx, value)
        except Exception as exc:
            if type(exc).__name__ != "BadParameter" or not isinstance(value, str):
                raise
            try:
                number = kind(value)
                out = (low is not None and number < low) or (high is not None and number > high)
                problem = "out of range" if out else f"not {what}"  # (nan, '٣': Python's yes, pydantic's no)
            except ValueError:
                problem = f"not {what}"
            said: Any = type(exc)
            raise said(f"{value!r}: {problem}; accepted: {accepted}", ctx=ctx, param=param) from None

    param.process_value = process_value
    param._plain_numbers = True


def listening_socket(host: str, port: int, *, flag: str = "--port") -> socket.socket:
    """A socket bound to ``host:port`` and listening, made here rather than by uvicorn so
    that the address printed is the one listening (``--port 0`` works) and a port in use is
    said plainly (exit 2) before anything is created."""
    try:
        family = socket.AF_INET if host == "" else (  # ("": every IPv4 address, as uvicorn took it)
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0])
    except socket.gaierror as exc:
        typer.echo(f"error: --host {host}: not an address of this machine ({exc.strerror})", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if ":" in host else host
        if exc.errno == errno.EADDRNOTAVAIL:  # (another port would not help: the address is not here)
            typer.echo(f"error: --host {host}: not an address of this machine ({exc.strerror}); accepted: an "
                       "address of one of its interfaces, 127.0.0.1 (the default), or 0.0.0.0 for all of them",
                       err=True)
        else:
            typer.echo(f"error: cannot listen on {shown}:{port}: {exc.strerror}; pick another with {flag}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    sock.listen(4096)
    return sock


def existing_program(value: str | None, flag: str = "--python") -> str | None:
    """``value`` of ``flag`` (the Python that runs jobs) if it names a program: a path, or a
    name on ``PATH``; else said, exit 2 (it was taken, and every job failed to start)."""
    import shutil

    if value is not None and shutil.which(value) is None:
        shown = value if value.strip() and value == " ".join(value.split()) else repr(value)  # ('' and spaces seen)
        typer.echo(f"error: {flag} {shown}: no such program; accepted: the path of a Python, or its name on PATH",
                   err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    return value


def refuse_a_program_that_is_no_python(python: str) -> None:
    """``--python`` that runs but is no Python (``/bin/false``, a shell), said, exit 2: a worker
    started, reported "python unknown", and failed every ``python ...`` job with exit code 1;
    ``resources detect`` printed what no worker would report, with the probe's script in its
    diagnostic. One that takes too long to answer is let be (a loaded machine: detection says
    what it finds)."""
    import subprocess

    try:
        proc = subprocess.run([python, "-c", "import sys; print(sys.hexversion)"], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return
    except OSError as exc:
        why = exc.strerror or str(exc)
    else:
        if proc.returncode == 0 and proc.stdout.strip().isdigit():
            return
        said = " ".join(proc.stderr.split())[-200:]
        why = f"exit code {proc.returncode}" + (f": {said}" if said else ", no version printed")
    typer.echo(f"error: --python {python}: not a Python ({why}); accepted: the path of a Python, or its name on "
               "PATH", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)
