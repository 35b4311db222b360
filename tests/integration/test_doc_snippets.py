"""Every snippet of README.md and docs/*.md runs exactly as written (issue 13 §1), in a fresh
``$GPULAYER_HOME``; one that cannot run here says why in its page (tests/docsnippets.py
has the marker syntax, tests/unit/test_docs.py checks every marker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.cli import warm
from gpulayer.testing import no_real_devices_env
from tests.docsnippets import ROOT, Snippet, snippets

RUN = [s for s in snippets() if s.marker != "not run" and "by" not in s.options]


def _env(home: Path, bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env.update(no_real_devices_env())
    env["GPULAYER_HOME"] = str(home)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "plugins"), env.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "200"
    return env


@pytest.fixture
def where(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh directory (also the ``$GPULAYER_HOME``) and ``gpulayer``/``python`` that run this
    checkout; afterwards, the CLI server a snippet's command started there (as a user's
    does: gpulayer.cli.warm) is stopped."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, argv in (("gpulayer", f'"{sys.executable}" -m gpulayer.cli'), ("python", f'"{sys.executable}"')):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    yield work, _env(work, bin_dir)
    pid = warm.server_pid(str(work))
    if pid is not None:
        os.kill(pid, signal.SIGTERM)


def _argv(snippet: Snippet, command: str, cwd: Path) -> list[str]:
    if snippet.lang == "python":
        (cwd / "main.py").write_text(snippet.body)
        return [sys.executable, "main.py"]
    return ["bash", "-e", "-c", command]


def _run_until(argv: list[str], cwd: Path, env: dict[str, str], text: str, timeout: float) -> str:
    """Start a long-running snippet, return its output once ``text`` appears, then stop it."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    seen = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and text.encode() not in seen:
            chunk = proc.stdout.read()
            if chunk:
                seen += chunk
            elif proc.poll() is not None:
                break
            else:
                time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    return seen.decode(errors="replace")


@pytest.mark.parametrize("snippet", RUN, ids=lambda s: s.id)
def test_snippet_runs_as_written(snippet: Snippet, where: tuple[Path, dict[str, str]]) -> None:
    cwd, env = where
    for command, shown in snippet.commands():
        argv = _argv(snippet, command, cwd)
        if "until" in snippet.options:
            out = _run_until(argv, cwd, env, snippet.options["until"], snippet.timeout)
            # (the snippets start servers on the documented ports, 8765 and the dashboard's:
            # one a developer runs on this machine takes the port first)
            busy = ("\nanother process on this machine listens on the port the snippet uses (your own "
                    "gpulayer server?): stop it and run the test again" if "address already in use" in out else "")
            assert snippet.options["until"] in out, f"{snippet.id}: {command!r} never printed " \
                f"{snippet.options['until']!r}:\n{out}{busy}"
            continue
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=snippet.timeout)
        assert proc.returncode == snippet.exit_code, \
            f"{snippet.id}: {command!r} exited {proc.returncode}, not {snippet.exit_code}:\n{proc.stdout}"
        if "output" in snippet.options:
            assert proc.stdout.splitlines() == shown, f"{snippet.id}: {command!r} printed:\n{proc.stdout}"
