"""The light path: commands answered before Typer, pydantic or SQLAlchemy are imported.

A pure read such as ``gpulayer jobs list`` on the embedded database costs a few
milliseconds of work, but the full path pays for Typer (which coerces every option value
through pydantic), the records and the control plane with SQLAlchemy first: 20x Python's own
start-up. :func:`answer` recognises the command lines it can answer exactly as the full path
would (the same bytes on stdout, the same exit code) and answers them from
:mod:`gpulayer.embedded_reads`; for every other command line, and whenever the read is
:class:`~gpulayer.embedded_reads.Unanswerable` (no database yet, a schema to migrate, a
server configured, a worker to expire first), it returns ``False`` and the full path runs.

Recognised: the global options ``--url``, ``--token``, ``--ca``, ``--home`` (``--url``
sends every command to the full path), then ``jobs list`` with ``--state S``, ``--limit N``
and ``--json``, ``jobs logs JOB`` with ``--node R`` and ``--tail N``, or ``resources detect`` with
``--python PATH`` and ``--explain``, each as ``--opt VALUE`` or ``--opt=VALUE``.
``resources detect`` prints the text the full path
printed last from the current capability cache entry, kept in that entry with the host
facts it showed (:mod:`gpulayer.capability_key`): an entry under an hour old, for this
interpreter, its ``sys.path``, the same plugins (loaded without a warning), the same
overrides and host facts. Anything else (help, a value
the full path would refuse, an unknown option) goes to the full path, which words the
error. The text ``jobs list`` prints is written here, for both paths (:func:`job_table`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["answer", "job_summary", "job_table"]

#: the root group's options that take a value, and the variable each becomes
#: how many jobs ``jobs list`` shows without ``--limit``
LIST_LIMIT = 50
GLOBAL_OPTIONS = {"--url": "GPULAYER_URL", "--token": "GPULAYER_TOKEN", "--ca": "GPULAYER_CA", "--home": "GPULAYER_HOME"}


def _options(argv: Sequence[str], i: int, valued: Iterable[str], flags: Iterable[str]) -> tuple[dict[str, Any], int] | None:
    """The options from ``argv[i]`` on, until the first word that is not one, and where it
    is; None for anything this parser does not know (the full path reads it). A later
    option wins, as in click."""
    valued, flags = set(valued), set(flags)
    found: dict[str, Any] = {}
    while i < len(argv) and argv[i].startswith("-"):
        word = argv[i]
        name, eq, value = word.partition("=")
        if name in valued:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                value = argv[i + 1]
                i += 1
            if value.startswith("-"):
                return None  # click would take it as the value; rare enough to leave to it
            found[name] = value
        elif word in flags:
            found[word] = True
        else:
            return None
        i += 1
    return found, i


def _jobs_list(argv: Sequence[str]) -> dict[str, Any] | None:
    """What a ``jobs list`` command line this path can answer asks for (the variables its
    global options set, the state, the limit, JSON or not), else None."""
    parsed = _options(argv, 0, GLOBAL_OPTIONS, ())
    if parsed is None:
        return None
    glob, i = parsed
    if list(argv[i:i + 2]) != ["jobs", "list"]:
        return None
    parsed = _options(argv, i + 2, ("--state", "--limit"), ("--json",))
    if parsed is None or parsed[1] != len(argv):
        return None
    opts = parsed[0]
    limit = opts.get("--limit", str(LIST_LIMIT))
    if not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= 1000):
        return None  # the full path says what --limit accepts
    if "--url" in glob:
        return None
    return {"env": {GLOBAL_OPTIONS[k]: v for k, v in glob.items()}, "state": opts.get("--state"),
            "limit": int(limit), "json": bool(opts.get("--json"))}


def _command(argv: Sequence[str], words: tuple[str, str]) -> tuple[dict[str, str], int] | None:
    """The variables the global options before the command ``words`` set, and where the
    command's own arguments start; None for another command, or one sent to a server
    (``--url``: the full path)."""
    parsed = _options(argv, 0, GLOBAL_OPTIONS, ())
    if parsed is None or "--url" in parsed[0]:
        return None
    glob, i = parsed
    if tuple(argv[i:i + 2]) != words:
        return None
    return {GLOBAL_OPTIONS[k]: v for k, v in glob.items()}, i + 2


def _resources_detect(argv: Sequence[str]) -> dict[str, Any] | None:
    """What a ``resources detect`` command line this path can answer asks for (the
    variables its global options set, the Python, ``--explain`` or not), else None.
    ``--json`` (it shows free disk to the byte), ``--timeout`` and ``--refresh`` (which
    detect afresh) go to the full path."""
    command = _command(argv, ("resources", "detect"))
    if command is None:
        return None
    env, i = command
    parsed = _options(argv, i, ("--python",), ("--explain",))
    if parsed is None or parsed[1] != len(argv):
        return None
    opts = parsed[0]
    return {"env": env, "python": opts.get("--python") or sys.executable,
            "explain": bool(opts.get("--explain"))}


def _detect(argv: Sequence[str]) -> bool:
    """``resources detect`` from the capability cache: the text the full path printed from
    the current entry (:func:`gpulayer.capability_key.cached_output`), or False."""
    request = _resources_detect(argv)
    if request is None:
        return False
    from gpulayer import capability_key

    os.environ.update(request["env"])
    text = capability_key.cached_output(request["python"], explain=request["explain"])
    if text is None:
        return False
    sys.stdout.write(text)
    sys.stdout.flush()
    return True


def _jobs_logs(argv: Sequence[str]) -> dict[str, Any] | None:
    """What a ``jobs logs JOB`` command line this path can answer asks for (the variables
    its global options set, the job, ``--node``, ``--tail``), else None. ``--follow`` (it
    waits for the job's end and exits with its outcome) goes to the full path."""
    command = _command(argv, ("jobs", "logs"))
    if command is None:
        return None
    env, i = command
    valued = ("--node", "--tail", "-n")
    before = _options(argv, i, valued, ())  # (click takes options before and after JOB)
    if before is None or before[1] >= len(argv):
        return None
    job_id = argv[before[1]]
    after = _options(argv, before[1] + 1, valued, ())
    if after is None or after[1] != len(argv):
        return None
    opts = {**before[0], **after[0]}
    if ("--tail" in opts and "-n" in opts) or any(w.startswith("-n=") for w in argv[i:]):
        return None  # (click keeps the later of the two; and takes "-n=5"'s value as "=5")
    node, tail = opts.get("--node"), opts.get("--tail", opts.get("-n"))
    if any(v is not None and not (v.isascii() and v.isdigit()) for v in (node, tail)):
        return None  # the full path says what --node and --tail accept
    from gpulayer.logtail import MAX_TAIL

    if tail is not None and int(tail) > MAX_TAIL:
        return None
    return {"env": env, "job": job_id, "node": None if node is None else int(node),
            "tail": None if tail is None else int(tail)}


def _logs(request: dict[str, Any]) -> bool:
    """``jobs logs JOB``: the job's output as the full path prints it (stdout's chunks on
    stdout, stderr's on stderr, ``[node R]`` prefixes for a job of several nodes), read
    with :func:`gpulayer.embedded_reads.job_logs`; or False, having printed nothing."""
    import sqlite3

    from gpulayer import embedded_reads, logtext

    os.environ.update(request["env"])
    node = request["node"]
    try:
        with embedded_reads.reading(embedded_reads.database()) as conn:
            (kind, nodes), chunks = embedded_reads.job_logs(conn, request["job"], node, request["tail"])
            if logtext.node_refused(kind, nodes, node) is not None:
                return False  # the full path says so
            lines = logtext.NodeLines(logtext.prefixes_nodes(kind, nodes, node))
            try:
                for node_rank, stream, data in chunks:
                    out = sys.stderr if stream == "stderr" else sys.stdout
                    out.write(lines.text(data, node_rank, stream))
                for stream, rest in lines.rest():
                    (sys.stderr if stream == "stderr" else sys.stdout).write(rest)
            except sqlite3.Error as exc:  # after the first page: what it printed stays printed
                sys.stdout.flush()
                sys.stderr.write(f"error: could not read the rest of job {request['job']}'s output: {exc}\n")
                sys.exit(1)
    except (embedded_reads.Unanswerable, sqlite3.Error):  # (before any output) the full path says what is wrong
        return False
    sys.stdout.flush()
    return True


def answer(argv: Sequence[str]) -> bool:
    """Answer ``argv`` (the words after ``gpulayer``) and return True, or return False
    having printed nothing and changed nothing (the full path runs)."""
    # (the global options become variables here as on the full path; left set for it, a bad
    # --token or --ca would be refused as the variable it became, not as the flag typed)
    before = {name: os.environ.get(name) for name in GLOBAL_OPTIONS.values()}
    if _answer(argv):
        return True
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return False


def _answer(argv: Sequence[str]) -> bool:
    request = _jobs_list(argv)
    if request is None:
        logs = _jobs_logs(argv)
        return _logs(logs) if logs is not None else _detect(argv)
    import sqlite3

    from gpulayer import embedded_reads

    os.environ.update(request["env"])  # what the root group's options do on the full path
    try:
        with embedded_reads.reading(embedded_reads.database()) as conn:
            lines = embedded_reads.job_lines(conn, state=request["state"], limit=request["limit"])
    except (embedded_reads.Unanswerable, sqlite3.Error):  # the full path says what is wrong
        return False
    summaries = [job_summary(*line) for line in lines]
    text = json_text(summaries) if request["json"] else "\n".join(job_table(
        summaries, time.time(), limit=request["limit"], state=request["state"]))
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return True


# --------------------------------------------------------------------------- jobs list's text


def job_summary(job_id: str, state: str, kind: str, name: str, what: str, attempt: int,
                created_at: float) -> dict[str, Any]:
    """One job of ``jobs list --json`` (and the facts of its table row)."""
    return {"id": job_id, "state": state, "kind": kind, "name": name, "what": what, "attempt": attempt,
            "created_at": created_at}


def json_text(data: Any) -> str:
    """:func:`gpulayer.cli.conventions.echo_json`'s text for plain data."""
    import json  # here: every command line, --help included, comes through this module

    return json.dumps(data, default=str, indent=2)


def age(seconds: float) -> str:
    """How long ago, shortly; a time ahead of this clock (its wall clock stepped back since) is
    no time ago, as the dashboard shows it."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def job_table(summaries: Sequence[dict[str, Any]], now: float, *, limit: int, state: str | None = None) -> list[str]:
    """The lines of ``jobs list``: a header and a row per job, or ``no jobs``; a full page
    (``limit`` jobs) ends with how to list the older ones (a cursor, as kubectl's
    ``--continue``: a page was the newest jobs alone, with no sign that more were left out)."""
    from gpulayer.cli.display import printable

    if not summaries:
        return ["no jobs"]
    lines = [f"{'JOB':<18}{'STATE':<15}{'KIND':<12}{'AGE':>8}  WHAT"]
    for s in summaries:
        what = printable(s["what"])
        lines.append(f"{s['id']:<18}{s['state']:<15}{s['kind']:<12}{age(now - s['created_at']):>8}  {what[:60]}")
    if len(summaries) >= limit:
        again = "".join(f" {flag} {value}" for flag, value in (("--state", state), ("--limit", limit)) if value
                        and (flag != "--limit" or value != LIST_LIMIT))
        lines.append(f"({limit} shown; older ones: gpulayer jobs list{again} --before {summaries[-1]['id']})")
    return lines
