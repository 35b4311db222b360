"""What ``gpulayer submit`` shows while someone waits: a live status line on a terminal (a
real pseudo-terminal here), plain lines when stderr is a pipe. Embedded control plane."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support import Terminal, cli, start_worker, wait_for

STATUS = re.compile(r"^gpulayer: (job-[0-9a-f]+) (\w+)")


def blocker(release: Path) -> list[str]:
    """A command that runs until ``release`` exists (a bounded loop)."""
    return ["sh", "-c", f"i=0; while [ ! -e {release} ] && [ $i -lt 12000 ]; do sleep 0.05; i=$((i+1)); done"]


def test_piped_the_status_is_plain_lines_and_the_end_comes_after_the_output(home: Path) -> None:
    proc = cli("submit", "--", "sh", "-c", "echo out; echo err >&2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "out\n"
    assert "\x1b" not in proc.stderr  # no escape codes in a pipe
    lines = proc.stderr.splitlines()
    states = [m.group(2) for line in lines if (m := STATUS.match(line))]
    assert states[-1] == "succeeded" and set(states) <= {"queued", "assigned", "running", "succeeded"}
    assert lines.index("err") < max(i for i, line in enumerate(lines) if " succeeded " in line)
    assert re.search(r" succeeded on wkr-[0-9a-f]+ \[\d+\.\ds\]$", lines[-1]), lines


def test_a_waiting_job_says_where_it_stands_and_why(home: Path, tmp_path: Path) -> None:
    worker = start_worker("--cpu-slots", "1")
    release = tmp_path / "release"
    try:
        wait_for(lambda: cli("worker", "list", "--json").stdout.count('"id"') >= 1, 60, "the worker")
        first = cli("submit", "--detach", "--", *blocker(release), check=True).stdout.strip()
        log = tmp_path / "second.err"
        with open(log, "w") as err:
            second = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "submit", "--", "true"],
                                      stdout=subprocess.DEVNULL, stderr=err)
        line = wait_for(lambda: next((x for x in log.read_text().splitlines() if "position" in x), None), 60,
                        "the queue position")
        assert re.match(r"^gpulayer: job-[0-9a-f]+ queued; position 1 in the queue; "
                        r"waiting: 1 compatible worker\(s\) busy \[\d+\.\ds\]$", line), line
        release.touch()
        assert second.wait(60) == 0
        assert " succeeded on wkr-" in log.read_text().splitlines()[-1]
        assert cli("jobs", "result", first, "--timeout", "60").returncode == 0
    finally:
        release.touch()
        worker.terminate()
        worker.wait(30)


def test_on_a_terminal_one_live_line_and_the_output_untouched(home: Path, tmp_path: Path) -> None:
    worker = start_worker("--cpu-slots", "1")
    release = tmp_path / "release"
    try:
        wait_for(lambda: cli("worker", "list", "--json").stdout.count('"id"') >= 1, 60, "the worker")
        cli("submit", "--detach", "--", *blocker(release), check=True)
        term = Terminal("submit", "--", "sh", "-c", "printf 'one\\n'; sleep 0.3; printf 'two\\n'")
        # the live line says where the job stands while it waits
        term.read_until("position 1 in the queue; waiting: 1 compatible worker(s) busy")
        release.touch()
        assert term.finish() == 0
        out = term.output
        assert "\x1b[2K" in out  # rich erases the line to redraw it
        assert re.search(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] gpulayer: job-[0-9a-f]+ queued; position 1", out)
        assert "one\r\n" in out and "two\r\n" in out  # the job's output, as it wrote it
        # erased in place, the live line leaves only the permanent ones behind
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out).replace("\r\n", "\n")
        shown = [x.rsplit("\r", 1)[-1] for x in plain.split("\n")]  # a carriage return starts the line over
        last = [x for x in shown if x.strip()][-1]
        assert re.match(r"^gpulayer: job-[0-9a-f]+ succeeded on wkr-[0-9a-f]+ \[\d+\.\ds\]$", last), plain
    finally:
        release.touch()
        worker.terminate()
        worker.wait(30)
