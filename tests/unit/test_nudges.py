"""Wake-ups between processes that share one SQLite file (gpulayer.store.nudges): the
mechanism on its own, then a wait in another process that only a nudge can end in time."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpulayer.control import ControlPlane
from gpulayer.records import JobState
from gpulayer.specs import CommandJob
from gpulayer.store import Store
from gpulayer.store.nudges import Nudges

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nudges use Linux's abstract sockets")


class Waiter:
    def __init__(self) -> None:
        self.woken = threading.Event()
        self.news: set[str] = set()

    def wake(self, news: set[str]) -> None:
        self.news |= news
        self.woken.set()


def test_a_change_nudges_the_other_processes_waiters_and_this_ones_others(tmp_path: Path) -> None:
    folder = str(tmp_path / "gpulayer.db.nudges")
    here, there = Nudges(folder), Nudges(folder)  # as two processes would have them
    try:
        a, b, c = Waiter(), Waiter(), Waiter()
        there.subscribe(a.wake)
        here.subscribe(b.wake)
        here.subscribe(c.wake)
        here.send({"j", "w:wkr-1"}, source=b.wake)  # b made the change: it knows
        assert a.woken.wait(10), "the other registered waiter was not nudged"
        assert c.woken.wait(10), "this process's other waiter was not woken"
        assert not b.woken.is_set()
        assert a.news == c.news == {"j", "w:wkr-1"}
        assert len(os.listdir(folder)) == 2
    finally:
        here.close()
        there.close()
    # closing unregisters
    assert os.listdir(folder) == []


def test_a_gone_process_is_unregistered_and_one_out_of_reach_is_kept(tmp_path: Path) -> None:
    folder = tmp_path / "gpulayer.db.nudges"
    folder.mkdir()
    gone = folder / "999999-00aa00aa00aa00aa"  # no socket by that name, and nobody holds the file
    gone.touch()
    elsewhere = folder / "999998-11bb11bb11bb11bb"  # held: alive, in another network namespace
    elsewhere.touch()
    held = os.open(elsewhere, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_SH)
    nudges = Nudges(str(folder))
    try:
        nudges.send({"j"})
        assert not gone.exists()
        assert elsewhere.exists()
        nudges.send({"j"})  # and not tried again
        assert elsewhere.name in nudges._unreachable
    finally:
        os.close(held)
        nudges.close()


def test_an_in_memory_database_or_none_has_no_nudges() -> None:
    assert Nudges.of(":memory:") is None
    assert Nudges.of(None) is None


WAITER = """
import sys
import gpulayer.control.jobs as jobs
from gpulayer.control import ControlPlane
from gpulayer.store import Store

# without a nudge this wait would look at the database again only after an hour
jobs.WAIT_FIRST_LOOK = jobs.WAIT_LONGEST_LOOK = 3600.0
cp = ControlPlane(Store(sys.argv[1]))
cp._hear_nudges()
print("ready", flush=True)
print(cp.wait_job(sys.argv[2], timeout=600).state.value, flush=True)
"""


def test_a_wait_in_another_process_ends_when_this_one_cancels_the_job(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpulayer.db'}"
    store = Store(url)
    cp = ControlPlane(store)
    job = cp.submit(CommandJob(command=["true"], placement={"on_unschedulable": "wait"}))
    script = tmp_path / "waiter.py"
    script.write_text(textwrap.dedent(WAITER))
    proc = subprocess.Popen([sys.executable, str(script), url, job.id], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # (let it read the job, still queued, and wait)
        cp.cancel(job.id)
        out, _ = proc.communicate(timeout=60)
        assert out.strip() == JobState.CANCELLED.value
    finally:
        proc.kill()
        proc.wait()
        store.dispose()


POLLER = """
import sys
import gpulayer.control.workers as workers
from gpulayer.control import ControlPlane
from gpulayer.store import Store
from tests.factories import make_capabilities

# without a nudge this poll would look at the database again only after an hour
workers.POLL_LOOK = 3600.0
cp = ControlPlane(Store(sys.argv[1]))
worker = cp.register_worker(make_capabilities(), cpu_slots=1)
cp._hear_nudges()
print(worker.id, flush=True)
print(",".join(t.job_id for t in cp.poll_work(worker.id, wait=600).tasks), flush=True)
"""


def test_a_poll_in_another_process_hears_of_the_task_this_one_placed_on_its_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpulayer.db'}"
    script = tmp_path / "poller.py"
    script.write_text(textwrap.dedent(POLLER))
    root = Path(__file__).resolve().parents[2]  # (tests.factories)
    proc = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, text=True, cwd=root,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])})
    store = Store(url)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip().startswith("wkr-")
        time.sleep(0.5)  # (let it look, find nothing, and wait)
        job = ControlPlane(store).submit(CommandJob(command=["true"]))
        out, _ = proc.communicate(timeout=60)
        assert out.strip() == job.id
    finally:
        proc.kill()
        proc.wait()
        store.dispose()


def test_news_wakes_only_the_waits_it_concerns(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'gpulayer.db'}")
    try:
        cp = ControlPlane(store)
        before = (cp._generation, cp._work_of("wkr-a"), cp._work_of("wkr-b"))
        cp._nudged({"w:wkr-a"})
        assert cp._work_of("wkr-a") != before[1] and cp._work_of("wkr-b") == before[2]
        assert cp._generation == before[0]
        cp._nudged({"e:wkr-b"})
        assert cp._work_of("wkr-b")[2] == before[2][2] + 1
        cp._nudged({"j"})
        assert cp._generation == before[0] + 1
        cp._nudged({"W"})
        assert cp._work_of("wkr-b")[0] == before[2][0] + 1
    finally:
        store.dispose()
