"""``gpulayer worker start`` ends its CLI server when it stops, even one that does not end on
SIGTERM (once seen: a worker that waited for ever on a CLI server that was sent SIGTERM)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpulayer.cli import worker

STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


def test_a_cli_server_that_ignores_sigterm_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker, "CLI_SERVER_GRACE", 0.5)
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"  # (its SIGTERM ignored from now on)
    worker._stop_cli_server(proc)
    assert proc.returncode == -9


def test_a_cli_server_that_ends_on_sigterm_is_not_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    worker._stop_cli_server(proc)
    assert proc.returncode == -15
