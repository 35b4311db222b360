"""Running ended jobs again (``gpulayer jobs rerun``, :meth:`ControlPlane.rerun_jobs`,
``handle.rerun()``): each as a new job with the stored spec and arguments (its bundle, its
name, its options), as GitHub Actions' "Re-run" or Argo's ``resubmit`` do. The job run again is
left as it was; each is told of the other in its events (``rerun as job-...``, ``rerun of
job-...``).

With ``downstream`` the ended jobs that run after one of them (``after``, ``after_ended``),
down the chain, are run again too, naming the new jobs instead (Airflow's "clear downstream"):
a pipeline whose first step failed, and whose next steps failed without running, runs again
whole. A downstream job that has not ended is left as it is, and said (``not_ended``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpulayer.api import JobsRerun
from gpulayer.records import JobState
from gpulayer.store import JobRow, mapping, plain, queries

if TYPE_CHECKING:
    from sqlmodel import Session

    from gpulayer.control.jobs import JobOps


def rerun_jobs(plane: JobOps, job_ids: Sequence[str], owner: str | None, downstream: bool) -> JobsRerun:
    """Submit these ended jobs (``owner``'s, for a client token) again, in one transaction and
    one placement pass; see the module."""
    from gpulayer.control.jobs import job_ids_of

    ids = job_ids_of(job_ids, "rerun")
    now = plane.clock()
    started = time.perf_counter()
    with plane.store.write() as s:
        rows = queries.jobs_by_id(s, ids)
        found = [j for j in ids if j in rows and (owner is None or rows[j].owner == owner)]
        not_ended = {j: JobState(rows[j].state) for j in found if not JobState(rows[j].state).terminal}
        chosen = [rows[j] for j in found if j not in not_ended]
        if downstream and chosen:
            after, waiting = _downstream(s, chosen, owner)
            chosen += after
            not_ended.update(waiting)
        new_of: dict[str, str] = {}
        for i, row in enumerate(_in_order(chosen) if downstream else chosen):
            spec = mapping.spec(row.spec)
            if downstream:  # (the jobs run again in this call are named by their new ids)
                spec = spec.model_copy(update={"after": [new_of.get(a, a) for a in spec.after],
                                               "after_ended": [new_of.get(a, a) for a in spec.after_ended]})
            new_of[row.id] = new = plane._insert(s, spec, row.args, None, row.owner, now + i * 1e-6)
            plane._event(s, "rerun", job_id=row.id, message=f"rerun as {new}")
            plane._event(s, "rerun_of", job_id=new, message=f"rerun of {row.id}")
        result = plane._place_too(s) if new_of else None
    if new_of:
        plane._placed(result, started)
    return JobsRerun(rerun=new_of, not_ended=not_ended)


def _downstream(s: Session, roots: list[JobRow], owner: str | None) -> tuple[list[JobRow], dict[str, JobState]]:
    """The jobs stored since the first of ``roots`` that run after one of them, or after one
    of those, and so on (``owner``'s, for a client token): the ended ones, and the others' states."""
    named = {r.id for r in roots}
    since = min(r.created_at for r in roots)
    # a spec that names no job to run after has neither word (see specs._JobBase: sent only when given)
    candidates = {}
    for job_id, spec_json, state, job_owner in plain.fetch(
            s, "SELECT id, spec, state, owner FROM gl_jobs WHERE created_at >= ? AND spec LIKE ? "
               "ORDER BY created_at, id", (since, '%"after%')):
        if job_id not in named and (owner is None or job_owner == owner):
            spec = json.loads(spec_json)
            candidates[job_id] = ({*spec.get("after", ()), *spec.get("after_ended", ())}, state)
    found: list[str] = []
    while True:  # (until no job is added: one stored at the same instant as its upstream may come first)
        more = [j for j, (upstream, _) in candidates.items() if j not in named and upstream & named]
        if not more:
            break
        named.update(more)
        found += more
    ended = [j for j in found if JobState(candidates[j][1]).terminal]
    rows = queries.jobs_by_id(s, ended)
    return [rows[j] for j in ended], {j: JobState(candidates[j][1]) for j in found if j not in ended}


def _in_order(rows: list[JobRow]) -> list[JobRow]:
    """``rows`` with each job after those of them it runs after (stable otherwise), so that
    its new spec can name their new ids."""
    ids = {r.id for r in rows}
    specs = {r.id: mapping.spec(r.spec) for r in rows}
    upstream = {j: {a for a in (*spec.after, *spec.after_ended) if a in ids} for j, spec in specs.items()}
    done: set[str] = set()
    out: list[JobRow] = []
    while len(out) < len(rows):
        ready = [r for r in rows if r.id not in done and upstream[r.id] <= done]
        if not ready:  # (a cycle cannot be stored: a job names jobs that existed before it)
            ready = [r for r in rows if r.id not in done]
        out.append(ready[0])
        done.add(ready[0].id)
    return out


__all__ = ["rerun_jobs"]
