"""The CLI where the standard streams cannot write every character: an ASCII locale
(``LC_ALL=C`` with ``PYTHONUTF8=0``, ``PYTHONIOENCODING=ascii``) or another encoding
(``PYTHONIOENCODING=latin-1``). Click's ``echo`` wrote UTF-8 under ASCII (and failed under
latin-1); what the CLI writes itself (the light path's ``jobs list`` and ``jobs logs``,
``submit``'s stream of the job's output) ended in a UnicodeEncodeError traceback, exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMAND = ["sh", "-c", "echo '训练 😀'; echo 'err ✓' >&2"]
#: the same output from a command of ASCII alone (an ASCII locale reads non-ASCII words as
#: bytes it cannot decode)
PRINTS = ["sh", "-c", r"printf '\350\256\255\347\273\203 \360\237\230\200\n'; printf 'err \342\234\223\n' >&2"]


def gpulayer(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIO", "PYTHONUTF8"))}
    return subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], capture_output=True, timeout=120,
                          env={**full, "GPULAYER_CLI_SERVER_IDLE": "0", **env})


@pytest.mark.parametrize("env, encoding", [
    ({"LC_ALL": "C", "PYTHONUTF8": "0"}, "utf-8"),
    ({"PYTHONIOENCODING": "ascii"}, "utf-8"),
    ({"PYTHONIOENCODING": "latin-1"}, "latin-1"),
])
def test_a_job_and_its_output_are_shown_whatever_the_streams_encoding(
        home: Path, env: dict[str, str], encoding: str) -> None:
    """ASCII streams write UTF-8 (as Click's echo did, and Python itself in the C locale);
    another encoding writes what it cannot as escapes. Every command exits 0."""
    def shown(text: str) -> bytes:
        return text.encode(encoding, "backslashreplace")

    first = gpulayer("submit", "--", *COMMAND, env={"LC_ALL": "C.UTF-8"})
    assert first.returncode == 0, first.stderr
    job = json.loads(gpulayer("jobs", "list", "--json", env={}).stdout)[0]["id"]
    submitted = gpulayer("submit", "--", *PRINTS, env=env)
    assert (submitted.returncode, submitted.stdout) == (0, shown("训练 😀\n")), submitted.stderr
    assert shown("err ✓\n") in submitted.stderr and b"Traceback" not in submitted.stderr
    listed = gpulayer("jobs", "list", env=env)  # (the light path)
    assert (listed.returncode, listed.stderr) == (0, b"") and shown(f"  sh -c {COMMAND[-1]}\n") in listed.stdout
    logs = gpulayer("jobs", "logs", job, env=env)  # (the light path)
    assert (logs.returncode, logs.stdout, logs.stderr) == (0, shown("训练 😀\n"), shown("err ✓\n"))
    show = gpulayer("jobs", "show", job, env=env)  # (the full path: Click's echo)
    assert (show.returncode, show.stderr) == (0, b"") and shown(f"command: sh -c {COMMAND[-1]}") in show.stdout
