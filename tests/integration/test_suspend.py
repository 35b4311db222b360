"""A laptop that sleeps, for real processes: every GPUlayer process and every task process
stopped at once (SIGSTOP) for several heartbeat timeouts, then resumed (control/pauses.py)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpulayer.control import ControlPlane
from gpulayer.records import JobRecord, WorkerRecord
from gpulayer.store import Store
from tests.support import start_worker, wait_for

pytestmark = pytest.mark.timeout(180)

#: GPULAYER_HEARTBEAT_TIMEOUT: the stop below lasts three of them. After the resume each worker
#: has one timeout to be heard (the grace of control/pauses.py): a margin for a loaded machine
TIMEOUT = 5.0


def gpulayer(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], env=env, text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def jobs(home: Path) -> list[JobRecord]:
    """The home's jobs, as a command opening it now sees them: a fresh embedded client (a
    control plane that first writes off the workers it finds dead, then reads)."""
    store = Store(f"sqlite:///{home / 'gpulayer.db'}")
    try:
        plane = ControlPlane(store, heartbeat_timeout=TIMEOUT)
        plane.expire_workers()
        return sorted((plane.get_job(j.id) for j in plane.list_jobs()), key=lambda j: j.id)
    finally:
        store.dispose()


def online(home: Path) -> list[WorkerRecord]:
    store = Store(f"sqlite:///{home / 'gpulayer.db'}")
    try:
        return [w for w in ControlPlane(store, heartbeat_timeout=TIMEOUT).list_workers() if w.online]
    finally:
        store.dispose()


def test_a_laptop_that_sleeps_loses_no_task_and_runs_none_twice(home: Path) -> None:
    """Two workers of one home, each running a job with a retry left; every process stops
    for 15 s (three heartbeat timeouts), and `gpulayer jobs list` runs while they are stopped,
    then they all go on at once. The jobs list wrote both workers off with their tasks
    (each job ran again from the start: twice), and so did the first worker to heartbeat
    after the resume to the other. Now each task runs once, through the pause."""
    env = {**os.environ, "GPULAYER_HEARTBEAT_TIMEOUT": str(TIMEOUT), "GPULAYER_HEARTBEAT_INTERVAL": "0.2"}
    workers = [start_worker("--cpu-slots", "1", "--name", f"w{i}", env=env) for i in range(2)]
    try:
        # both registered before the submits: a detached submit that finds no worker starts one
        # in the background, which this test would not stop (awake, it would rightly write the
        # stopped ones off: what sleeps alone is silent to those that stayed awake)
        wait_for(lambda: len(online(home)) == 2, 60, "both workers registered")
        for _ in range(2):
            gpulayer("submit", "-d", "--retries", "1", "--", "sleep", "25", env=env)
        wait_for(lambda: [j.state.value for j in jobs(home)] == ["running", "running"], 60, "both jobs running")
        stopped = [p for w in workers for p in [psutil.Process(w.pid), *psutil.Process(w.pid).children(True)]]
        # stopped outside a write: a process stopped in the middle of one would hold the home's
        # write lock through the stop, and the jobs list below could not write the workers off
        # if it should (it waits for the lock, then fails: "database is locked", once in CI).
        # Holding the lock while the signals go out, this test's writer is the only one.
        with sqlite3.connect(home / "gpulayer.db", timeout=60, isolation_level=None) as db:
            db.execute("BEGIN IMMEDIATE")
            for p in stopped:
                p.send_signal(signal.SIGSTOP)
            db.execute("ROLLBACK")
        db.close()
        try:
            time.sleep(3 * TIMEOUT)
            during = jobs(home)  # (`gpulayer jobs list` first, as the workers are still stopped)
        finally:
            for p in stopped:
                p.send_signal(signal.SIGCONT)
        assert [j.state.value for j in during] == ["running", "running"], during
        ended = wait_for(lambda: (js := jobs(home)) and all(j.state.terminal for j in js) and js, 60, "both jobs ended")
        assert [(j.attempt, [t.state.value for t in j.tasks]) for j in ended] == [(1, ["succeeded"])] * 2, ended
        assert sorted(w.name for w in online(home)) == ["w0", "w1"]  # (no other worker ran meanwhile)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.communicate(timeout=30)
