"""``gpulayer worker pause`` and ``gpulayer worker resume`` as an admin runs them on a real
``gpulayer worker start`` (embedded): a paused worker's jobs wait, and run once it is resumed; and a worker
stopped before it serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.server_support import stop_proc
from tests.support import cli


def test_a_paused_worker_leaves_jobs_waiting_until_it_is_resumed(home: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", "--cpu-slots", "1", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the worker printed no ready line"
        worker = json.loads(line)["id"]

        paused = cli("worker", "pause", worker, check=True)
        assert paused.stdout == f"{worker} paused: it takes no new work\n"
        listed = json.loads(cli("worker", "list", "--json", check=True).stdout)
        assert [w["state"] for w in listed if w["id"] == worker] == ["paused"]
        job = cli("submit", "--detach", "--", "true", check=True).stdout.strip()
        time.sleep(1)  # (the worker would have taken it by now)
        shown = json.loads(cli("jobs", "show", job, "--json", check=True).stdout)
        assert shown["state"] == "queued", shown
        assert any(r["code"] == "paused" for r in shown["decision"]["reasons"]), shown["decision"]

        assert json.loads(cli("worker", "resume", worker, "--json", check=True).stdout) == [
            {"id": worker, "paused": False, "online": True}]
        assert cli("jobs", "wait", job, "--timeout", "60", timeout=90).returncode == 0
    finally:
        stop_proc(proc)


def test_pausing_a_worker_that_does_not_exist_exits_2(home: Path) -> None:
    proc = cli("worker", "pause", "wkr-000000000000")
    assert proc.returncode == 2 and "worker 'wkr-000000000000': no such worker" in proc.stderr, proc.stderr


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (its SigCgt mask, /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(line.split()[1] for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught, 16) & (1 << (15 - 1)))


def test_a_worker_sent_sigterm_before_it_serves_stops_cleanly(home: Path, tmp_path: Path) -> None:
    """A SIGTERM during a worker's start (its detection, its join) killed it (exit -15), and
    its record stayed online until its heartbeats were missed; now it stops as soon as it
    serves: drained, deregistered, exit 0."""
    log = tmp_path / "worker.err"
    with open(log, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", "--cpu-slots", "1"],
                                stdout=subprocess.DEVNULL, stderr=err_file, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while not _catches_sigterm(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        early = "serving" not in log.read_text()  # (its handler was there before it served: the window)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        stop_proc(proc)
    err = log.read_text()
    assert early, f"the worker caught SIGTERM only once it served:\n{err}"
    assert proc.returncode == 0, err
    assert err.rstrip().endswith("worker: stopped"), err
    listed = json.loads(cli("worker", "list", "--json", check=True).stdout)
    assert [w["state"] for w in listed] in ([], ["offline"]), listed
