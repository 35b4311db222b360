"""``gpulayer submit`` and the ``gpulayer jobs`` group.

Exit codes of ``gpulayer submit`` (without ``--detach``), ``jobs wait``, ``jobs result``
and ``jobs logs --follow`` (:mod:`gpulayer.cli.conventions`):

=====  ================================================================
N      the job ran: its own exit code (0 on success)
1      the job failed without an exit code of its own
2      bad input (a flag, a spec, a bundle, a job id)
75     still running: the wait ended before the job did
124    the job timed out
125    the job could not be placed (no eligible worker)
126    the job's worker was lost and no retry was left
130    the job was cancelled (or you pressed Ctrl-C and it was cancelled)
=====  ================================================================
"""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from gpulayer import config
from gpulayer.cli import display, light
from gpulayer.cli.commands import help_of
from gpulayer.cli.conventions import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_STILL_RUNNING,
    EXIT_TIMED_OUT,
    EXIT_UNSCHEDULABLE,
    echo_json,
    exit_code_for,
    json_option,
    outcome_record,
    outcome_text,
)
from gpulayer.cli.display import printable, printable_lines
from gpulayer.errors import GpulayerError, InvalidInput, NotFound, UnknownAfter
from gpulayer.logtail import MAX_TAIL
from gpulayer.unsent import note, unsent_in_spec

if TYPE_CHECKING:
    from gpulayer.client import Client
    from gpulayer.records import JobRecord, JobState
    from gpulayer.specs import CommandJob, DistributedJob
    from gpulayer.wording import Spelling

__all__ = ["EXIT_CANCELLED", "EXIT_FAILED", "EXIT_LOST", "EXIT_STILL_RUNNING", "EXIT_TIMED_OUT",
           "EXIT_UNSCHEDULABLE", "exit_code_for", "follow_job", "spec_from_flags", "submit_cmd"]

jobs_app = typer.Typer(help=help_of("jobs"), no_args_is_help=True, rich_markup_mode=None)


def __getattr__(name: str) -> Any:
    if name == "SUBMIT_SPELLING":  # joboptions loads pydantic: only when a command needs it
        return _spelling()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _spelling() -> Spelling:
    """How ``gpulayer submit`` writes each spec field: errors name the flag as typed."""
    from gpulayer import joboptions

    return joboptions.CLI_SPELLING


def _client() -> Client:
    from gpulayer.client import connect  # the embedded control plane loads SQLAlchemy only when used

    return connect()


def _job_state(state: str | None) -> JobState | None:
    from gpulayer.records import JobState

    if state is None:
        return None
    try:
        return JobState(state)
    except ValueError:
        raise InvalidInput(f"--state {state!r}: expected one of {', '.join(s.value for s in JobState)}") from None


def _echo_json(data: Any) -> None:
    echo_json(data)


def follow_job(client: Client, job_id: str, *, node: int | None = None, progress: bool = False,
               stdout_to_stderr: bool = False, tail: int | None = None) -> JobRecord:
    """Stream the job's output to our stdout/stderr until it ends; returns its record.
    ``progress``: show the job's status on stderr as it goes (:mod:`gpulayer.cli.progress`);
    ``stdout_to_stderr``: the job's stdout too goes to stderr (stdout is for ``--json``);
    ``tail``: from its last ``tail`` lines on."""
    from gpulayer.cli.progress import status_for
    from gpulayer.client import prefixes_nodes
    from gpulayer.logtext import NodeLines

    show = status_for(client) if progress else None
    lines: NodeLines | None = None
    last: list[JobRecord] = []

    def seen(job: JobRecord) -> None:
        nonlocal lines
        if show is not None:
            show.update(job)
        last[:] = [job]
        if lines is None:
            lines = NodeLines(prefixes_nodes(job.spec, node, spelled=f"--node {node}"))

    def write(stream: str, text: str) -> None:
        out = sys.stderr if stream == "stderr" or stdout_to_stderr else sys.stdout
        if show is None:
            out.write(text)
            out.flush()
            return
        with show.paused():
            out.write(text)
            out.flush()

    try:
        for c in client.follow(job_id, node=node, on_update=seen, tail=tail):
            assert lines is not None  # (follow looks at the job before its first chunk)
            write(c.stream, lines.text(c.data, c.node_rank, c.stream))
    finally:
        try:
            # (after a Ctrl-C too: the line each node printed last, not ended yet, is shown,
            # not dropped; it is often what a hung node said last)
            for stream, rest in lines.rest() if lines is not None else []:
                write(stream, rest)
        finally:
            if show is not None:
                show.close()
    return last[0]


def register(app: typer.Typer) -> None:
    from gpulayer.cli import artifacts, rerun, retention

    retention.add_to(jobs_app)
    jobs_app.command("rerun")(rerun.jobs_rerun)
    jobs_app.command("artifacts")(artifacts.jobs_artifacts)
    app.add_typer(jobs_app, name="jobs")
    app.command(
        "submit",
        context_settings={"allow_interspersed_args": False},
        help=help_of("submit"),
    )(submit_cmd)


def submit_cmd(
    command: list[str] = typer.Argument(..., help="the command to run, after --"),
    accelerator: Optional[str] = typer.Option(None, "--accelerator", "-a", metavar="KIND", help="cuda, rocm, mps, ... (default: none)"),
    allow_unknown_accelerator: bool = typer.Option(
        False, "--allow-unknown-accelerator", help="accept an --accelerator no installed plugin knows"),
    gpus: Optional[int] = typer.Option(None, "--gpus", metavar="N", help="devices per node (default 1 with --accelerator)"),
    min_gpu_memory: Optional[float] = typer.Option(None, "--min-gpu-memory", metavar="GB", help="GB of memory per device"),
    compute_capability: Optional[str] = typer.Option(
        None, "--compute-capability", metavar="SPEC", help="e.g. 8.0 (meaning >=8.0) or '>=8.0,<9'"),
    framework: list[str] = typer.Option([], "--framework", "-f", metavar="SPEC", help="e.g. 'torch>=2.2' (repeatable)"),
    python_version: Optional[str] = typer.Option(None, "--python-version", metavar="SPEC", help="e.g. 3.11 or '>=3.10,<3.13'"),
    os_name: Optional[str] = typer.Option(None, "--os", metavar="NAME", help="linux, darwin, ..."),
    cpus: Optional[int] = typer.Option(None, "--cpus", metavar="N", help="CPUs the worker must have"),
    memory: Optional[float] = typer.Option(None, "--memory", metavar="GB", help="GB of RAM the worker must have"),
    profile: Optional[str] = typer.Option(None, "--profile", metavar="NAME", help="runtime profile, e.g. pytorch-cuda"),
    target: Optional[str] = typer.Option(
        None, "--target", metavar="T", help="local, remote or cloud (default: local embedded, remote with --url)"),
    fallback: list[str] = typer.Option([], "--fallback", metavar="T", help="fallback target, in order (repeatable)"),
    bundle: Optional[str] = typer.Option(None, "--bundle", metavar="DIR", help="directory to send and run in"),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="S", help="seconds per attempt (default: no limit)"),
    retries: int = typer.Option(0, "--retries", metavar="N", help="extra attempts after a failure or loss"),
    on_unschedulable: str = typer.Option("fail", "--on-unschedulable", metavar="fail|wait", help="fail or wait"),
    prefer: list[str] = typer.Option([], "--prefer", metavar="SCOPE", help="cloud: provider, provider/region or scope to try first, "
                                                                          "in order (repeatable)"),
    env: list[str] = typer.Option([], "--env", "-e", metavar="K=V", help="KEY=VALUE for the job (repeatable)"),
    label: list[str] = typer.Option([], "--label", metavar="K=V", help="required worker label KEY=VALUE (repeatable)"),
    priority: int = typer.Option(0, "--priority", metavar="P", help="higher runs first"),
    after: list[str] = typer.Option([], "--after", metavar="JOB", help="run once this job has succeeded (repeatable)"),
    after_ended: list[str] = typer.Option([], "--after-ended", metavar="JOB",
                                          help="run once this job has ended, whatever its outcome (repeatable)"),
    name: Optional[str] = typer.Option(None, "--name", metavar="NAME"),
    nodes: Optional[int] = typer.Option(None, "--nodes", metavar="N", help="nodes of a distributed job"),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", metavar="K", help="processes per node"),
    launcher: Optional[str] = typer.Option(None, "--launcher", metavar="NAME", help="launcher of a distributed job (default: torchrun)"),
    detach: bool = typer.Option(False, "--detach", "-d", help="print the job id and return"),
    artifacts_to: Optional[Path] = typer.Option(None, "--artifacts", metavar="DIR", help="once the job ends, download the "
                                                "files it left in $GPULAYER_ARTIFACTS_DIR into DIR (new or empty)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show the spec and the bundle's contents; submit nothing"),
    as_json: bool = typer.Option(False, "--json", help="print JSON: the job's id (--detach), the spec (--dry-run), "
                                 "or its outcome once it ends, with the job's output on stderr"),
) -> None:
    from gpulayer.records import JobState

    spec = spec_from_flags(dict(locals()))
    # (a spec that names no target goes where the client sends it: remote for a server)
    unsent = unsent_in_spec(spec, "remote" if config.settings().url else "local")
    if unsent is not None:
        typer.echo(f"gpulayer: {note(unsent, cli=True)}", err=True)
    if dry_run:
        from gpulayer.cli.explain import dry_run as show_dry_run

        show_dry_run(_client(), spec, as_json)
        return
    from gpulayer.cli import artifacts

    artifacts.check_folder(artifacts_to, detach)  # (before the job runs: not after, when its files are there)
    client = _client()
    if detach:
        _background_worker_for_detached_jobs(client)
    try:
        job = client.submit(spec)
    except UnknownAfter as exc:  # (named as typed: --after job-...)
        raise InvalidInput(f"{_spelling().input(exc.field, exc.job, (exc.index,))}: {str(exc).partition(': ')[2]}") from None
    if job.state is JobState.UNSCHEDULABLE:
        typer.echo(job.error.message if job.error else "scheduling: no eligible worker", err=True)
        if as_json:
            echo_json(outcome_record(job))
        raise typer.Exit(EXIT_UNSCHEDULABLE)
    if detach and job.state.terminal:  # it ended at its submit: a job it runs after had ended without success
        typer.echo(f"gpulayer: {outcome_text(job)}", err=True)
        if as_json:
            echo_json(outcome_record(job))
        raise typer.Exit(exit_code_for(job))
    if detach:
        if as_json:
            _echo_json({"id": job.id, "state": job.state.value})
        else:
            typer.echo(job.id)
        return
    try:
        final = follow_job(client, job.id, progress=True, stdout_to_stderr=as_json)
    except KeyboardInterrupt:
        client.api.cancel(job.id)
        typer.echo(f"\ngpulayer: cancelled {job.id}", err=True)
        if as_json:  # (read at once, it said "running" and code 75, and the command exited 130)
            echo_json({**outcome_record(_cancelled(client, job.id)), "code": EXIT_CANCELLED})
        raise typer.Exit(EXIT_CANCELLED) from None
    except BrokenPipeError:  # (| head -1): the command ends, as a filter does, not the job
        with contextlib.suppress(OSError):
            typer.echo(f"gpulayer: the output's reader left; {job.id} goes on "
                       f"(gpulayer jobs wait {job.id})", err=True)
        raise
    if final.state is not JobState.SUCCEEDED:
        typer.echo(f"gpulayer: {outcome_text(final)}", err=True)
    artifacts.download_after(client, final, artifacts_to)
    if as_json:
        echo_json(outcome_record(final))
    raise typer.Exit(exit_code_for(final))


#: seconds ``submit --json`` waits, after a Ctrl-C, for the cancel to end the job
CANCEL_WAIT = 30.0


def _cancelled(client: Client, job_id: str) -> JobRecord:
    """The job once the cancel a Ctrl-C asked for has ended it, for its ``--json`` record
    (:data:`CANCEL_WAIT` at most; a second Ctrl-C stops the wait)."""
    try:
        return client.wait(job_id, CANCEL_WAIT, arguments=False)
    except KeyboardInterrupt:
        return client.job(job_id, arguments=False)


def _entry_words(command: list[str]) -> tuple[str, list[str]]:
    """A distributed job's entry and its arguments, from the words after ``--``: ``python
    train.py ...`` and ``python -m pkg.train ...`` are written as a one-process command would
    be, and every rank runs the entry with the job's Python anyway."""
    if len(command) > 1 and re.fullmatch(r"(python|pypy)[0-9.]*", command[0].rpartition("/")[2]):
        if command[1] == "-m" and len(command) > 2:
            return command[2], command[3:]
        if not command[1].startswith("-"):
            return command[1], command[2:]
    return command[0], command[1:]


#: ``gpulayer submit``'s flags that say what to do with the job rather than describe it
ACTION_FLAGS = ("detach", "dry_run", "artifacts_to")


def spec_from_flags(flags: dict[str, Any]) -> CommandJob | DistributedJob:
    """The spec that ``gpulayer submit``'s flags (and so ``gpulayer explain``'s) describe,
    checked as every front end checks one (:mod:`gpulayer.joboptions`)."""
    from gpulayer import joboptions

    spelling = _spelling()
    f = flags
    command, launcher, nodes, nproc_per_node = f["command"], f["launcher"], f["nodes"], f["nproc_per_node"]
    options: joboptions.JobOptions = {
        "accelerator": f["accelerator"], "allow_unknown_accelerator": f["allow_unknown_accelerator"],
        "gpus": f["gpus"], "min_gpu_memory_gb": f["min_gpu_memory"], "compute_capability": f["compute_capability"],
        "frameworks": f["framework"], "python_version": f["python_version"], "os": f["os_name"], "cpus": f["cpus"],
        "memory_gb": f["memory"], "labels": _pairs(f["label"], "requirements.labels"), "profile": f["profile"],
        "target": f["target"], "fallback_targets": f["fallback"], "on_unschedulable": f["on_unschedulable"],
        "prefer": f["prefer"], "timeout": f["timeout"], "retries": f["retries"], "priority": f["priority"], "env": _pairs(f["env"], "env"),
        "name": f["name"], "bundle": f["bundle"], "after": _ids(f.get("after")), "after_ended": _ids(f.get("after_ended")),
    }
    spec: CommandJob | DistributedJob
    if nproc_per_node is not None or (nodes is not None and nodes != 1) or launcher is not None:
        # (a launcher named is a launcher wanted, for one process too)
        entry, args = _entry_words(command)
        spec = joboptions.distributed_job(entry, args, options, spelling, nodes=nodes,
                                          nproc_per_node=nproc_per_node, launcher=launcher)
    else:
        spec = joboptions.command_job(command, options, spelling)
    return spec


def _ids(words: list[str] | None) -> list[str] | None:
    """Job ids given as repeated flags, each maybe ``JOB,JOB``."""
    return [job for word in words or () for job in word.split(",")] or None


def _background_worker_for_detached_jobs(client: Client) -> None:
    """A detached job outlives this command, so it cannot run on a worker inside it: start
    a background worker (it exits after 5 idle minutes) when no local worker is running."""
    from gpulayer import config

    if not client.embedded or client.live_local_workers():
        return
    log = config.home() / "worker.log"
    with open(log, "ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "gpulayer.cli", "worker", "start", "--idle-exit", "300"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.live_local_workers():
            typer.echo(f"gpulayer: started a background worker (log: {log})", err=True)
            return
        time.sleep(0.2)
    raise GpulayerError(f"the background worker did not register within 60 s; see {log}")


def _pairs(items: list[str], path: str) -> dict[str, str]:
    """``KEY=VALUE`` flags as a mapping (a later KEY wins, as in a shell)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise InvalidInput(f"{_spelling().input(path, [item])}: no '='; accepted: KEY=VALUE")
        k, v = item.split("=", 1)
        out[k] = v
    return out


# --------------------------------------------------------------------------- jobs group


def _job_summary(job: JobRecord) -> dict[str, Any]:
    from gpulayer.embedded_reads import shown_command

    spec = job.spec
    what = shown_command(spec.command) if spec.kind == "command" else (
        spec.function if spec.kind == "function" else f"{spec.entry} x{spec.nodes}")
    return light.job_summary(job.id, job.state.value, spec.kind, spec.name or "", what, job.attempt,
                             job.created_at)


@jobs_app.command("list")
def jobs_list(
    state: Optional[str] = typer.Option(None, "--state", help="only jobs in this state"),
    limit: int = typer.Option(light.LIST_LIMIT, "--limit", min=1, max=1000, metavar="N",  # (the API's bound, embedded too)
                              help="the N newest"),
    before: Optional[str] = typer.Option(None, "--before", metavar="JOB",
                                         help="only jobs submitted before JOB (the last of a page: the next page)"),
    as_json: bool = json_option(),
) -> None:
    """List recent jobs, newest first."""
    # (the embedded database's common case is answered before this, by gpulayer.cli.light,
    # whose text this prints too)
    try:
        jobs = _client().api.list_jobs(state=_job_state(state), limit=limit, before=before)
    except NotFound:
        raise InvalidInput(f"--before {before}: no such job; accepted: the id of a job, as gpulayer jobs list "
                           "shows it") from None
    summaries = [_job_summary(j) for j in jobs]
    if as_json:
        echo_json(summaries)
        return
    for line in light.job_table(summaries, time.time(), limit=limit, state=state):
        typer.echo(line)


@jobs_app.command("show")
def jobs_show(job_id: str = typer.Argument(..., metavar="JOB"), as_json: bool = json_option()) -> None:
    """A job's spec, state, tasks and last placement decision (one line per worker)."""
    job = _client().api.get_job(job_id)
    if as_json:
        typer.echo(job.model_dump_json(indent=2))
        return
    s = _job_summary(job)
    typer.echo(f"job       {job.id}")
    if job.spec.name is not None:
        typer.echo(f"name      {printable(job.spec.name)}")
    code = job.exit_code if job.state.terminal else None  # (an attempt's, before a retry: on its task line)
    typer.echo(f"state     {job.state.value}" + (f" (exit code {code})" if code is not None else ""))
    typer.echo(f"kind      {s['kind']}: {printable(s['what'])}")
    typer.echo(f"needs     {display.requirements_text(job.spec.requirements) or 'nothing special (CPU)'}")
    typer.echo(f"placement target={job.spec.placement.target} fallback={job.spec.placement.fallback_targets} "
               f"on_unschedulable={job.spec.placement.on_unschedulable}")
    typer.echo(f"attempt   {job.attempt} of {job.spec.retries + 1}")
    if job.spec.after or job.spec.after_ended:
        typer.echo(f"after     {', '.join([*job.spec.after, *(f'{i} (any end)' for i in job.spec.after_ended)])}")
    if job.error:
        typer.echo(f"error     {printable_lines(job.error.describe(), ' ' * 10)}")
    for t in job.tasks:
        devs = f" {t.accelerator}{t.devices}" if t.devices else ""
        why = t.error.message.partition("\n")[0] if t.error and t.error.message not in ("", t.state.value) else ""
        typer.echo(f"task      {t.id} attempt={t.attempt} node={t.node_rank} worker={t.worker_id}{devs} "
                   f"{t.state.value}" + (f" exit={t.exit_code}" if t.exit_code is not None else "")
                   + (f" ({printable(why)})" if why else "") + (" (waiting for jobs: its CPU slot lent)" if t.lent else ""))
        if t.usage is not None:
            ran = f"ran {t.ended_at - t.started_at:.2f} s, " if t.started_at is not None and t.ended_at is not None else ""
            typer.echo(f"          {ran}{t.usage.describe()}")
    if job.decision:
        typer.echo("placement " + job.decision.render().replace("\n", "\n          "))
    from gpulayer.cli.artifacts import stored_line
    if (line := stored_line(_client(), job)) is not None:
        typer.echo(f"artifacts {line}")
    if "cloud" in job.spec.placement.targets:
        from gpulayer.provisioning import history

        line = history((e.kind, e.message) for e in _client().api.events(job_id))
        if line:
            typer.echo(f"cloud     {line}")


@jobs_app.command("logs")
def jobs_logs(
    job_id: str = typer.Argument(..., metavar="JOB"),
    follow: bool = typer.Option(False, "--follow", "-f",
                                help="keep streaming until the job ends, then exit with its outcome"),
    node: Optional[int] = typer.Option(None, "--node", min=0, metavar="RANK",
                                       help="only this node of a distributed job"),
    tail: Optional[int] = typer.Option(None, "--tail", "-n", min=0, max=MAX_TAIL, metavar="N",
                                       help="only the last N lines (with --follow: then what follows)"),
) -> None:
    """Print a job's output (stdout and stderr as written).

    With --follow it exits as gpulayer submit does: the job's exit code, 130 when it was
    cancelled, 124 when it timed out (see gpulayer jobs wait --help)."""
    from gpulayer.client import prefixes_nodes
    from gpulayer.logtext import NodeLines

    client = _client()
    if follow:
        final = follow_job(client, job_id, node=node, tail=tail)
        sys.stdout.flush()
        if final.state.value != "succeeded":
            typer.echo(f"gpulayer: {outcome_text(final)}", err=True)
        raise typer.Exit(exit_code_for(final))
    job = client.job(job_id, brief=True)  # (its spec's nodes: not its result and arguments)
    lines = NodeLines(prefixes_nodes(job.spec, node, spelled=f"--node {node}"))
    for c in client.log_chunks(job_id, node=node, tail=tail):
        out = sys.stderr if c.stream == "stderr" else sys.stdout
        out.write(lines.text(c.data, c.node_rank, c.stream))
    for stream, rest in lines.rest():
        (sys.stderr if stream == "stderr" else sys.stdout).write(rest)
    sys.stdout.flush()


@jobs_app.command("cancel")
def jobs_cancel(
    job_ids: list[str] = typer.Argument(..., metavar="JOB", help="one or more job ids"),
    as_json: bool = json_option("print one record per job: id, state, whether the cancel is still under way"),
) -> None:
    """Cancel jobs: their processes are ended, grandchildren included.

    A job id that names no job is reported and the others are still cancelled; the command
    then exits 2."""
    outcomes = _client().cancel_jobs(job_ids)
    done: list[dict[str, Any]] = []
    failed = False
    for job_id in job_ids:
        job = outcomes[job_id]
        if isinstance(job, GpulayerError):
            failed = True
            typer.echo(f"error: {job}", err=True)
            done.append({"id": job_id, "state": None, "pending": False, "error": str(job)})
            continue
        done.append({"id": job.id, "state": job.state.value, "pending": not job.state.terminal, "error": None})
        if not as_json:
            typer.echo(f"{job.id} {job.state.value}" + (" (cancel requested)" if not job.state.terminal else ""))
    if as_json:
        echo_json(done)
    if failed:
        raise typer.Exit(2)


def _check_wait_timeout(timeout: float | None) -> None:
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        written = next((a.partition("=")[2] or b for a, b in zip(sys.argv, [*sys.argv[1:], ""], strict=True)
                        if a == "--timeout" or a.startswith("--timeout=")), f"{timeout:g}")
        what = "must be at least 0" if math.isfinite(timeout) else "not a number of seconds"
        raise InvalidInput(f"--timeout {written}: {what}; accepted: a number >= 0 "
                           "(leave it out to wait as long as it takes)")


@jobs_app.command("wait")
def jobs_wait(
    job_ids: list[str] = typer.Argument(..., metavar="JOB", help="one or more job ids"),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="S",
                                            help="give up after S seconds (default: wait as long as it takes)"),
    as_json: bool = json_option("print one outcome record per job"),
) -> None:
    """Wait until every job has ended, printing each one's outcome.

    Exit codes: 0 when every job succeeded; 75 when the --timeout passed with a job still
    queued or running (it keeps running; wait again); otherwise the code of the first job
    given that did not succeed, as gpulayer submit exits: the job's own exit code, 1 failed,
    124 timed out, 125 unschedulable, 126 lost, 130 cancelled; 2 for a job id that names no job."""
    _check_wait_timeout(timeout)
    client = _client()
    for job_id in job_ids:  # every id is checked before waiting on any
        client.job(job_id, brief=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    finals: list[JobRecord] = []
    for job_id in job_ids:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        job = client.wait(job_id, left, arguments=False)  # (its outcome)
        finals.append(job)
        if not as_json:
            text = outcome_text(job) if job.state.terminal else f"job {job.id} still {job.state.value}"
            typer.echo(text, err=job.state.terminal and job.state.value != "succeeded")
    if as_json:
        echo_json([outcome_record(j) for j in finals])
    codes = [exit_code_for(j) for j in finals]
    if EXIT_STILL_RUNNING in codes:
        raise typer.Exit(EXIT_STILL_RUNNING)
    raise typer.Exit(next((c for c in codes if c != 0), 0))


@jobs_app.command("result")
def jobs_result(
    job_id: str = typer.Argument(..., metavar="JOB"),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="wait for the job to end"),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="S", help="give up after S seconds"),
    as_json: bool = json_option("print the outcome record (id, state, exit code, error, result)"),
) -> None:
    """Print a job's JSON result (function jobs) or exit code (command jobs).

    Exits as gpulayer jobs wait does: 0, 75 when the job has not ended (--no-wait, or after
    --timeout), else the job's outcome."""
    _check_wait_timeout(timeout)
    if timeout is not None and not wait:  # (the timeout of a wait it was told not to make)
        raise typer.BadParameter("bounds a wait, and --no-wait makes none; accepted: one of them",
                                 param_hint="'--timeout'")
    client = _client()
    job = client.wait(job_id, timeout, arguments=False) if wait else client.job(job_id, arguments=False)
    if as_json:
        echo_json(outcome_record(job))
        raise typer.Exit(exit_code_for(job))
    if not job.state.terminal:
        typer.echo(f"job {job_id} is still {job.state.value}", err=True)
        raise typer.Exit(EXIT_STILL_RUNNING)
    if job.state.value == "succeeded":
        echo_json(job.result if job.spec.kind == "function" else {"exit_code": job.exit_code})
        return
    typer.echo(outcome_text(job), err=True)
    if job.error is not None and job.error.traceback:
        typer.echo(job.error.traceback, err=True)
    raise typer.Exit(exit_code_for(job))


@jobs_app.command("explain")
def jobs_explain(job_id: str = typer.Argument(..., metavar="JOB"), as_json: bool = typer.Option(
        False, "--json", help="print the explanation record as JSON")) -> None:
    """Could the job run now, where, and if not, which worker comes closest and what change would make it fit."""
    from gpulayer.cli.explain import explain_job

    explain_job(job_id, as_json)
