"""The CLI's job commands as a user runs them (docs/cli.md): ``jobs wait`` and its exit codes,
``jobs cancel`` of several jobs, ``logs --follow`` exiting with the outcome, ``--json`` on
``submit`` and ``worker start``, a cancelled job said once, requirements as flags."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import cli


@pytest.fixture
def worker(home: Path) -> Iterator[dict[str, Any]]:
    """``gpulayer worker start --json``: its first line on stdout is its ready record."""
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", "--cpu-slots", "3", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded: the worker exits (EOF) if it cannot start
        assert line, "the worker printed no ready line"
        record = json.loads(line)
        yield record
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def detach(*command: str, flags: tuple[str, ...] = ()) -> str:
    proc = cli("submit", "--detach", *flags, "--", *command, check=True)
    return proc.stdout.strip()


def test_worker_start_json_prints_its_ready_record(worker: dict[str, Any]) -> None:
    assert worker["id"].startswith("wkr-")
    assert worker["cpu_slots"] == 3 and worker["devices"] == [] and worker["target"] == "local"
    listed = json.loads(cli("worker", "list", "--json", check=True).stdout)
    assert worker["id"] in [w["id"] for w in listed]


@pytest.mark.usefixtures("worker")
def test_wait_cancel_and_result_exit_codes() -> None:
    ok = detach("true")
    bad = detach("sh", "-c", "exit 3")
    slow = detach("sleep", "600")  # (both are cancelled below: the time is only a bound)
    slow2 = detach("sleep", "600")

    assert cli("jobs", "wait", ok, timeout=60).returncode == 0
    done = cli("jobs", "wait", ok, bad, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == f"job {ok} succeeded\n"
    assert done.stderr == f"job {bad} failed: exit code 3\n"

    # still running after the timeout is 75, not a failure; the job goes on
    running = cli("jobs", "wait", slow, "--timeout", "0.5", "--json", timeout=60)
    assert running.returncode == 75, running.stderr
    [record] = json.loads(running.stdout)
    assert record["id"] == slow and record["state"] in ("queued", "assigned", "running") and record["code"] == 75
    assert cli("jobs", "result", slow, "--no-wait", timeout=60).returncode == 75

    # several jobs cancelled at once, one id that names nothing reported and the rest done
    cancelled = cli("jobs", "cancel", slow, "job-000000000000", slow2, "--json", timeout=60)
    assert cancelled.returncode == 2
    records = json.loads(cancelled.stdout)
    assert [r["id"] for r in records] == [slow, "job-000000000000", slow2]
    assert records[1]["error"] and records[0]["error"] is None and records[2]["error"] is None
    assert "job-000000000000" in cancelled.stderr

    waited = cli("jobs", "wait", slow, slow2, "--timeout", "60", timeout=90)
    assert waited.returncode == 130, waited.stderr
    assert waited.stderr == f"job {slow} cancelled\njob {slow2} cancelled\n"
    result = cli("jobs", "result", slow, timeout=60)
    assert result.returncode == 130
    assert result.stderr == f"job {slow} cancelled\n"  # said once, not "cancelled: cancelled"


@pytest.mark.usefixtures("worker")
def test_logs_follow_exits_with_the_jobs_outcome() -> None:
    job = detach("sh", "-c", "echo hello; sleep 0.5; exit 7")
    proc = cli("jobs", "logs", job, "--follow", timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "hello\n"
    assert proc.stderr == f"gpulayer: job {job} failed: exit code 7\n"
    good = detach("echo", "fine")
    assert cli("jobs", "logs", good, "-f", timeout=60).returncode == 0
    # a node the job does not have: said, exit 2 (not an empty output and exit 0)
    assert cli("jobs", "logs", good, "--node", "0", check=True).stdout == "fine\n"
    for follow in ((), ("--follow",)):
        proc = cli("jobs", "logs", good, "--node", "1", *follow, timeout=60)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", "error: --node 1: the job has one node, 0\n")
    import gpulayer as gl
    from gpulayer.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"^handle.logs\(node=1\): the job has one node, 0$"):
        gl.get_job(good).logs(node=1)
    with pytest.raises(InvalidArgument, match=r"^handle.follow\(node=-1\): the job has one node, 0$"):
        next(gl.get_job(good).follow(node=-1))


@pytest.mark.usefixtures("worker")
def test_attached_submit_json_prints_the_outcome_and_sends_output_to_stderr() -> None:
    proc = cli("submit", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 4", timeout=60)
    assert proc.returncode == 4
    record = json.loads(proc.stdout)
    assert record["state"] == "failed" and record["exit_code"] == 4 and record["code"] == 4
    assert record["id"].startswith("job-")
    assert "out\n" in proc.stderr and "err\n" in proc.stderr
    nowhere = cli("submit", "--json", "--accelerator", "cuda", "--", "true", timeout=60)
    assert nowhere.returncode == 125
    assert json.loads(nowhere.stdout)["state"] == "unschedulable"


def interrupted_submit(*args: str) -> tuple[int, str, str]:
    """``gpulayer submit ARGS`` in the foreground, sent SIGINT (a Ctrl-C) once its job runs:
    its exit code, stdout and stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "submit", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stderr is not None
        seen = ""
        while "running" not in (line := proc.stderr.readline()):
            assert line, "the command ended before its job ran"
            seen += line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, out, seen + line + err


@pytest.mark.usefixtures("worker")
def test_attached_submit_json_after_ctrl_c_prints_the_cancelled_outcome_it_exits_with(home: Path) -> None:
    """The record was read at once after the cancel: state running and code 75, while the
    command exited 130."""
    code, out, err = interrupted_submit("--json", "--", "sleep", "600")
    assert code == 130, (out, err)
    record = json.loads(out)
    assert (record["state"], record["code"], record["error"]["type"]) == ("cancelled", 130, "cancelled")


def test_a_submit_interrupted_waits_for_its_cancelled_job_without_offering_to_cancel_it(home: Path) -> None:
    """Ctrl-C cancels a foreground submit's job; a job whose process ignores SIGTERM takes the
    worker's grace to end, and the command's exit waits for it: it says the job is being
    cancelled, not 'press Ctrl-C to cancel them' (it was, by that Ctrl-C)."""
    code, _out, err = interrupted_submit("--", "sh", "-c", "trap '' TERM; sleep 600")
    assert code == 130, err
    waiting = [line for line in err.splitlines() if "this process submitted to end" in line]
    assert waiting and waiting[0].endswith("(cancelling)"), err


def test_show_writes_requirements_as_submit_flags(home: Path) -> None:
    proc = cli("submit", "--detach", "--on-unschedulable", "wait", "--framework", "torch>=2.2", "--cpus", "1",
               "--memory", "0.5", "--label", "zone=a", "--name", "训练 run", "--", "true", timeout=60)
    job = proc.stdout.strip()
    try:
        show = cli("jobs", "show", job, check=True).stdout
        needs = next(line for line in show.splitlines() if line.startswith("needs"))
        assert needs == "needs     --framework 'torch>=2.2' --cpus 1 --memory 0.5 --label zone=a"
        assert show.splitlines()[1] == "name      训练 run"  # (the name it was given, after its id)
    finally:
        cli("jobs", "cancel", job)


def test_show_prints_an_unschedulable_jobs_error_as_lines(home: Path) -> None:
    """The error of a job no worker could run has several lines (the reason, the nearest miss,
    the command that explains the rest): they came out as one line with literal \\n in it."""
    proc = cli("submit", "--detach", "--json", "--accelerator", "cuda", "--gpus", "64", "--", "true", timeout=60)
    assert proc.returncode == 125, proc.stderr
    job = json.loads(proc.stdout)["id"]
    show = cli("jobs", "show", job, check=True).stdout
    assert "\\n" not in show
    lines = show.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("error     unschedulable: "))
    assert lines[start + 1].startswith(" " * 10) and lines[start + 1].strip()
    assert f"          run: gpulayer jobs explain {job}" in lines


@pytest.mark.parametrize("warm", ["1", "0"])
@pytest.mark.parametrize("words", [["jobs", "list", "--json"], ["jobs", "wait", "job-0c9b1e5f2a7d"],
                                   ["submit", "--json", "--", "true"], ["worker", "list"]])
def test_a_control_plane_that_cannot_be_reached_exits_69_not_bad_input(home: Path, words: list[str], warm: str) -> None:
    """Exit 2 says the input was wrong, and a CI wrapper gives up; a server that is down (or
    restarting) is worth another try, and the job a ``jobs wait`` waited for goes on."""
    import socket

    with socket.socket() as s:  # (a port nothing listens on: bound, never listening)
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        done = cli("--url", url, *words, env={"GPULAYER_HTTP_RETRY_SECONDS": "0", "GPULAYER_WARM_CLI": warm})
    assert (done.returncode, done.stdout) == (69, ""), done.stderr
    assert done.stderr.startswith(f"error: cannot reach the control plane at {url}")
    # bad input is still 2
    assert cli("--url", url, "jobs", "list", "--limit", "0").returncode == 2


@pytest.mark.parametrize("warm", ["1", "0"])
def test_jobs_list_pages_through_every_job_with_before(home: Path, warm: str) -> None:
    """A list was the newest --limit jobs (1,000 at most) and said nothing of the rest: a
    full page now ends with the command that lists the next one, light path or not."""
    env = {"GPULAYER_WARM_CLI": warm}
    jobs = [detach("true", flags=("--target", "remote", "--on-unschedulable", "wait")) for _ in range(5)]
    seen: list[str] = []
    command = ["jobs", "list", "--state", "queued", "--limit", "2"]
    for _ in range(5):  # (bounded: three pages)
        page = cli(*command, env=env, check=True).stdout.splitlines()
        seen += [line.split()[0] for line in page[1:] if line.startswith("job-")]
        if not page[-1].startswith("("):
            break
        assert page[-1] == f"(2 shown; older ones: gpulayer jobs list --state queued --limit 2 --before {seen[-1]})"
        command = page[-1].strip("()").split(": ", 1)[1].split()[1:]
    assert seen == jobs[::-1]
    listed = json.loads(cli("jobs", "list", "--before", jobs[2], "--json", env=env, check=True).stdout)
    assert [j["id"] for j in listed] == [jobs[1], jobs[0]]
    bad = cli("jobs", "list", "--before", "job-000000000000", env=env)
    assert bad.returncode == 2
    assert bad.stderr == ("error: --before job-000000000000: no such job; accepted: the id of a job, as gpulayer "
                          "jobs list shows it\n")


@pytest.mark.usefixtures("worker")
def test_submit_after_runs_a_job_once_another_has_succeeded_and_names_bad_ids_as_typed(tmp_path: Path) -> None:
    marker = tmp_path / "first-done"
    first = detach(sys.executable, "-c", f"import time, pathlib; time.sleep(0.5); pathlib.Path({str(marker)!r}).touch()")
    # in the foreground: it runs only once the first has succeeded (the file is there)
    second = cli("submit", "--after", first, "--", sys.executable, "-c",
                 f"import pathlib; print(pathlib.Path({str(marker)!r}).exists())", timeout=60)
    assert second.returncode == 0 and second.stdout.strip() == "True"
    failed = detach("sh", "-c", "exit 3")
    assert cli("jobs", "wait", failed, timeout=60).returncode == 3
    never = cli("submit", "--after", f"{first},{failed}", "--", "true", timeout=60)
    assert never.returncode == 1
    assert f"not run: {failed}, which it runs after, failed (gpulayer jobs show {failed})" in never.stderr
    # detached, it ends at its submit all the same: said, with the exit code of a failed job
    # (not the id of a job that will never run, and 0)
    at_once = cli("submit", "--detach", "--after", failed, "--", "true", timeout=60)
    assert (at_once.returncode, at_once.stdout) == (1, "")
    assert at_once.stderr.startswith("gpulayer: job job-") and f"not run: {failed}, which it runs after" in at_once.stderr
    as_json = cli("submit", "--detach", "--json", "--after", failed, "--", "true", timeout=60)
    record = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and (record["state"], record["code"], record["error"]["type"]) == ("failed", 1, "dependency")
    blocker = detach("sleep", "600")
    waiting = detach("true", flags=("--after", blocker))
    assert "after     job-" in cli("jobs", "show", waiting, check=True).stdout
    cli("jobs", "cancel", blocker, check=True)  # (else the worker's stop waits out its 10 s grace)

    cleanup = cli("submit", "--after-ended", failed, "--", "echo", "cleaned", timeout=60)
    assert (cleanup.returncode, cleanup.stdout) == (0, "cleaned\n")
    gone = cli("submit", "--after-ended", "job-0123456789ab", "--", "true")
    assert gone.returncode == 2 and "--after-ended job-0123456789ab: no such job" in gone.stderr
    unknown = cli("submit", "--after", "job-0123456789ab", "--", "true")
    assert unknown.returncode == 2
    assert "--after job-0123456789ab: no such job; accepted: the id of a stored job" in unknown.stderr
    typo = cli("submit", "--after", "prepare", "--", "true")
    assert typo.returncode == 2 and "--after prepare: not a job id; accepted: a job's id" in typo.stderr
    twice = cli("submit", "--after", f"{first},{first}", "--", "true")
    assert twice.returncode == 2 and "is listed twice" in twice.stderr
