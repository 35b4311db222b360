"""Helpers for tests that drive GPUlayer as a user would: the CLI and workers as subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
        cwd: str | Path | None = None, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``gpulayer ARGS`` as a subprocess of this test's Python."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], env=full_env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"gpulayer {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
