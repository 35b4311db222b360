"""Helpers for detector plugins: run a vendor tool with a hard timeout, read small files.

Detectors run in the CLI's and the worker's own process, so anything that can hang (a
vendor tool waiting on a wedged driver) must run as a subprocess with a timeout. A timed-out
tool is killed together with its whole process group, so a tool that forks helpers cannot
keep us waiting on its pipes.

Errors form a small hierarchy so a detector can treat "not installed" (stay quiet) apart
from "installed but failed" (say so in a diagnostic). Like every error GPUlayer raises on
purpose, they derive from :class:`~gpulayer.errors.GpulayerError`::

    ToolError (GpulayerError)
    ├── ToolNotFound   the executable is not on PATH
    ├── ToolTimeout    it ran past the timeout and was killed
    └── ToolFailed     it exited non-zero (``returncode``, ``stderr`` kept)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from gpulayer.errors import GpulayerError

__all__ = [
    "ToolError",
    "ToolFailed",
    "ToolNotFound",
    "ToolTimeout",
    "env_flag",
    "read_text",
    "run_tool",
    "try_run_tool",
]


class ToolError(GpulayerError):
    """A vendor tool could not give an answer."""

    code = "tool_error"

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(f"{tool}: {message}")
        self.tool = tool


class ToolNotFound(ToolError):
    pass


class ToolTimeout(ToolError):
    pass


class ToolFailed(ToolError):
    def __init__(self, tool: str, returncode: int, stdout: str, stderr: str) -> None:
        detail = (stderr.strip() or stdout.strip()).splitlines()
        first = detail[0][:200] if detail else "no output"
        super().__init__(tool, f"exited with status {returncode}: {first}")
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        if os.name == "posix":
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover - Windows
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def run_tool(
    argv: list[str],
    timeout: float,
    *,
    input: str | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> tuple[int, str, str]:
    """Run ``argv`` and return ``(returncode, stdout, stderr)``.

    Raises :class:`ToolNotFound` when the executable is missing, :class:`ToolTimeout`
    after killing its process group when it runs past ``timeout`` seconds, and (with
    ``check``) :class:`ToolFailed` when it exits non-zero.
    """
    tool = os.path.basename(argv[0])
    exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=(env or os.environ).get("PATH"))
    if exe is None or not os.path.exists(exe):
        raise ToolNotFound(tool, "not found on PATH")
    try:
        proc = subprocess.Popen(
            [exe, *argv[1:]],
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
            start_new_session=(os.name == "posix"),
        )
    except OSError as exc:
        raise ToolFailed(tool, -1, "", str(exc)) from None
    try:
        out, err = proc.communicate(input=input, timeout=max(timeout, 0.01))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:  # pragma: no cover - pipes held by a stray child
            pass
        raise ToolTimeout(tool, f"no answer within {round(timeout, 1):g}s (killed)") from None
    if check and proc.returncode != 0:
        raise ToolFailed(tool, proc.returncode, out, err)
    return proc.returncode, out, err


def try_run_tool(argv: list[str], timeout: float) -> tuple[str | None, str | None]:
    """``(stdout, None)`` on success, ``(None, None)`` if the tool is not installed,
    ``(None, diagnostic)`` if it failed or timed out: the shape detectors want."""
    try:
        _, out, _ = run_tool(argv, timeout)
    except ToolNotFound:
        return None, None
    except ToolError as exc:
        return None, str(exc)
    return out, None


def read_text(path: str | Path) -> str | None:
    """A small sysfs/procfs file's stripped text, or None when it cannot be read."""
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return None


def env_flag(name: str) -> bool:
    """True when the environment variable is set to 1/true/yes/on."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
