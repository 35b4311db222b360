"""The CLI as the writer of a pipeline whose reader leaves early (``gpulayer jobs logs JOB |
head -1``, ``gpulayer submit -- ... | grep -q ready``): it ends quietly with 141 (128 +
SIGPIPE), as a shell reports ``cat`` ended the same way; the job is not its to end. It
exited 1, the code of a job that failed without an exit code of its own, and the light path
printed a BrokenPipeError traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import cli

LINES = 100_000  # (far more than a pipe holds: the writer is still writing when the reader leaves)


def first_line_then_leave(*args: str, env: dict[str, str] | None = None) -> tuple[str, int, str]:
    """Run ``gpulayer ARGS`` into a pipe, read its first line, close the pipe; its exit code
    and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    return line, proc.wait(120), err


@pytest.fixture
def worker(home: Path) -> Iterator[dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", "--cpu-slots", "2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the worker printed no ready line"
        yield json.loads(line)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def long_job(worker: dict[str, Any]) -> str:
    job = cli("submit", "--detach", "--", "seq", "1", str(LINES), check=True).stdout.strip()
    assert cli("jobs", "wait", job, timeout=60).returncode == 0
    return job


@pytest.mark.parametrize("words, env", [
    (["jobs", "logs"], {}),  # the light path
    (["jobs", "logs", "--follow"], {"GPULAYER_WARM_CLI": "0"}),  # Typer, in its own process
    (["jobs", "logs", "--follow"], {}),  # Typer, in the worker's CLI server's child
], ids=["light", "cold", "warm"])
def test_a_reader_that_leaves_ends_the_command_quietly_with_141(long_job: str, words: list[str],
                                                                env: dict[str, str]) -> None:
    line, code, err = first_line_then_leave(*words, long_job, env=env)
    assert line == "1\n"
    assert (code, err) == (141, "")


def test_submit_whose_reader_leaves_says_the_job_goes_on(worker: dict[str, Any]) -> None:
    line, code, err = first_line_then_leave("submit", "--", "sh", "-c", f"seq 1 {LINES}; sleep 600")
    assert line == "1\n" and code == 141, err
    job = err.split("reader left; ")[1].split()[0]
    assert f"{job} goes on (gpulayer jobs wait {job})" in err
    assert json.loads(cli("jobs", "show", job, "--json", check=True).stdout)["state"] == "running"
    cli("jobs", "cancel", job, check=True)
