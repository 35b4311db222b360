"""A silence the control plane did not watch writes no worker off: one from before the
process started (a `gpulayer jobs list` right after a laptop resumed), or one of the
process's own pause (stopped, suspended) or its clock's step (control/pauses.py)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator

import pytest

from gpulayer.control import ControlPlane
from gpulayer.control.pauses import Pauses
from gpulayer.records import TaskState
from gpulayer.specs import CommandJob
from gpulayer.store import Store
from tests.factories import Clock, make_capabilities


class Clocks(Clock):
    """The wall clock (``now``, the control plane's) and the monotonic one (``mono``)."""

    def __init__(self) -> None:
        super().__init__()
        self.mono = 5_000.0

    def run(self, seconds: float) -> None:
        """Time passes while the process runs: both clocks move."""
        self.now += seconds
        self.mono += seconds


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = Store(store_url)
    yield s
    s.dispose()


def plane(store: Store, clocks: Clocks) -> ControlPlane:
    return ControlPlane(store, heartbeat_timeout=10.0, clock=clocks,
                        pauses=Pauses(wall=clocks, monotonic=lambda: clocks.mono))


def running_job(cp: ControlPlane, worker_id: str) -> str:
    job = cp.submit(CommandJob(command=["sleep", "100"]))
    [a] = cp.poll_tasks(worker_id)
    cp.start_task(a.task_id, worker_id=worker_id)
    return job.id


def test_a_control_plane_just_made_writes_off_no_worker_for_a_silence_before_it(store: Store) -> None:
    """The laptop slept a minute with a job running; the first process to open the home
    after it (`gpulayer jobs list`) wrote the worker off with its task: lost and retried, or
    failed. Now it waits a heartbeat timeout, as a server does after its start, for the
    worker to speak; one whose process is gone it still writes off at once."""
    clocks = Clocks()
    worker_process = plane(store, clocks)
    here = socket.gethostname()
    w = worker_process.register_worker(make_capabilities(hostname=here), cpu_slots=1, pid=_live_pid())
    job_id = running_job(worker_process, w.id)
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = worker_process.register_worker(make_capabilities(hostname=here), cpu_slots=1, pid=dead.pid)
    clocks.now += 60  # asleep: the monotonic clock stands still (and this process is gone)

    cli = plane(store, clocks)
    assert cli.expire_workers() == [gone.id]  # its process is gone: at once
    assert cli.get_worker(w.id).online
    assert cli.get_job(job_id).tasks[0].state is TaskState.RUNNING
    for _ in range(11):  # watched for a timeout: a worker that stays silent is written off
        clocks.run(1)
        cli.expire_workers()
    assert not cli.get_worker(w.id).online
    assert cli.get_job(job_id).tasks[0].state is TaskState.LOST


@pytest.mark.parametrize(("wall", "mono"), [(60, 60), (60, 0), (3600, 0)],
                         ids=["stopped", "suspended", "clock-stepped-forward"])
def test_after_a_pause_of_its_own_the_first_worker_heard_writes_off_no_other(
        store: Store, wall: float, mono: float) -> None:
    """Two workers of one home; the laptop sleeps (or every process is stopped, or the
    clock steps an hour ahead). The one whose heartbeat comes first after it looked for
    silent workers, found the other silent for the whole pause and wrote it off with its
    task. Now a pause of the looking process (or a step of its clock) starts a grace of one
    heartbeat timeout; a worker silent past it is written off as before."""
    clocks = Clocks()
    first = plane(store, clocks)
    a = first.register_worker(make_capabilities(), cpu_slots=0)  # (the job goes to b)
    b = first.register_worker(make_capabilities(), cpu_slots=1)
    job_id = running_job(first, b.id)
    for _ in range(12):  # both heartbeat; the start-up grace passes
        clocks.run(1)
        first.heartbeats({a.id: [], b.id: [first.get_job(job_id).tasks[0].id]})
    clocks.now += wall
    clocks.mono += mono

    first.heartbeat(a.id)  # (which looks for silent workers: it has not for a while)
    assert first.get_worker(b.id).online
    assert first.get_job(job_id).tasks[0].state is TaskState.RUNNING
    for _ in range(14):  # b stays silent past the grace (looked for every 4 s): written off
        clocks.run(1)
        first.heartbeat(a.id)
    assert not first.get_worker(b.id).online
    assert first.get_job(job_id).tasks[0].state is TaskState.LOST


@pytest.mark.parametrize("heard", ["server", "embedded"])
def test_after_the_clock_stepped_back_a_worker_that_goes_silent_is_still_written_off(store: Store, heard: str) -> None:
    """The clock steps an hour back (NTP): every stored heartbeat is then an hour in the
    future. A worker that went silent was not written off for that hour (its task neither
    lost nor retried): no stored heartbeat was old, an embedded worker's heartbeats looked
    for silent workers only once the clock had passed the last look again, and the
    heartbeats a server answers without a read were not written (only a later one wins).
    Now a heartbeat more than a timeout ahead of the clock is no sign of life, and one
    heard now replaces it."""
    clocks = Clocks()
    server = plane(store, clocks)
    a = server.register_worker(make_capabilities(), cpu_slots=0)
    b = server.register_worker(make_capabilities(), cpu_slots=1)
    job_id = running_job(server, b.id)
    for _ in range(12):
        clocks.run(1)
        server.heartbeats({a.id: [], b.id: [server.get_job(job_id).tasks[0].id]})
    clocks.now -= 3600
    for _ in range(25):  # b has stopped; a idles
        clocks.run(1)
        if heard == "server":  # answered at once, written after; the server's expiry pass
            server.heartbeats_heard({a.id: clocks.now})
            server.expire_workers()
        else:  # an embedded worker's heartbeat, which looks for silent workers now and then
            server.heartbeat(a.id)
    assert server.get_worker(a.id).online and server.get_worker(a.id).last_heartbeat == clocks.now
    assert not server.get_worker(b.id).online
    assert server.get_job(job_id).tasks[0].state is TaskState.LOST


def test_looks_a_cadence_apart_are_no_pause() -> None:
    clocks = Clocks()
    pauses = Pauses(wall=clocks, monotonic=lambda: clocks.mono)
    assert pauses.look(5) is None  # the first
    for _ in range(10):
        clocks.run(1)
        assert pauses.look(5) is None
    clocks.run(1)
    clocks.now += 1.5  # NTP slews it by less than the limit
    assert pauses.look(5) is None
    clocks.now -= 3600  # stepped back an hour
    assert pauses.look(5) == pytest.approx(3600)


def _live_pid() -> int:
    import os

    return os.getpid()
