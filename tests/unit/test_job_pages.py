"""``list_jobs(before=JOB)``: the jobs in pages, as kubectl's ``--continue`` gives them. A
list was the newest jobs alone (at most 1,000), with nothing to reach the older ones."""

from __future__ import annotations

import pytest

from gpulayer.control import ControlPlane
from gpulayer.errors import NotFound
from gpulayer.records import JobState
from gpulayer.specs import CommandJob, Placement

WAITS = Placement(target="remote", on_unschedulable="wait")


def pages(cp: ControlPlane, limit: int, **kw: object) -> list[list[str]]:
    out: list[list[str]] = []
    before = None
    for _ in range(100):  # (bounded: a cursor that did not move would loop)
        page = [j.id for j in cp.list_jobs(limit=limit, before=before, **kw)]  # type: ignore[arg-type]
        if not page:
            return out
        out.append(page)
        before = page[-1]
    raise AssertionError("the pages did not end")


def test_pages_of_jobs_submitted_at_one_instant_cover_each_job_once_in_order(cp: ControlPlane) -> None:
    """A submit_many stores its jobs at one instant: ordered by time alone, a page could
    end inside the tie and the next start anywhere in it."""
    jobs = cp.submit_many([CommandJob(command=["true"], placement=WAITS) for _ in range(7)])
    cp.clock.now += 1  # type: ignore[attr-defined]
    later = cp.submit(CommandJob(command=["true"], placement=WAITS))
    newest_first = [j.id for j in cp.list_jobs(limit=100)]
    assert newest_first[0] == later.id and sorted(newest_first) == sorted([later.id, *(j.id for j in jobs)])
    got = pages(cp, 3)
    assert [len(p) for p in got] == [3, 3, 2]
    assert [job for page in got for job in page] == newest_first
    cp.cancel(jobs[0].id)
    assert [job for page in pages(cp, 2, state=JobState.QUEUED) for job in page] == \
        [j for j in newest_first if j != jobs[0].id]


def test_a_cursor_must_be_a_job_the_caller_sees(cp: ControlPlane) -> None:
    mine = cp.submit(CommandJob(command=["true"], placement=WAITS), owner="tok-mine")
    cp.clock.now += 1  # type: ignore[attr-defined]
    theirs = cp.submit(CommandJob(command=["true"], placement=WAITS), owner="tok-theirs")
    with pytest.raises(NotFound):
        cp.list_jobs(before="job-000000000000")
    with pytest.raises(NotFound):  # (another owner's job says nothing of theirs, not even its time)
        cp.list_jobs(before=theirs.id, owner="tok-mine")
    assert [j.id for j in cp.list_jobs(before=theirs.id)] == [mine.id]
    assert cp.list_jobs(before=mine.id, owner="tok-mine") == []
