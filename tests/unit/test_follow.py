"""Following a job's output: ``logs(wait=)``, the long poll that a job's output ends the
moment it is stored (in this process, and by a nudge from another), and ``Client.follow``
on it, against real databases (SQLite files; PostgreSQL where reachable)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from gpulayer.api import LogChunk, Wire
from gpulayer.client import FOLLOW_WAIT, Client
from gpulayer.control import ControlPlane
from gpulayer.control import jobs as control_jobs
from gpulayer.errors import NotFound
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob
from gpulayer.store import Store
from gpulayer.wording import Spelling, build
from tests.factories import Clock, make_capabilities

#: how long a test lets a wait run before it calls it stuck (a wait that works answers in
#: milliseconds; nothing here is a measure of time)
STUCK = 20.0


@pytest.fixture
def no_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wait for logs looks at the database again only when it is woken: its own looks at
    an interval (which would find the output too, late) are an hour apart."""
    monkeypatch.setattr(control_jobs, "WAIT_FIRST_LOOK", 3600.0)
    monkeypatch.setattr(control_jobs, "WAIT_LONGEST_LOOK", 3600.0)


def _running(cp: ControlPlane) -> tuple[str, str, str]:
    """(worker id, job id, task id) of a job whose task has started."""
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["x"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    return w.id, job.id, a.task_id


def _in_thread(call: Callable[[], Any], waiting: threading.Event) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread; ``waiting`` is set once it waits (see :func:`_signal_waits`)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    assert waiting.wait(STUCK), "the wait did not start waiting"
    return t, out


def _signal_waits(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event set whenever ``cp`` begins a wait for a job's output."""
    waiting = threading.Event()
    wait_output = cp._wait_progress

    def signalled(*args: Any) -> None:
        waiting.set()
        wait_output(*args)

    monkeypatch.setattr(cp, "_wait_progress", signalled)
    return waiting


def test_a_wait_for_logs_is_answered_by_the_output_it_waited_for(cp: ControlPlane, no_looks: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    wid, job_id, task_id = _running(cp)
    cp.append_logs(task_id, worker_id=wid, chunks=[("stdout", "one\n")])
    [first] = cp.logs(job_id, wait=30)  # there already: at once
    assert first.data == "one\n"
    waiting = _signal_waits(cp, monkeypatch)
    t, out = _in_thread(lambda: cp.logs(job_id, after=first.id, wait=30), waiting)
    cp.append_logs(task_id, worker_id=wid, chunks=[("stdout", "two\n"), ("stderr", "three\n")])
    t.join(STUCK)
    assert not t.is_alive(), "the output did not wake the wait"
    assert [(c.stream, c.data) for c in out[0]] == [("stdout", "two\n"), ("stderr", "three\n")]


def test_a_wait_for_logs_comes_back_empty_when_the_jobs_state_changes(cp: ControlPlane, no_looks: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    waiting = _signal_waits(cp, monkeypatch)
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["x"]))
    [a] = cp.poll_tasks(w.id)
    t, out = _in_thread(lambda: cp.logs(job.id, wait=30), waiting)  # assigned
    cp.start_task(a.task_id, worker_id=w.id)  # -> running: a follower shows it
    t.join(STUCK)
    assert out == [[]]
    waiting.clear()
    t, out = _in_thread(lambda: cp.logs(job.id, wait=30), waiting)
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    t.join(STUCK)
    assert out == [[]] and cp.get_job(job.id).state is JobState.SUCCEEDED
    # an ended job's page comes at once, waited for or not
    assert cp.logs(job.id, wait=30) == []


def test_a_wait_for_logs_ends_when_its_time_is_up_and_names_an_unknown_job(cp: ControlPlane) -> None:
    _, job_id, _ = _running(cp)
    assert cp.logs(job_id, wait=0.2) == []
    with pytest.raises(NotFound, match="job 'job-nope': no such job"):
        cp.logs("job-nope", wait=5)


def test_output_wakes_only_the_waits_for_its_own_job(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    wid, job_id, task_id = _running(cp)
    other = cp.submit(CommandJob(command=["y"]))
    seen = cp._progress_of(other.id)
    cp.append_logs(task_id, worker_id=wid, chunks=[("stdout", "x\n")])
    assert cp._progress_of(other.id) == seen
    assert cp._progress_of(job_id) != seen


def test_the_progress_counts_are_kept_for_a_bounded_number_of_jobs(cp: ControlPlane,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer.control import core

    monkeypatch.setattr(core, "ENDED_KEPT", 3)
    with cp._news_lock:
        for job_id in ("a", "b", "a", "c", "d"):
            cp._count_progress(job_id)
    assert list(cp._progress_count) == ["a", "c", "d"]  # b, whose output is the oldest, is gone


def test_output_stored_by_another_process_wakes_the_wait_by_a_nudge(tmp_path: Path, no_looks: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded: a ``gpulayer worker start`` stores the output, a script of the same home
    follows it. The other process here appends with a control plane of its own."""
    url = f"sqlite:///{tmp_path / 'gpulayer.db'}"
    store = Store(url)
    cp = ControlPlane(store, heartbeat_timeout=10.0, clock=Clock())
    try:
        assert store.nudges is not None, "this platform has no nudges"
        wid, job_id, task_id = _running(cp)
        waiting = _signal_waits(cp, monkeypatch)
        t, out = _in_thread(lambda: cp.logs(job_id, wait=30), waiting)
        code = ("import sys\n"
                "from gpulayer.control import ControlPlane\n"
                "from gpulayer.store import Store\n"
                "store = Store(sys.argv[1])\n"
                "ControlPlane(store).append_logs(sys.argv[2], worker_id=sys.argv[3], chunks=[('stdout', 'far\\n')])\n"
                "store.dispose()\n")
        subprocess.run([sys.executable, "-c", code, url, task_id, wid], check=True, timeout=60)
        t.join(STUCK)
        assert not t.is_alive(), "the other process's output did not wake the wait"
        assert [c.data for c in out[0]] == ["far\n"]
    finally:
        store.dispose()


# ---------------------------------------------------------------------------------- Client.follow


class OldLogsQuery(Wire):
    """The logs query of a control plane from before ``wait``."""

    after: int = Field(default=0, ge=0)
    node: int | None = None
    limit: int = 10_000


class OlderControlPlane:
    """A control plane that answers ``logs`` as one from before ``wait`` did: a query with
    ``wait`` is refused, worded as such a server words it."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.waits_refused = 0

    def logs(self, job_id: str, *, wait: float | None = None, **query: Any) -> list[LogChunk]:
        if wait is not None:
            self.waits_refused += 1
            build(OldLogsQuery, {**query, "wait": wait}, Spelling(where="query"))
            raise AssertionError("the old query took wait")
        return self.cp.logs(job_id, **query)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cp, name)


@pytest.mark.parametrize("older", [False, True], ids=["long-poll", "older-control-plane"])
def test_follow_yields_every_chunk_in_order_until_the_job_ends(cp: ControlPlane, older: bool) -> None:
    wid, job_id, task_id = _running(cp)
    api: Any = OlderControlPlane(cp) if older else cp
    client = Client(api, location="embedded", default_target="local", control=cp)
    seen: list[JobState] = []
    following = threading.Event()

    def work() -> None:
        assert following.wait(STUCK)  # (the follower saw the job running first)
        for i in range(30):
            cp.append_logs(task_id, worker_id=wid, chunks=[("stdout", f"{i}\n")])
        cp.finish_task(task_id, worker_id=wid, state=TaskState.SUCCEEDED, exit_code=0)

    waits: list[float | None] = []
    if not older:
        logs = cp.logs
        api = type("Counting", (), {"__getattr__": lambda self, name: getattr(cp, name),
                                    "logs": lambda self, job_id, **kw: (waits.append(kw.get("wait")),
                                                                        logs(job_id, **kw))[1]})()
        client = Client(api, location="embedded", default_target="local", control=cp)
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    text = "".join(c.data for c in client.follow(
        job_id, on_update=lambda job: (seen.append(job.state), following.set())))
    worker.join(STUCK)
    assert text == "".join(f"{i}\n" for i in range(30))
    assert seen[0] is JobState.RUNNING and seen[-1] is JobState.SUCCEEDED
    if older:
        assert api.waits_refused == 1  # refused once, then looked for at intervals
    else:  # long polls while it ran, and a last look without a wait once it had ended
        assert waits and set(waits[:-1]) == {FOLLOW_WAIT} and waits[-1] is None, waits


def test_follow_does_not_take_another_refusal_for_an_older_control_plane(cp: ControlPlane) -> None:
    from gpulayer.errors import InvalidInput

    calls: list[float | None] = []

    class Refusing(OlderControlPlane):
        def logs(self, job_id: str, *, wait: float | None = None, **query: Any) -> list[LogChunk]:
            calls.append(wait)
            build(OldLogsQuery, {**query, "after": -1}, Spelling(where="query"))
            raise AssertionError("after=-1 was taken")

    _, job_id, _ = _running(cp)
    client = Client(Refusing(cp), location="embedded", default_target="local", control=cp)
    with pytest.raises(InvalidInput, match=r"\bafter\b.*-1"):
        next(client.follow(job_id))
    assert len(calls) == 1  # raised as it came, not taken for an older control plane's refusal
