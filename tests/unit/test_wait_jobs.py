"""Waiting for many jobs at once: ``ControlPlane.wait_jobs`` (the records of those that have
ended, in the order given, once ``count`` of them have or the time is up), and the SDK's
``gl.wait`` and ``gl.as_completed`` built on it, end to end with a real in-process worker.
The HTTP route is tested against a real server in tests/integration/test_server_api.py.

No test here measures time. A wait that should answer at once is given a long timeout and
the test a shorter pytest-timeout: one that waited the whole timeout instead fails as a hang.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.control import ControlPlane
from gpulayer.control import jobs as control_jobs
from gpulayer.errors import InvalidArgument, InvalidInput, NotFound
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob, Placement, Requirements
from gpulayer.store import Store, plain
from tests.factories import Clock, cuda_caps, gpu_job, make_capabilities
from tests.support import job_module

WAIT = Placement(on_unschedulable="wait")
#: a wait that should answer long before this; the tests that use it are bounded by HANG
LONG = 120.0
HANG = pytest.mark.timeout(60)


def ids(records: list[Any]) -> list[str]:
    return [r.id for r in records]


def queued(cp: ControlPlane, n: int, **kw: Any) -> list[str]:
    """``n`` jobs that stay queued (a GPU job and no GPU worker), by id."""
    return [cp.submit(gpu_job(placement=WAIT), **kw).id for _ in range(n)]


class Waits:
    """Counts the times a control plane's waits went to sleep for a change (``_wait_change``):
    :meth:`until` tells when a wait started in another thread has made its look and waits,
    instead of a sleep that guesses how long that takes."""

    def __init__(self, cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.changed = threading.Condition()
        real = cp._wait_change

        def counted(generation: int, timeout: float) -> None:
            with self.changed:
                self.count += 1
                self.changed.notify_all()
            real(generation, timeout)

        monkeypatch.setattr(cp, "_wait_change", counted)

    def until(self, n: int, thread: threading.Thread) -> None:
        """Until the waits went to sleep ``n`` times in all, or ``thread`` ended (30 s at most:
        the tests that use it are bounded by HANG)."""
        deadline = time.monotonic() + 30
        with self.changed:
            while self.count < n and thread.is_alive() and time.monotonic() < deadline:
                self.changed.wait(0.05)  # (a thread that ends says nothing: look again)
        assert self.count >= n or not thread.is_alive(), f"the wait went to sleep {self.count} time(s) in 30 s, not {n}"


def run_to_end(cp: ControlPlane, worker_id: str, job_id: str, state: TaskState = TaskState.SUCCEEDED,
               exit_code: int = 0) -> None:
    """Start and finish the task assigned to ``worker_id`` for ``job_id``."""
    [a] = [a for a in cp.poll_tasks(worker_id) if a.job_id == job_id]
    cp.start_task(a.task_id, worker_id=worker_id)
    cp.finish_task(a.task_id, worker_id=worker_id, state=state, exit_code=exit_code)


# --------------------------------------------------------------------------- the control plane


def test_the_records_follow_the_order_of_the_ids_not_the_order_of_the_ends(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(2), cpu_slots=0)
    a, b = cp.submit(gpu_job()).id, cp.submit(gpu_job()).id  # both assigned to w
    c, d = queued(cp, 2)  # no device left: they wait
    cp.cancel(d)                                             # d ends first,
    run_to_end(cp, w.id, b, TaskState.FAILED, exit_code=3)   # then b,
    run_to_end(cp, w.id, a)                                  # then a; c never does
    got = cp.wait_jobs([a, b, c, d], count=3, timeout=0)
    assert ids(got) == [a, b, d]
    assert [(r.state, r.exit_code) for r in got] == [(JobState.SUCCEEDED, 0), (JobState.FAILED, 3),
                                                     (JobState.CANCELLED, None)]
    assert ids(cp.wait_jobs([d, c, b, a], count=3, timeout=0)) == [d, b, a]
    assert ids(cp.wait_jobs([c, a], count=1, timeout=0)) == [a]


def test_an_unschedulable_job_has_ended(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=1)
    never = cp.submit(gpu_job())  # no worker could ever run it
    assert never.state is JobState.UNSCHEDULABLE
    [waiting] = queued(cp, 1)
    assert [(r.id, r.state) for r in cp.wait_jobs([waiting, never.id], timeout=0)] == \
        [(never.id, JobState.UNSCHEDULABLE)]


@HANG
def test_count_one_answers_as_soon_as_one_has_ended(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    a, b, c = queued(cp, 3)
    # with no time to wait it is a look: none has ended
    assert cp.wait_jobs([a, b, c], count=1, timeout=0) == []
    cp.cancel(b)
    # one of three has ended: that is enough, it does not wait for the others
    got = cp.wait_jobs([a, b, c], count=1, timeout=LONG)
    assert ids(got) == [b] and got[0].state is JobState.CANCELLED
    assert ids(cp.wait_jobs([a, b, c], timeout=LONG)) == [b]  # count defaults to 1


@HANG
def test_a_count_larger_than_the_jobs_means_all_of_them(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    a, b, c = queued(cp, 3)
    cp.cancel(a)
    cp.cancel(c)
    # all of [a, c] have ended: 1000 asked, 2 given, they are all
    assert ids(cp.wait_jobs([c, a], count=1000, timeout=LONG)) == [c, a]
    # but not all of [a, b, c]: with no time to wait, what has ended
    assert ids(cp.wait_jobs([a, b, c], count=1000, timeout=0)) == [a, c]


def test_a_wait_that_runs_out_of_time_answers_what_ended_by_then(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    a, b, c = queued(cp, 3)
    assert cp.wait_jobs([a, b, c], count=1, timeout=0.2) == []
    cp.cancel(b)
    got = cp.wait_jobs([a, b, c], count=2, timeout=0.2)
    assert ids(got) == [b] and got[0].state is JobState.CANCELLED
    # the others are as they were
    assert {cp.get_job(j).state for j in (a, c)} == {JobState.QUEUED}


@HANG
def test_a_job_ended_by_another_thread_wakes_the_wait(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    a = cp.submit(gpu_job()).id  # assigned
    b, c = queued(cp, 2)
    [task] = cp.poll_tasks(w.id)
    cp.start_task(task.task_id, worker_id=w.id)
    waits = Waits(cp, monkeypatch)
    errors: list[BaseException] = []
    main = threading.current_thread()

    def finish() -> None:
        try:
            waits.until(1, main)  # (the wait has looked, and waits)
            cp.finish_task(task.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=finish)
    t.start()
    try:
        got = cp.wait_jobs([b, a, c], count=1, timeout=LONG)
    finally:
        t.join(30)
    assert not errors
    assert ids(got) == [a]
    assert (got[0].state, got[0].exit_code) == (JobState.SUCCEEDED, 0)


@HANG
def test_jobs_that_end_one_by_one_while_it_waits_are_all_answered(cp: ControlPlane,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The looks after the first read only the jobs not yet ended, in chunks (IN_CHUNK made
    small here): each end is seen, whichever chunk it is in. (Every look at the database:
    the news of the changes, which would name the jobs, is not heard here.)"""
    monkeypatch.setattr(plain, "IN_CHUNK", 2)
    monkeypatch.setattr(ControlPlane, "ended_news", lambda *_: None)
    cp.register_worker(make_capabilities(), cpu_slots=0)
    jobs = queued(cp, 5)
    errors: list[BaseException] = []

    def cancel_some() -> None:
        try:
            for j in (jobs[4], jobs[1], jobs[3]):
                time.sleep(0.1)
                cp.cancel(j)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=cancel_some)
    t.start()
    try:
        got = cp.wait_jobs(jobs, count=3, timeout=LONG)
    finally:
        t.join(30)
    assert not errors
    assert ids(got) == [jobs[1], jobs[3], jobs[4]]
    assert {r.state for r in got} == {JobState.CANCELLED}


@HANG
def test_each_job_is_waited_for_once_whatever_the_duplicates(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    a, b = queued(cp, 2)
    cp.cancel(a)
    # [a, a] is one job, which has ended: a count of 3 (or 2) is all of it
    assert ids(cp.wait_jobs([a, a], count=3, timeout=LONG)) == [a]
    assert ids(cp.wait_jobs([a, a, a], count=2, timeout=LONG)) == [a]
    # [b, a, b, a] is b and a, in that order; only a has ended
    assert ids(cp.wait_jobs([b, a, b, a], count=2, timeout=0)) == [a]
    cp.cancel(b)
    assert ids(cp.wait_jobs([b, a, b, a], count=4, timeout=LONG)) == [b, a]


def test_an_unknown_id_is_not_found(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    [a] = queued(cp, 1)
    cp.cancel(a)
    with pytest.raises(NotFound, match=r"^job 'job-nope': no such job$"):
        cp.wait_jobs([a, "job-nope"], count=1, timeout=0)
    with pytest.raises(NotFound, match=r"^job 'job-nope': no such job$"):
        cp.wait_jobs(["job-nope"], timeout=LONG)


def test_another_owners_job_is_not_found(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    [theirs] = queued(cp, 1, owner="a")
    [mine] = queued(cp, 1, owner="b")
    cp.cancel(theirs)
    cp.cancel(mine)
    with pytest.raises(NotFound, match=rf"^job '{theirs}': no such job$"):
        cp.wait_jobs([theirs], owner="b", timeout=0)
    with pytest.raises(NotFound, match=rf"^job '{theirs}': no such job$"):
        cp.wait_jobs([mine, theirs], owner="b", count=1, timeout=0)
    # the owner sees its own, and the admin (no owner) sees every one
    assert ids(cp.wait_jobs([mine], owner="b", timeout=0)) == [mine]
    assert ids(cp.wait_jobs([theirs], owner="a", timeout=0)) == [theirs]
    assert ids(cp.wait_jobs([mine, theirs], count=2, timeout=0)) == [mine, theirs]


def test_no_ids_and_too_many_are_refused(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInput, match=r"^job_ids: empty"):
        cp.wait_jobs([], timeout=0)
    cp.register_worker(make_capabilities(), cpu_slots=0)
    monkeypatch.setattr(control_jobs, "MAX_BATCH", 3)
    jobs = queued(cp, 4)
    with pytest.raises(InvalidInput, match=r"^job_ids: 4 jobs, over the limit of 3"):
        cp.wait_jobs(jobs, timeout=0)
    # refused before any is looked up: unknown ids over the limit are too many, not missing
    with pytest.raises(InvalidInput, match="over the limit of 3"):
        cp.wait_jobs([f"job-{i}" for i in range(4)], timeout=0)
    # the limit itself is taken, and duplicates count once
    assert cp.wait_jobs(jobs[:3], timeout=0) == []
    assert cp.wait_jobs([*jobs[:3], jobs[0]], timeout=0) == []


# --------------------------------------------------------------------------- the news of a change


class Looks:
    """Counts a control plane's looks at the database for a wait (``jobs_ended``)."""

    def __init__(self, cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = cp.jobs_ended

        def counted(*args: Any, **kw: Any) -> set[str]:
            self.count += 1
            return real(*args, **kw)

        monkeypatch.setattr(cp, "jobs_ended", counted)


def waiting_for(cp: ControlPlane, job_ids: list[str], count: int) -> tuple[threading.Thread, list[Any]]:
    """A thread waiting for ``count`` of these jobs, and what its wait answered (once it has)."""
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(cp.wait_jobs(job_ids, count=count, timeout=LONG)))
    t.start()
    return t, got


@pytest.fixture
def no_looks_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait that looks at the database only when a change's news cannot say which jobs
    ended (not because time went by: a full look after WAIT_LONGEST_LOOK, or after a wait
    that no change ended)."""
    monkeypatch.setattr(control_jobs, "WAIT_FIRST_LOOK", LONG)
    monkeypatch.setattr(control_jobs, "WAIT_LONGEST_LOOK", LONG)


@HANG
def test_a_wait_hears_from_the_changes_which_jobs_ended_without_looking_again(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch, no_looks_of_its_own: None) -> None:
    """After its first look, a wait for many jobs learns which ended from the changes that
    ended them (cancels, and a task's report), not by reading their states again."""
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    a = cp.submit(gpu_job()).id  # assigned to w
    b, c = queued(cp, 2)
    looks = Looks(cp, monkeypatch)
    waits = Waits(cp, monkeypatch)
    t, got = waiting_for(cp, [a, b, c], count=3)
    waits.until(1, t)  # (it has made its first look, and waits)
    cp.cancel(c)
    run_to_end(cp, w.id, a)
    cp.cancel(b)
    t.join(30)
    assert [ids(g) for g in got] == [[a, b, c]]
    assert [r.state for r in got[0]] == [JobState.SUCCEEDED, JobState.CANCELLED, JobState.CANCELLED]
    assert looks.count == 1  # the first look alone


@HANG
def test_a_change_that_does_not_name_the_jobs_it_ended_makes_the_wait_look(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch, no_looks_of_its_own: None) -> None:
    """A nudge of another process that does not say which jobs it ended (an older version,
    or one that ended too many to name) sends the wait to the database; one that names
    other jobs does not end it."""
    cp.register_worker(make_capabilities(), cpu_slots=0)
    a, b = queued(cp, 2)
    looks = Looks(cp, monkeypatch)
    waits = Waits(cp, monkeypatch)
    t, got = waiting_for(cp, [a], count=1)
    waits.until(1, t)  # (it has made its first look, and waits)
    # another process ended ``a`` (written here behind this control plane's back)
    with cp.store.write() as s:
        plain.update_job(s, a, state=JobState.CANCELLED.value)
    cp.store.take_ended()  # (that process's to say, not this one's)
    cp._nudged({"J", f"x:{b}"})  # names b alone: the wait goes on
    waits.until(2, t)  # (it heard the news, and waits again: or it answered)
    assert t.is_alive() and looks.count == 1
    cp._nudged({"j"})  # names none: the wait looks, and sees a
    t.join(30)
    assert [ids(g) for g in got] == [[a]]
    assert looks.count == 2


@HANG
def test_a_wait_on_jobs_the_last_one_looked_at_starts_from_its_look(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch, no_looks_of_its_own: None) -> None:
    """``gl.as_completed`` waits again and again, each time on the jobs the last wait left:
    each starts from the last one's look and the news since, and reads no state again."""
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    a = cp.submit(gpu_job()).id  # assigned to w
    b, c, d = queued(cp, 3)
    looks = Looks(cp, monkeypatch)
    cp.cancel(d)
    assert ids(cp.wait_jobs([a, b, c, d], count=1, timeout=LONG)) == [d]
    assert looks.count == 1
    run_to_end(cp, w.id, a)  # (b is assigned in a's place)
    assert ids(cp.wait_jobs([a, b, c], count=1, timeout=LONG)) == [a]
    waits = Waits(cp, monkeypatch)
    t, got = waiting_for(cp, [b, c], count=1)  # nothing ended yet: it waits for the news
    waits.until(1, t)
    cp.cancel(c)
    t.join(30)
    assert [ids(g) for g in got] == [[c]]
    assert ids(cp.wait_jobs([b], count=1, timeout=0)) == []
    assert looks.count == 1


def test_a_wait_looks_again_where_the_last_look_cannot_say(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """It reads every state again for a job the last look did not cover, for another owner,
    after a change that did not name the jobs it ended, and once the last look is
    WAIT_LONGEST_LOOK old; and a job ended behind its back (no news at all) is still
    found by the wait's next look."""
    cp.register_worker(make_capabilities(), cpu_slots=0)
    a, b = queued(cp, 2, owner="o")
    [c] = queued(cp, 1)
    looks = Looks(cp, monkeypatch)
    assert cp.wait_jobs([a], owner="o", timeout=0) == []
    assert looks.count == 1
    assert cp.wait_jobs([a, b], owner="o", timeout=0) == []  # b was not looked at
    assert looks.count == 2
    with pytest.raises(NotFound, match=rf"^job '{c}': no such job$"):  # another owner's look: c is not o's
        cp.wait_jobs([a, c], owner="o", timeout=0)
    assert cp.wait_jobs([a, b], timeout=0) == []  # every owner's
    assert looks.count == 4
    cp._nudged({"j"})  # a change that named none
    assert cp.wait_jobs([a], timeout=0) == []
    assert looks.count == 5
    # ended behind this control plane's back, and heard of by nobody
    with cp.store.write() as s:
        plain.update_job(s, a, state=JobState.CANCELLED.value)
    cp.store.take_ended()
    assert ids(cp.wait_jobs([a], count=1, timeout=LONG)) == [a]  # found by a later look
    monkeypatch.setattr(control_jobs, "WAIT_LONGEST_LOOK", 0.0)
    before = looks.count
    assert ids(cp.wait_jobs([a, b], count=1, timeout=0)) == [a]  # the last look is too old
    assert looks.count == before + 1


def test_a_change_says_which_jobs_it_ended_once_it_committed(cp: ControlPlane) -> None:
    cp.register_worker(make_capabilities(), cpu_slots=0)
    a, b = queued(cp, 2)
    with pytest.raises(RuntimeError), cp.store.write() as s:
        plain.update_job(s, a, state=JobState.FAILED.value)
        raise RuntimeError("rolled back")
    assert cp.store.take_ended() == frozenset()
    before = cp.changes()
    cp.cancel(b)
    assert cp.changes() > before
    assert cp.ended_news(frozenset({a, b}), before, time.monotonic()) == {b}
    assert cp.store.take_ended() == frozenset()  # (said once)


def test_a_nudge_names_the_jobs_a_change_ended_unless_there_are_too_many(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What another process hears (gpulayer.store.nudges): "J" and each ended job as "x:ID";
    a change that ended more than a nudge can name says "j" (the waits look)."""
    store = Store(f"sqlite:///{tmp_path / 'gpulayer.db'}")
    assert store.nudges is not None
    cp = ControlPlane(store, heartbeat_timeout=10.0, clock=Clock())
    sent: list[set[str]] = []
    monkeypatch.setattr(store.nudges, "send", lambda news, source=None: sent.append(set(news)))
    try:
        cp.register_worker(make_capabilities(), cpu_slots=0)
        [a] = queued(cp, 1)
        cp.cancel(a)
        assert {"J", f"x:{a}"} <= sent[-1] and "j" not in sent[-1]
        # too many to name (MAX_NEWS bytes): 500 jobs that no worker can ever run fail in one pass
        cp.submit_many([gpu_job() for _ in range(500)])
        assert "j" in sent[-1] and "J" not in sent[-1]
        assert not any(n.startswith("x:") for n in sent[-1])
    finally:
        store.dispose()


# --------------------------------------------------------------------------- gl.wait and gl.as_completed

MODULE = """
import os
import time

import gpulayer as gl


@gl.remote
def nap(seconds, tag):
    time.sleep(seconds)
    return tag


@gl.remote
def nap_until(path, tag, longest=60.0):
    # until the file at path exists (longest seconds at most)
    deadline = time.monotonic() + longest
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return tag
"""

#: no worker serves the remote target in an embedded home: such a job stays queued
REMOTE_WAIT = Placement(target="remote", on_unschedulable="wait")


@pytest.fixture
def napmod(gpulayer_isolated: None, probes_seeded: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A module with a @gl.remote function that sleeps, in a directory of its own (its
    bundle), imported; the in-process worker runs two jobs at once."""
    monkeypatch.setenv("GPULAYER_CPU_SLOTS", "2")
    with job_module(tmp_path, monkeypatch, "napmod", MODULE) as module:
        yield module


def never_runs() -> gl.JobHandle:
    """A job that stays queued in an embedded home (nothing runs on the remote target)."""
    return gl.submit(CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", gpus=1),
                                placement=REMOTE_WAIT))


def end(*handles: gl.JobHandle) -> None:
    for h in handles:
        h.cancel()
    gl.wait(handles, timeout=60)


def test_gl_wait_answers_every_handle_in_its_order_with_its_result(napmod: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    handles = napmod.nap.map([0, 0, 0], ["a", "b", "c"])
    api = client_mod.connect().api
    asked: list[list[str]] = []
    real = api.wait_jobs
    monkeypatch.setattr(api, "wait_jobs", lambda job_ids, **kw: asked.append(list(job_ids)) or real(job_ids, **kw))
    a, b, c = handles
    records = gl.wait([c, a, b, a], timeout=LONG)
    assert ids(records) == [c.id, a.id, b.id, a.id]
    assert [r.state for r in records] == [JobState.SUCCEEDED] * 4
    assert [r.result for r in records] == ["c", "a", "b", "a"]
    # together, each job once
    assert asked and all(sorted(set(run)) == sorted(run) for run in asked)
    assert set(asked[0]) == {a.id, b.id, c.id}
    assert gl.wait([]) == []


def test_gl_wait_that_runs_out_of_time_names_a_job_still_running(napmod: Any) -> None:
    slow = napmod.nap.remote(60, "slow")
    queued_one = never_runs()
    try:
        with pytest.raises(TimeoutError) as one:
            gl.wait([slow], timeout=0.3)
        assert re.fullmatch(rf"job {slow.id} is still (queued|assigned|running) after 0\.3 s",
                            str(one.value)), str(one.value)
        with pytest.raises(TimeoutError) as two:
            gl.wait([queued_one, slow], timeout=0.2)
        assert str(two.value) == f"job {queued_one.id} is still queued after 0.2 s (1 more not ended)"
        with pytest.raises(TimeoutError, match=rf"^job {queued_one.id} is still queued after 0 s$"):
            gl.wait([queued_one], timeout=0)
    finally:
        end(slow, queued_one)
    assert {h.status() for h in (slow, queued_one)} == {"cancelled"}


def test_as_completed_yields_the_first_to_end_first_and_runs_out_of_time(napmod: Any, tmp_path: Path) -> None:
    # submitted first, ends last: only once the first handle came (fast ends however late)
    go = tmp_path / "go"
    slow = napmod.nap_until.remote(str(go), "slow")
    fast = napmod.nap.remote(0.0, "fast")
    completed = gl.as_completed([slow, fast], timeout=LONG)
    done = [next(completed)]
    go.touch()
    done += list(completed)
    assert [h.id for h in done] == [fast.id, slow.id]
    assert [h.result(timeout=0) for h in done] == ["fast", "slow"]
    # ended jobs come back at once, in the order given
    assert [h.id for h in gl.as_completed([slow, fast], timeout=LONG)] == [slow.id, fast.id]
    # time runs out: what ended is yielded, then the error counts what did not
    waiting = [never_runs(), never_runs()]
    seen: list[str] = []
    try:
        with pytest.raises(TimeoutError, match=r"^2 job\(s\) still running after 0\.3 s$"):
            for h in gl.as_completed([waiting[0], fast, waiting[1]], timeout=0.3):
                seen.append(h.id)
        assert seen == [fast.id]
    finally:
        end(*waiting)
    assert list(gl.as_completed([])) == []


def test_as_completed_yields_a_job_given_twice_once(gpulayer_isolated: None) -> None:
    """Two handles of one job (gl.get_job(ID) and the submit's) were yielded twice; they are
    equal, and the job is yielded once (its first handle), as concurrent.futures.as_completed
    does; gl.wait and gl.cancel answer a record for each handle given."""
    ended, waiting = never_runs(), never_runs()
    twin = gl.get_job(ended.id)
    assert gl.cancel([ended, twin])[1].state is JobState.CANCELLED
    try:
        given = [twin, ended, twin]
        out = list(gl.as_completed(given, timeout=LONG))
        assert out == [twin] and out[0] is twin
        assert [r.id for r in gl.wait(given, timeout=LONG)] == [ended.id] * 3
        seen: list[gl.JobHandle] = []
        with pytest.raises(TimeoutError, match=r"^1 job\(s\) still running after 0 s$"):
            for h in gl.as_completed([waiting, ended, gl.get_job(waiting.id), twin], timeout=0):
                seen.append(h)
        assert seen == [ended]
    finally:
        end(waiting)


def test_as_completed_with_no_time_to_wait_yields_the_jobs_that_have_ended(gpulayer_isolated: None) -> None:
    """As gl.wait(handles, timeout=0) and handle.wait(timeout=0): a look, not an error, when
    every job has ended."""
    ended, waiting = never_runs(), never_runs()
    ended.cancel()
    try:
        assert [h.id for h in gl.as_completed([ended], timeout=0)] == [ended.id]
        seen: list[str] = []
        with pytest.raises(TimeoutError, match=r"^1 job\(s\) still running after 0 s$"):
            for h in gl.as_completed([waiting, ended], timeout=0):
                seen.append(h.id)
        assert seen == [ended.id]
    finally:
        end(waiting)


def test_as_completed_asks_for_brief_records_and_falls_back_where_they_are_not_known(
        gpulayer_isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """It only hands out which jobs ended: the records it asks for carry no results or
    arguments. A control plane from before ``brief`` refuses it (as a server words an
    unknown query field); it then asks as before, and does not try again."""
    done, waiting = never_runs(), never_runs()
    done.cancel()
    client = client_mod.connect()
    real = client.api.wait_jobs
    asked: list[object] = []

    def older(job_ids: list[str], **kw: Any) -> Any:
        asked.append(kw.get("brief"))
        if "brief" in kw:
            raise InvalidInput("query.brief='true': no such field; accepted: count, timeout")
        return real(job_ids, **kw)

    try:
        assert [h.id for h in gl.as_completed([done], timeout=LONG)] == [done.id]
        monkeypatch.setattr(client.api, "wait_jobs", lambda job_ids, **kw: asked.append(kw.get("brief")) or real(job_ids, **kw))
        assert [h.id for h in gl.as_completed([done], timeout=LONG)] == [done.id]
        assert asked == [True]
        asked.clear()
        monkeypatch.setattr(client.api, "wait_jobs", older)
        for _ in range(2):
            assert [h.id for h in gl.as_completed([done], timeout=LONG)] == [done.id]
        assert asked == [True, None, None]  # refused once, then asked as before
        with pytest.raises(TimeoutError):  # (and still waits as it did)
            list(gl.as_completed([waiting], timeout=0))
    finally:
        end(waiting)


@pytest.mark.parametrize("timeout", ["5", -1, float("nan"), True, [1]])
def test_a_wait_s_timeout_that_is_no_number_of_seconds_is_refused_naming_the_call(
        timeout: Any, gpulayer_isolated: None) -> None:
    queued = never_runs()
    calls = {"handle.wait": lambda: queued.wait(timeout), "handle.result": lambda: queued.result(timeout=timeout),
             "gl.wait": lambda: gl.wait([queued], timeout=timeout),
             "gl.as_completed": lambda: list(gl.as_completed([queued], timeout=timeout))}
    for who, call in calls.items():
        with pytest.raises(InvalidArgument, match=re.escape(f"{who}(timeout={timeout!r}): accepted: a number of "
                                                               "seconds, 0 or more, or None")):
            call()
    with pytest.raises(TimeoutError):
        queued.wait(0)  # (0 looks once; an infinite one is no limit, as None)
    queued.cancel()
    assert queued.wait(float("inf")).state is JobState.CANCELLED


def test_a_spec_or_client_of_the_wrong_kind_is_refused_naming_the_call(gpulayer_isolated: None) -> None:
    with pytest.raises(InvalidArgument, match=r"^gl.submit: the spec is dict; accepted: CommandJob, FunctionJob"):
        gl.submit({"kind": "command", "command": ["true"]})  # type: ignore[arg-type]
    job = CommandJob(command=["true"], placement=REMOTE_WAIT)
    for who, call in {"gl.submit": lambda: gl.submit(job, client="x"),  # type: ignore[arg-type]
                      "gl.submit_many": lambda: gl.submit_many([job], client="x"),  # type: ignore[arg-type]
                      "gl.explain": lambda: gl.explain(job, client="x")}.items():  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=re.escape(f"{who}(client='x'): not a client; accepted: what "
                                                               "gl.connect() returns")):
            call()
    assert client_mod.connect().api.list_jobs() == []
