"""``gpulayer explain [submit options] -- COMMAND`` and ``gpulayer jobs explain JOB``.

``gpulayer explain`` takes ``gpulayer submit``'s options, the same definitions (its
signature is ``submit``'s, less the flags that say what to do with a job: ``--detach``
and ``--dry-run``), builds the spec with the same builder, and submits nothing.

Exit codes: 0 when some worker (or provider offer) could run the job, now or after a
wait; 125 when none could (what ``gpulayer submit`` would exit with); 2 for bad input.
"""

from __future__ import annotations

import inspect
import re
import shlex
import sys
from typing import TYPE_CHECKING, Any

import typer

from gpulayer.cli import jobs
from gpulayer.cli.commands import help_of
from gpulayer.errors import InvalidInput

if TYPE_CHECKING:
    from gpulayer.client import Client
    from gpulayer.records import Explanation
    from gpulayer.specs import JobSpec

EXIT_UNSCHEDULABLE = jobs.EXIT_UNSCHEDULABLE


def _show(e: Explanation, as_json: bool, command: str | None) -> None:
    from gpulayer.explanations import render

    if as_json:
        typer.echo(e.model_dump_json(indent=2))
    else:
        typer.echo(render(e, jobs.SUBMIT_SPELLING, command=command))
    if e.decision.outcome == "unschedulable":
        raise typer.Exit(EXIT_UNSCHEDULABLE)


def command_line(argv: list[str] | None = None) -> str:
    """This command line as ``gpulayer explain`` would take it: ``submit`` -> ``explain``,
    without the flags explain does not take, ``--dry-run``, ``--detach`` and ``--artifacts DIR`` (for ``submit
    --dry-run`` to say what to run next). The words after ``--`` are the job's, as given."""
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    head, tail = args[:end], args[end:]
    if "submit" in head:
        head[head.index("submit")] = "explain"
    kept: list[str] = []
    for a in head:
        if kept and kept[-1] == _VALUED:  # (--artifacts DIR: the flag and its value go)
            kept.pop()
        elif a not in _NOT_EXPLAIN_S and not a.startswith(_VALUED + "="):
            kept.append(a)
    return "gpulayer " + shlex.join(kept + tail)


#: ``gpulayer submit``'s flags that ``gpulayer explain`` refuses (:data:`jobs.ACTION_FLAGS`)
_NOT_EXPLAIN_S = frozenset({"--dry-run", "--detach", "-d"})
#: and the one of them that takes a value
_VALUED = "--artifacts"


def placement_check(client: Client, spec: JobSpec) -> tuple[dict[str, Any], list[str]]:
    """What ``gpulayer submit --dry-run`` adds: whether the job would be placed now, wait, or
    fail, as JSON and as lines (the closest workers and the command for the rest)."""
    from gpulayer.explanations import verdict_text

    e = client.explain(spec)
    command = command_line()
    data = {"outcome": e.decision.outcome, "summary": e.decision.summary, "closest": e.closest_line(),
            "explain": command}
    lines = [f"placement: {verdict_text(e)}"]
    if data["closest"]:
        lines.append(str(data["closest"]))
    lines.append(f"run: {command}")
    return data, lines


#: a job's id (:func:`gpulayer.records.new_id`), which ``gpulayer explain`` took for a command
_JOB_ID = re.compile(r"^job-[0-9a-f]{12}$")


def dry_run(client: Client, spec: JobSpec, as_json: bool) -> None:
    """``gpulayer submit --dry-run``: the spec, the bundle's contents and the placement verdict."""
    import json

    from gpulayer import bundles
    from gpulayer.profiles import resolve_requirements

    resolved = spec.model_copy(update={"requirements": resolve_requirements(spec.requirements)})
    data: dict[str, Any] = {"spec": json.loads(resolved.model_dump_json(exclude_defaults=True))}
    if spec.bundle:
        ins = bundles.inspect_directory(spec.bundle)
        data["bundle"] = {
            "files": [f.path for f in ins.included], "total_bytes": ins.total_size,
            "excluded": [{"path": e[0], "rule": e[1]} for e in ins.excluded],
            "largest": [{"path": f.path, "bytes": f.size} for f in ins.largest(5)],
        }
    data["placement"], lines = placement_check(client, spec)
    if as_json:
        jobs._echo_json(data)
        return
    typer.echo(json.dumps(data["spec"], indent=2))
    if "bundle" in data:
        b = data["bundle"]
        typer.echo(f"bundle: {len(b['files'])} file(s), {b['total_bytes']} bytes")
        for f in b["files"]:
            typer.echo(f"  + {f}")
        for e in b["excluded"]:
            typer.echo(f"  - {e['path']}  ({e['rule']})")
    for line in lines:
        typer.echo(line)


def explain_cmd(**flags: Any) -> None:
    command = flags.get("command") or []
    if len(command) == 1 and _JOB_ID.match(command[0]):
        # (it explained a job running a program of that name, on the default target: nothing
        # the user asked about)
        raise InvalidInput(f"the command after --: {command[0]!r} is a job's id, not a program; to explain a "
                           f"submitted job: gpulayer jobs explain {command[0]}")
    spec = jobs.spec_from_flags(flags)
    e = jobs._client().explain(spec)
    _show(e, flags["as_json"], command_line())


def explain_job(job_id: str, as_json: bool) -> None:
    """``gpulayer jobs explain JOB`` (defined in :mod:`gpulayer.cli.jobs`, with its group)."""
    e = jobs._client().explain_job(job_id)
    _show(e, as_json, f"gpulayer jobs explain {job_id}")


def _explain_signature() -> inspect.Signature:
    """``submit``'s parameters, evaluated (Typer reads them from here), less its action flags."""
    sig = inspect.signature(jobs.submit_cmd, eval_str=True)
    params = []
    for p in sig.parameters.values():
        if p.name in jobs.ACTION_FLAGS:
            continue
        if p.name == "as_json":
            p = p.replace(default=typer.Option(False, "--json", help="print the explanation record as JSON"))
        params.append(p)
    return sig.replace(parameters=params)


explain_cmd.__signature__ = _explain_signature()  # type: ignore[attr-defined]


def register(app: typer.Typer) -> None:
    app.command(
        "explain",
        context_settings={"allow_interspersed_args": False},
        help=help_of("explain"),
    )(explain_cmd)
