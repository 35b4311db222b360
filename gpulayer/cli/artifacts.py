"""``gpulayer jobs artifacts``: the files a job's tasks left in ``$GPULAYER_ARTIFACTS_DIR``,
downloaded into a folder (:mod:`gpulayer.artifacts`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from gpulayer.cli.conventions import echo_json, json_option
from gpulayer.errors import NotFound

if TYPE_CHECKING:
    from gpulayer.client import Client
    from gpulayer.records import JobRecord

__all__ = ["check_folder", "download_after", "jobs_artifacts", "stored_line"]


def jobs_artifacts(
    job_id: str = typer.Argument(..., metavar="JOB"),
    to: Optional[Path] = typer.Option(None, "--to", metavar="DIR",
                                      help="the folder to put them in: new or empty (default: ./JOB)"),
    as_json: bool = json_option("print the job, the folder, the attempt and each file as one record"),
) -> None:
    """Download the files the job's tasks left in $GPULAYER_ARTIFACTS_DIR (those of its last
    attempt that left any) into a new or empty folder; a job of several nodes gets a folder
    per node (node-0, node-1, ...). Exits 2 when the job has none."""
    from gpulayer.artifacts import format_size
    from gpulayer.cli.jobs import _client

    got = _client().artifacts(job_id, to, where="--to")
    if as_json:
        echo_json({"id": got.job_id, "to": str(got.to), "attempt": got.attempt, "files": got.files,
                   "bytes": got.unpacked})
        return
    typer.echo(f"{len(got.files)} file(s), {format_size(got.unpacked)}, of {got.job_id} "
               f"(attempt {got.attempt}) in {got.to}{'' if str(got.to).endswith('/') else '/'}")


def stored_line(client: Client, job: JobRecord) -> str | None:
    """What ``jobs show`` says of the job's artifacts (None: it has none, or its server is
    older than them)."""
    from gpulayer.artifacts import format_size, latest

    try:
        chosen = latest(client.api.list_artifacts(job.id))
    except NotFound:
        return None
    if not chosen:
        return None
    files, size = sum(t.files for t in chosen), sum(t.unpacked for t in chosen)
    return f"{files} file(s), {format_size(size)}, attempt {chosen[0].attempt}: gpulayer jobs artifacts {job.id}"


def check_folder(to: Path | None, detach: bool) -> None:
    """``gpulayer submit --artifacts DIR``, before anything is submitted: the folder must be
    new or empty (the job's files go there once it ends), and the job must end here."""
    from gpulayer.artifacts import usable_folder
    from gpulayer.errors import InvalidInput

    if to is None:
        return
    if detach:
        raise InvalidInput("--artifacts: the job's files are downloaded once it ends, and --detach does not wait "
                           "for it; accepted: one of them (gpulayer jobs artifacts JOB --to DIR, once it ended)")
    usable_folder(to, f"--artifacts {to}")


def download_after(client: Client, job: JobRecord, to: Path | None) -> None:
    """Once the job of a foreground submit ended: its artifacts into ``to`` (said on stderr,
    as the job's status lines are; a job that left none is said, and exits as it ended)."""
    from gpulayer.artifacts import format_size
    from gpulayer.errors import GpulayerError

    if to is None:
        return
    try:
        got = client.artifacts(job.id, to, where="--artifacts")
    except NotFound as exc:
        typer.echo(f"gpulayer: no artifacts: {exc}", err=True)
        return
    except GpulayerError as exc:  # (the job ran: its outcome is the command's; what failed here is said)
        typer.echo(f"gpulayer: artifacts not downloaded: {exc}", err=True)
        return
    typer.echo(f"gpulayer: {len(got.files)} file(s), {format_size(got.unpacked)}, of {got.job_id} in {got.to}/",
               err=True)
