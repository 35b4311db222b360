"""``pid_alive``: what a submit and the light CLI paths ask of each local worker's pid."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gpulayer.pids import pid_alive


def test_a_running_process_is_alive_and_an_ended_one_is_not() -> None:
    assert pid_alive(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_alive(proc.pid)
    finally:
        proc.kill()
    # killed, not reaped yet: a zombie is not a live worker
    deadline = time.monotonic() + 10
    while pid_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pid_alive(proc.pid)
    proc.wait()
    assert not pid_alive(proc.pid)


def test_a_name_with_a_parenthesis_and_a_space_is_read_past(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The state follows the process's name in ``/proc/PID/stat``, which may hold ``) Z``."""
    odd = tmp_path / "x) Z (y"
    os.symlink(sys.executable, odd)
    proc = subprocess.Popen([str(odd), "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)  # (the exec done: the name is the link's)
        assert pid_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_pid_nobody_has_is_not_alive() -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    assert not pid_alive(pid_max + 1)
