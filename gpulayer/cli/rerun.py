"""``gpulayer jobs rerun``: ended jobs run again as new jobs (:mod:`gpulayer.control.rerun`)."""

from __future__ import annotations

from typing import Any

import typer

from gpulayer.cli.conventions import echo_json, json_option
from gpulayer.errors import InvalidInput, MethodNotAllowed

__all__ = ["jobs_rerun"]


def jobs_rerun(
    job_ids: list[str] = typer.Argument(..., metavar="JOB", help="one or more ended jobs"),
    downstream: bool = typer.Option(False, "--downstream",
                                    help="and the ended jobs that run after them (--after, --after-ended), "
                                         "down the chain, naming the new jobs"),
    as_json: bool = json_option("print one record per job: id, its new job (rerun_as), and why not"),
) -> None:
    """Run ended jobs again, each as a new job with its command or function, arguments, bundle
    and options; print each new id (JOB -> NEW).

    With --downstream, a pipeline runs again from those jobs: the ended jobs after them are run
    again too, each after the new jobs. A job that has not ended, or an id that names no job, is
    reported; the others run again either way, and the command exits 2."""
    from gpulayer.api import MAX_BATCH
    from gpulayer.cli.jobs import _background_worker_for_detached_jobs, _client

    client = _client()
    _background_worker_for_detached_jobs(client)  # (the new jobs outlive this command, as --detach's do)
    ids = list(dict.fromkeys(job_ids))
    rerun: dict[str, str] = {}
    not_ended: dict[str, Any] = {}
    for i in range(0, len(ids), MAX_BATCH):
        try:
            answer = client.api.rerun_jobs(ids[i:i + MAX_BATCH], downstream=downstream)
        except MethodNotAllowed:
            raise InvalidInput(f"the control plane at {getattr(client.api, 'url', '?')} does not run jobs again: "
                               "its server is older than gpulayer jobs rerun; upgrade it") from None
        rerun.update(answer.rerun)
        not_ended.update(answer.not_ended)
    done: list[dict[str, Any]] = []
    failed = False
    for job_id in [*ids, *(j for j in [*rerun, *not_ended] if j not in ids)]:  # (then the jobs downstream)
        error = None
        if job_id in not_ended:
            state = not_ended[job_id].value
            error = (f"job {job_id} is {state}: a job is run again once it has ended "
                     f"(gpulayer jobs wait {job_id}, or gpulayer jobs cancel {job_id})")
        elif job_id not in rerun:
            error = f"job {job_id!r}: no such job"
        failed |= error is not None and job_id in ids
        done.append({"id": job_id, "rerun_as": rerun.get(job_id), "error": error})
        if error is not None:
            typer.echo(f"error: {error}", err=True)
        elif not as_json:
            typer.echo(f"{job_id} -> {rerun[job_id]}")
    if as_json:
        echo_json(done)
    if failed:
        raise typer.Exit(2)
