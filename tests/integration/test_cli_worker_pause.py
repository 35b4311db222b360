"""``gpulayer worker pause`` and ``gpulayer worker resume`` as an admin runs them on a real
``gpulayer worker start`` (embedded): a paused worker's jobs wait, and run once it is resumed."""

from __future__ import annotations

import json
import os
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
