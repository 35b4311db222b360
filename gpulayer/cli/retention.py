"""``gpulayer jobs delete`` and ``gpulayer jobs prune``: deleting ended jobs with their output,
results and events (:mod:`gpulayer.control.retention`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

import typer

from gpulayer.cli.conventions import echo_json, json_option
from gpulayer.errors import InvalidInput, MethodNotAllowed

if TYPE_CHECKING:
    from gpulayer.api import ControlAPI

__all__ = ["add_to"]

#: the states a job may be deleted in (gpulayer.store.retention.ENDED_STATES, not imported:
#: the CLI's start-up)
ENDED = ("succeeded", "failed", "cancelled", "timed_out", "unschedulable")


def add_to(jobs_app: typer.Typer) -> None:
    jobs_app.command("delete")(jobs_delete)
    jobs_app.command("prune")(jobs_prune)


def _api() -> ControlAPI:
    from gpulayer.client import connect

    return connect().api


def _older(api: ControlAPI) -> None:
    raise InvalidInput(f"the control plane at {getattr(api, 'url', '?')} does not delete jobs: its server is older "
                       "than gpulayer jobs delete and prune; upgrade it")


def jobs_delete(
    job_ids: list[str] = typer.Argument(..., metavar="JOB", help="one or more job ids"),
    as_json: bool = json_option("print one record per job: id, whether it was deleted, and why not"),
) -> None:
    """Delete ended jobs with their output, results and events.

    A job that has not ended is left as it is (cancel it first); a job id that names no job
    is reported. Either way the others are deleted, and the command exits 2."""
    from gpulayer.api import MAX_BATCH

    api = _api()
    ids = list(dict.fromkeys(job_ids))
    deleted: set[str] = set()
    not_ended: dict[str, Any] = {}
    for i in range(0, len(ids), MAX_BATCH):
        try:
            answer = api.delete_jobs(ids[i:i + MAX_BATCH])
        except MethodNotAllowed:
            _older(api)
        deleted |= set(answer.deleted)
        not_ended.update(answer.not_ended)
    done: list[dict[str, Any]] = []
    for job_id in ids:
        if job_id in deleted:
            error = None
        elif job_id in not_ended:
            state = not_ended[job_id].value
            error = (f"job {job_id} is {state}: only a job that has ended is deleted; cancel it first "
                     f"(gpulayer jobs cancel {job_id})")
        else:
            error = f"job {job_id!r}: no such job"
        done.append({"id": job_id, "deleted": error is None, "error": error})
        if error is not None:
            typer.echo(f"error: {error}", err=True)
        elif not as_json:
            typer.echo(f"deleted {job_id}")
    if as_json:
        echo_json(done)
    if len(deleted) < len(ids):
        raise typer.Exit(2)


def jobs_prune(
    older_than: str = typer.Option(..., "--older-than", metavar="AGE",
                                   help="delete jobs that ended at least this long ago, e.g. 30d, 12h (0: every ended job)"),
    states: Optional[list[str]] = typer.Option(None, "--state", metavar="STATE",
                                               help="only jobs in this ended state (repeat for several; "
                                                    f"default: every ended state: {', '.join(ENDED)})"),
    dry_run: bool = typer.Option(False, "--dry-run", help="count the jobs it would delete; delete nothing"),
    as_json: bool = json_option("print the counts as JSON"),
) -> None:
    """Delete the jobs that ended at least --older-than ago, with their output, results and
    events, and the bundles no stored job names any more.

    With a client token of a server, only your own jobs (and no bundle: an admin's prune
    removes those). Queued and running jobs are never deleted. To do it on a schedule, set
    GPULAYER_KEEP_JOBS where the control plane runs (docs/concepts.md, Deleting jobs)."""
    seconds = _age(older_than)
    for state in states or ():
        if state not in ENDED:
            raise InvalidInput(f"--state {state!r}: accepted: an ended state, one of {', '.join(ENDED)} "
                               "(a job that has not ended is never deleted)")
    api = _api()
    try:
        pruned = api.prune_jobs(older_than=seconds, states=list(dict.fromkeys(states)) if states else None,
                                dry_run=dry_run)
    except MethodNotAllowed:
        _older(api)
    if as_json:
        echo_json(pruned.model_dump(mode="json"))
        return
    age = "have ended" if seconds == 0 else f"ended at least {older_than.strip()} ago"
    if dry_run:
        typer.echo(f"would delete {pruned.jobs} job(s) that {age} (nothing deleted: --dry-run)")
        return
    bundles = f", and {pruned.bundles} bundle(s) no stored job names" if pruned.bundles else ""
    if pruned.at_least:  # (an earlier try, whose answer was lost, deleted what it did uncounted)
        typer.echo(f"deleted at least {pruned.jobs} job(s) that {age}, with their output, results and events"
                   f"{bundles} (its answer lost, the prune was sent again: what the first try deleted is not counted)")
        return
    typer.echo(f"deleted {pruned.jobs} job(s) that {age}, with their output, results and events{bundles}")


def _age(text: str) -> float:
    from gpulayer.units import parse_duration

    raw = text.strip().lower()
    if raw.rstrip("smhd") in ("0", "0.0") and raw.rstrip("smhd") != "":
        return 0.0
    try:
        seconds = parse_duration(text)
    except InvalidInput as exc:
        raise InvalidInput(f"--older-than {text!r}: {str(exc).split(': ', 1)[-1]}; or 0 for every ended job") from None
    if not math.isfinite(seconds):  # pragma: no cover - parse_duration bounds it
        raise InvalidInput(f"--older-than {text!r}: accepted: a duration such as 30d")
    return seconds
