"""The warm CLI (gpulayer.cli.warm): while ``gpulayer worker start`` runs on an embedded home,
its CLI server runs command lines there as the command itself would, with the same output
and exit code; a command it does not answer runs as usual."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpulayer.cli import warm, warm_server
from gpulayer.worker import markers
from tests.server_support import until
from tests.support import children_running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm CLI is Linux's")

GPULAYER = [sys.executable, "-m", "gpulayer.cli"]

PROFILE_PLUGIN = """
    from gpulayer import plugin


    @plugin.hookimpl
    def gpulayer_runtime_profiles():
        return [plugin.RuntimeProfile(name="here-only", description="a profile only this folder has")]
"""


def _env(home: Path, **more: str) -> dict[str, str]:
    """This test's home, no other GPULAYER_* setting of this process; a command that finds no
    server starts none, unless ``more`` says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    return {**env, "GPULAYER_HOME": str(home), "GPULAYER_CLI_SERVER_IDLE": "0", **more}


@pytest.fixture
def worker(home: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([*GPULAYER, "worker", "start", "--cpu-slots", "2", "--json"], env=_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline(), "the worker did not start"
        until(lambda: os.path.exists(warm.socket_path(str(home))), 60, "the worker's CLI server")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


FORWARD = """
import sys
from gpulayer.cli import warm
code = warm.forward(sys.argv[1:])
sys.stderr.write(f"\\nFORWARDED={code}")
"""


def _forward(home: Path, args: list[str], **env: str) -> tuple[str, str, str]:
    """``warm.forward(args)`` in a fresh interpreter: stdout, stderr, and what it returned."""
    proc = subprocess.run([sys.executable, "-c", FORWARD, *args], env=_env(home, **env), cwd=home,
                          capture_output=True, text=True, timeout=120)
    err, _, code = proc.stderr.rpartition("\nFORWARDED=")
    return proc.stdout, err, code


#: runs the command line after the report file's path (``N`` copies at once, N the word
#: before it) as a subreaper: a CLI server a command started (through an intermediate process
#: that leaves at once) is this process's child by the time that command has exited. Reports
#: the commands' exit codes, the servers they started, and those of them still there once
#: ``KEEP`` at most were (60 s at most; KEEP -1: no waiting)
SUBREAPER = """
import ctypes, json, os, subprocess, sys, time
import psutil
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
report, n, keep, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
procs = [subprocess.Popen(argv) for _ in range(n)]
codes = [p.wait() for p in procs]
started = psutil.Process().children()


def alive():
    with_zombies = [p for p in started if p.is_running()]
    for p in with_zombies:  # (a server that left is a zombie here until it is reaped)
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, 0)
        except (psutil.NoSuchProcess, ChildProcessError):
            pass
    return [p.pid for p in started if p.is_running()]


deadline = time.monotonic() + 60
while keep >= 0 and len(alive()) > keep and time.monotonic() < deadline:
    time.sleep(0.02)
with open(report, "w") as f:
    json.dump({"codes": codes, "started": [p.pid for p in started], "alive": alive()}, f)
"""


def _subreaped(home: Path, argv: list[str], *, n: int = 1, keep: int = -1, **env: str) -> dict[str, Any]:
    """``n`` copies of ``argv`` at once under :data:`SUBREAPER`, with this test's environment
    and ``env``: its report, and their ``stderr``. (Any server they started that is still
    there is ended here unless ``keep`` allowed for it: the caller checks the report.)"""
    report = home / "subreaper.json"
    run = subprocess.run([sys.executable, "-c", SUBREAPER, str(report), str(n), str(keep), *argv],
                         env=_env(home, **env), cwd=home, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    found: dict[str, Any] = {**json.loads(report.read_text()), "stderr": run.stderr}
    if len(found["alive"]) > max(keep, 0):
        for pid in found["alive"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    return found


def _masked(text: str) -> str:
    return re.sub(r"(job|wkr)-[0-9a-f]{12}", r"\1-ID", re.sub(r"\[\d+\.\ds\]", "[T]", text))


def _running(home: Path, code: str) -> tuple[subprocess.Popen[str], str]:
    """``gpulayer submit -- python -c CODE`` started, once its job runs: the command and the job's id."""
    proc = subprocess.Popen([*GPULAYER, "submit", "--", "python", "-c", code], env=_env(home), cwd=home,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = ""
    while "running" not in line:
        line = proc.stderr.readline()
        assert line, "the command ended before its job ran"
    return proc, re.search(r"job-[0-9a-f]{12}", line).group(0)  # type: ignore[union-attr]


def _server(worker: subprocess.Popen[str]) -> psutil.Process:
    return until(lambda: children_running(psutil.Process(worker.pid), "gpulayer.cli.warm"), 30, "the CLI server")[0]


def test_a_submit_is_run_by_the_cli_server_with_the_output_and_exit_code_of_the_full_path(home, worker) -> None:  # type: ignore[no-untyped-def]
    args = ["submit", "--", "python", "-c", "print('from the job'); raise SystemExit(3)"]
    out, err, code = _forward(home, args)
    assert code == "3", err
    assert out == "from the job\n"
    # the same command line through `gpulayer`, warm and not: the same bytes, the same code
    warm_run = subprocess.run([*GPULAYER, *args], env=_env(home), cwd=home, capture_output=True, text=True,
                              timeout=120)
    cold_run = subprocess.run([*GPULAYER, *args], env=_env(home, GPULAYER_WARM_CLI="0"), cwd=home,
                              capture_output=True, text=True, timeout=120)
    assert warm_run.returncode == cold_run.returncode == 3
    assert warm_run.stdout == cold_run.stdout == "from the job\n"
    # (which states a status line shows on the way depends on timing: the last one does not)
    assert _masked(warm_run.stderr).splitlines()[-1] == _masked(cold_run.stderr).splitlines()[-1]
    assert "failed" in warm_run.stderr


def test_bad_input_and_relative_paths_are_the_command_line_s_own(home, worker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out, err, code = _forward(home, ["submit", "--gpus", "-1", "--", "true"])
    assert code == "2" and "--gpus" in err, err
    code_dir = home / "code"
    code_dir.mkdir()
    (code_dir / "hello.py").write_text("import os\nprint(os.path.basename(os.getcwd()) != 'code' and 'bundled')\n")
    # a relative --bundle is read from the command's own working directory (here: home)
    out, err, code = _forward(home, ["submit", "--bundle", "code", "--", "python", "hello.py"])
    assert code == "0", err
    assert out == "bundled\n"


def test_the_command_s_own_first_path_entry_is_the_child_s_too(home, worker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # `python -m gpulayer.cli` puts its working directory first on sys.path: a plugin module
    # there (GPULAYER_PLUGINS) is found by the command, so by its child as well
    (home / "my_profiles.py").write_text(textwrap.dedent(PROFILE_PLUGIN))
    args = ["submit", "--profile", "here-only", "--", "python", "-c", "print('ran')"]
    proc = subprocess.run([*GPULAYER, *args], env=_env(home, GPULAYER_PLUGINS="my_profiles"), cwd=home,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ran\n"


def test_another_interpreter_or_no_server_runs_the_command_as_usual(home, worker) -> None:  # type: ignore[no-untyped-def]
    # a variable an interpreter reads as it starts differs: not this server's to run
    out, err, code = _forward(home, ["submit", "--", "true"], PYTHONHASHSEED="7")
    assert code == "None" and out == "" and err == ""
    out, err, code = _forward(home, ["submit", "--", "true"], GPULAYER_WARM_CLI="0")
    assert code == "None"
    # commands it does not run (they serve until stopped), help, and a server's
    for args in (["worker", "start", "--cpu-slots", "1"], ["server", "start"], ["dashboard"], ["worker"],
                 ["submit", "--help"], ["jobs", "list", "-h"], ["--url", "http://127.0.0.1:9", "jobs", "list", "-h"]):
        assert _forward(home, args)[2] == "None", args


@pytest.mark.parametrize("words, answered", [
    (["worker", "list"], True), (["worker", "status", "--json"], True), (["worker", "prune"], True),
    (["worker", "start"], False), (["worker"], False), (["worker", "--help"], False),
    (["plugins", "list"], True), (["profiles", "list"], True), (["resources", "detect", "--refresh"], False),
    (["providers", "offers"], True), (["machines", "terminate", "m-1"], True), (["jobs", "show", "J"], True),
    (["server", "start"], False), (["dashboard"], False), (["token", "list"], True), ([], False),
    (["jobs", "show", "-h"], False), (["submit", "--help", "--", "true"], False),
    # after `--` the words are the job's: its own --help or -h
    (["submit", "--", "python", "train.py", "--help"], True), (["submit", "--", "ls", "-h"], True),
])
def test_which_command_lines_a_server_answers(words: list[str], answered: bool) -> None:
    assert warm.answered(words) is answered


def test_the_everyday_reads_are_answered_with_the_full_path_s_output(home, worker) -> None:  # type: ignore[no-untyped-def]
    for args in (["worker", "list"], ["worker", "status"], ["plugins", "list"], ["profiles", "list"],
                 ["providers", "list"], ["machines", "list"], ["worker", "status", "wkr-000000000000"]):
        out, err, code = _forward(home, args)
        cold = subprocess.run([*GPULAYER, *args], env=_env(home, GPULAYER_WARM_CLI="0"), cwd=home,
                              capture_output=True, text=True, timeout=120)
        assert code == str(cold.returncode), (args, err, cold.stderr)
        assert (out, err) == (cold.stdout, cold.stderr), args
    assert "online" in _forward(home, ["worker", "list"])[0]  # (the fixture's worker)


def test_ctrl_c_reaches_the_command_and_cancels_its_job(home, worker) -> None:  # type: ignore[no-untyped-def]
    proc, job_id = _running(home, "import time; time.sleep(120)")
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        proc.kill()
    shown = subprocess.run([*GPULAYER, "jobs", "show", job_id, "--json"], env=_env(home), capture_output=True,
                           text=True, timeout=120)
    assert json.loads(shown.stdout)["state"] == "cancelled"


def test_a_signal_the_command_was_started_ignoring_stays_ignored(home, worker) -> None:  # type: ignore[no-untyped-def]
    """``nohup gpulayer submit ...`` (SIGHUP ignored from the start), or ``gpulayer submit ...
    &`` in a script (SIGINT): in the command's own process such a signal does nothing;
    answered by the server, the same (it was passed on to the child, which ended: a nohup'd
    submit died with the terminal)."""
    def ignoring() -> None:
        for sig in (signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)

    code = "import time; print('started', flush=True); time.sleep(2)"
    proc = subprocess.Popen([sys.executable, "-c", FORWARD, "submit", "--", "python", "-c", code],
                            env=_env(home), cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ignoring)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "", err
    assert err.endswith("FORWARDED=0"), err  # (answered by the server, and the job succeeded)
    assert "succeeded" in err


def test_a_command_killed_outright_leaves_no_child_behind(home, worker) -> None:  # type: ignore[no-untyped-def]
    server = _server(worker)
    proc, job_id = _running(home, "import time; time.sleep(120)")
    [child] = server.children()
    proc.kill()  # nothing passed on: the server sees its command gone and ends the child (as
    proc.wait(30)  # the command itself was ended; its job runs on, as after a plain command's)
    child.wait(30)
    assert not server.children()
    cancel = subprocess.run([*GPULAYER, "jobs", "cancel", job_id], env=_env(home), capture_output=True, text=True,
                            timeout=120)  # (its job ran on: else the worker's stop waits out its 10 s grace)
    assert cancel.returncode == 0, cancel.stderr


def test_a_command_whose_server_stops_meanwhile_still_ends_with_its_own_exit_code(home, worker) -> None:  # type: ignore[no-untyped-def]
    server = _server(worker)
    proc, _job_id = _running(home, "import time; time.sleep(2); raise SystemExit(5)")
    server.terminate()  # no new commands; this one goes on and reports its own end

    def ended() -> bool:  # (a zombie until its worker reaps it)
        try:
            return server.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    until(ended, 30, "the CLI server ended")
    assert not os.path.exists(warm.socket_path(str(home)))
    assert proc.stderr is not None
    proc.stderr.read()
    assert proc.wait(60) == 5


def test_the_server_goes_with_its_worker(home, worker) -> None:  # type: ignore[no-untyped-def]
    worker.send_signal(signal.SIGTERM)
    worker.wait(30)
    until(lambda: not os.path.exists(warm.socket_path(str(home))), 30, "the CLI server's socket removed")
    assert _forward(home, ["submit", "--", "true"])[2] == "None"


def test_changed_code_or_packages_decline(tmp_path: Path) -> None:
    module = tmp_path / "mod.py"
    module.write_text("x = 1\n")
    files = {str(module): module.stat().st_mtime_ns, str(tmp_path): tmp_path.stat().st_mtime_ns}
    mine = warm._interpreter(dict(os.environ), sys.path)
    request = {**mine}
    assert warm_server._declined(request, mine, files) is None
    assert warm_server._declined({**request, "start": {"PYTHONHASHSEED": "1"}}, mine, files) == "another interpreter (start)"
    assert warm_server._declined({**request, "xoptions": ["utf8=1"]}, mine, files) == "another interpreter (xoptions)"
    later = time.time_ns() + 10**9
    os.utime(module, ns=(later, later))
    assert "changed" in (warm_server._declined(request, mine, files) or "")
    files[str(module)] = later
    assert warm_server._declined(request, mine, files) is None
    (tmp_path / "new_package").mkdir()  # an install: its folder on sys.path changes
    os.utime(tmp_path, ns=(later + 1, later + 1))
    assert "changed" in (warm_server._declined(request, mine, files) or "")


# --------------------------------------------------------------------------- a server a command started


def _own_server(home: Path) -> psutil.Process:
    """The CLI server that serves ``home``, once it listens."""
    until(lambda: os.path.exists(warm.socket_path(str(home))), 60, "a CLI server on the home")
    pid = warm.server_pid(str(home))
    assert pid is not None
    return psutil.Process(pid)


@pytest.fixture
def stop_servers(home: Path) -> Iterator[None]:
    """Afterwards, the CLI server a command of this test started is stopped."""
    yield
    pid = warm.server_pid(str(home))
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def test_command_lines_for_a_server_are_answered_by_the_home_s_cli_server(home, stop_servers, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--url`` (or GPULAYER_URL): the child talks to the server as the command would; the
    first such command line starts the home's CLI server, as any does."""
    from tests.server_support import ServerProc

    server = ServerProc(tmp_path / "server").start()
    try:
        token = server.admin_token
        submit = ["submit", "--detach", "--target", "remote", "--on-unschedulable", "wait", "--", "true"]
        job = subprocess.run([*GPULAYER, "--url", server.url, "--token", token, *submit],
                             env=_env(home, GPULAYER_WARM_CLI="0"), capture_output=True, text=True, timeout=120)
        assert job.returncode == 0, job.stderr
        job_id = job.stdout.strip()
        cases = [(["--url", server.url, "--token", token, "jobs", "list"], {}, 0, job_id),
                 (["jobs", "show", job_id], {"GPULAYER_URL": server.url, "GPULAYER_TOKEN": token}, 0, job_id),
                 (["--url", server.url, "--token", "glt_wrong", "jobs", "list"], {}, 2, "")]
        for args, env, expected, shown in cases:
            cold = subprocess.run([*GPULAYER, *args], env=_env(home, GPULAYER_WARM_CLI="0", **env), cwd=home,
                                  capture_output=True, text=True, timeout=120)
            assert cold.returncode == expected and shown in cold.stdout, (args, cold.stderr)
            _forward(home, args, GPULAYER_CLI_SERVER_IDLE="600", **env)  # (the first starts one where none runs)
            _own_server(home)
            out, err, code = _forward(home, args, GPULAYER_CLI_SERVER_IDLE="600", **env)
            age = functools.partial(re.sub, r"\b\d+[smhd]\b", "AGE")  # (a second may have passed)
            assert (code, age(out), err) == (str(expected), age(cold.stdout), cold.stderr), args
    finally:
        server.stop()


def test_where_no_worker_runs_a_command_starts_a_server_that_answers_the_next(home, stop_servers) -> None:  # type: ignore[no-untyped-def]
    # (an idle time no command of this test comes near, however slow the machine: the server
    # must still be there for the second command; leaving when idle is the next test's)
    env = _env(home, GPULAYER_CLI_SERVER_IDLE="600")
    first = subprocess.run([*GPULAYER, "submit", "--", "python", "-c", "print('first')"], env=env, cwd=home,
                           capture_output=True, text=True, timeout=120)
    assert (first.returncode, first.stdout) == (0, "first\n"), first.stderr
    server = _own_server(home)
    assert server.cmdline()[-2:] == ["--idle", "600.0"]
    assert os.getsid(server.pid) != os.getsid(0)  # a session of its own (a Ctrl-C at the terminal is not its)
    # the next command line is the server's child's, with its own environment: the job sees it
    out, err, code = _forward(home, ["submit", "--", "python", "-c", "import os; print(os.environ['ASKED'])"],
                              GPULAYER_CLI_SERVER_IDLE="600", ASKED="by the second command")
    assert (code, out) == ("0", "by the second command\n"), err
    # the child's in-process worker was forgotten as it stopped, as a command's own is
    listed = subprocess.run([*GPULAYER, "worker", "list", "--json"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert json.loads(listed.stdout) == []
    # a SIGTERM ends it, and its socket goes with it
    server.terminate()
    server.wait(60)
    assert not os.path.exists(warm.socket_path(str(home)))
    assert warm.server_pid(str(home)) is None


def test_a_server_with_an_idle_time_leaves_when_no_command_came_for_that_long(home) -> None:  # type: ignore[no-untyped-def]
    # started here with the command line a command starts it with, so that this test holds it
    # from its start: its leaving is seen however fast it comes
    path = warm.socket_path(str(home))
    proc = subprocess.Popen(warm.server_argv(path, 1.0), env=_env(home), cwd=home, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.wait(120) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
    assert proc.stderr is not None and proc.stderr.read() == ""
    # it served (its socket was in place until it left: no start failure was recorded) ...
    assert not os.path.exists(path + warm._FAILED)
    # ... and took its socket with it, and let go of its lock
    assert not os.path.exists(path)
    assert warm.server_pid(str(home)) is None


@pytest.mark.parametrize("why", ["idle 0", "inside a task", "GPULAYER_WARM_CLI=0"])
def test_a_command_starts_no_server(home, stop_servers, why: str) -> None:  # type: ignore[no-untyped-def]
    # (inside a task: a marker that names a live worker, this process, as a task's does; one
    # that names none is an orphan's, which a worker starting meanwhile, in another test,
    # would end: reap_orphans)
    more = {"idle 0": {"GPULAYER_CLI_SERVER_IDLE": "0"},
            "inside a task": {"GPULAYER_CLI_SERVER_IDLE": "60", "GPULAYER_TREE_ID": f"{markers.owner()}.0"},
            "GPULAYER_WARM_CLI=0": {"GPULAYER_CLI_SERVER_IDLE": "60", "GPULAYER_WARM_CLI": "0"}}[why]
    for _ in range(2):
        # a server it started would be there by the time it exited (as a process: it need not
        # hold its lock, or listen, yet)
        found = _subreaped(home, [sys.executable, "-c", FORWARD, "jobs", "show", "job-000000000000"], **more)
        assert found["stderr"].endswith("\nFORWARDED=None") and found["codes"] == [0], found
        assert found["started"] == [], found
    assert warm.server_pid(str(home)) is None
    assert not os.path.exists(warm.socket_path(str(home)))


def test_commands_at_once_start_one_server(home, stop_servers) -> None:  # type: ignore[no-untyped-def]
    # every server the commands started is seen, and all but one of them leave
    found = _subreaped(home, [*GPULAYER, "jobs", "show", "job-000000000000"], n=4, keep=1,
                       GPULAYER_CLI_SERVER_IDLE="600")
    assert found["codes"] == [2] * 4, found  # (no such job)
    assert len(found["alive"]) == 1, found
    server = _own_server(home)
    assert found["alive"] == [server.pid], found

    def servers() -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"])
                if warm.socket_path(str(home)) in (p.info["cmdline"] or [])]

    assert until(lambda: servers() == [server.pid], 30, "one server")


def test_a_bad_idle_setting_is_an_error_that_names_it(home) -> None:  # type: ignore[no-untyped-def]
    run = subprocess.run([*GPULAYER, "submit", "--", "true"], env=_env(home, GPULAYER_CLI_SERVER_IDLE="soon"),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "GPULAYER_CLI_SERVER_IDLE='soon': expected a number of seconds >= 0" in run.stderr


def test_a_server_whose_socket_is_removed_leaves(home, stop_servers) -> None:  # type: ignore[no-untyped-def]
    _forward(home, ["jobs", "show", "job-000000000000"], GPULAYER_CLI_SERVER_IDLE="600")
    server = _own_server(home)
    os.unlink(warm.socket_path(str(home)))  # (as when its home is removed)
    server.wait(30)


def test_a_worker_s_server_takes_over_once_a_command_s_server_leaves(home, stop_servers) -> None:  # type: ignore[no-untyped-def]
    _forward(home, ["jobs", "show", "job-000000000000"], GPULAYER_CLI_SERVER_IDLE="600")
    standalone = _own_server(home)
    proc = subprocess.Popen([*GPULAYER, "worker", "start", "--cpu-slots", "1", "--json"], env=_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline(), "the worker did not start"
        waiting = _server(proc)  # started, waiting for the lock
        assert warm.server_pid(str(home)) == standalone.pid
        standalone.terminate()  # (as when it has been idle long enough)
        until(lambda: warm.server_pid(str(home)) == waiting.pid, 60, "the worker's server serving")
        until(lambda: os.path.exists(warm.socket_path(str(home))), 60, "its socket")
        out, err, code = _forward(home, ["submit", "--", "python", "-c", "print('warm')"])
        assert (code, out) == ("0", "warm\n"), err
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


@pytest.mark.parametrize("argv, options", [
    (["python", "-m", "gpulayer.cli", "submit"], []),
    (["/venv/bin/python", "/venv/bin/gpulayer", "submit", "-X", "dev"], []),
    (["python", "-X", "dev", "-W", "ignore", "-m", "gpulayer.cli"], ["-X", "dev", "-W", "ignore"]),
    (["python", "-Xutf8", "-BEs", "-c", "code", "-X", "x"], ["-Xutf8", "-BEs"]),
    (["python", "-Bc", "code"], ["-B"]),
    (["python", "-I", "script.py", "-O"], ["-I"]),
    (["python", "--check-hash-based-pycs", "always", "-m", "m"], ["--check-hash-based-pycs", "always"]),
])
def test_a_server_is_started_with_the_command_s_own_interpreter_options(argv: list[str], options: list[str]) -> None:
    assert warm._interpreter_options(argv) == options


def test_a_server_started_under_interpreter_options_answers_commands_with_the_same(home, stop_servers) -> None:  # type: ignore[no-untyped-def]
    flags = ["-X", "dev", "-W", "default"]  # (dev mode: a warning of a resource left open is shown)

    def forward(args: list[str]) -> tuple[str, str]:
        proc = subprocess.run([sys.executable, *flags, "-c", FORWARD, *args],
                              env=_env(home, GPULAYER_CLI_SERVER_IDLE="600"), cwd=home, capture_output=True,
                              text=True, timeout=120)
        err, _, code = proc.stderr.rpartition("\nFORWARDED=")
        return err, code

    err, code = forward(["jobs", "show", "job-000000000000"])
    assert code == "None" and "Warning" not in err, err  # (the server is not this command's child)
    server = _own_server(home)
    assert server.cmdline()[1:5] == flags
    err, code = forward(["submit", "--", "true"])
    assert code == "0", err


def test_command_lines_it_declines_do_not_keep_a_server_from_leaving(home, stop_servers) -> None:  # type: ignore[no-untyped-def]
    # (started here as a command starts it, so that its leaving is seen however early it comes)
    server = subprocess.Popen(warm.server_argv(warm.socket_path(str(home)), 3.0), env=_env(home), cwd=home)
    try:
        deadline = time.monotonic() + 30
        while server.poll() is None and time.monotonic() < deadline:
            # another interpreter's command line (another hash seed): declined, run as usual
            assert _forward(home, ["jobs", "show", "job-000000000000"], PYTHONHASHSEED="7",
                            GPULAYER_CLI_SERVER_IDLE="3")[2] == "None"
            time.sleep(0.5)
        assert server.poll() == 0, "the server stayed while commands it declined kept coming"
    finally:
        server.kill()
        server.wait(30)


def test_a_server_that_fails_at_its_start_says_why_and_commands_wait_before_starting_another(home) -> None:  # type: ignore[no-untyped-def]
    path = warm.socket_path(str(home))
    too_long = str(home / ("x" * 120) / "cli.sock")  # (no socket binds there)
    os.makedirs(os.path.dirname(too_long))
    run = subprocess.run(warm.server_argv(too_long, 5.0), env=_env(home), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert (Path(too_long + ".failed").read_text()).startswith("OSError")
    # on the home itself: a start that failed a moment ago holds the next one back
    Path(path + ".failed").write_text("OSError: (the test's)\n")
    # (a server it started would be there by the time it exited)
    found = _subreaped(home, [sys.executable, "-c", FORWARD, "jobs", "show", "job-000000000000"],
                       GPULAYER_CLI_SERVER_IDLE="60")
    assert found["stderr"].endswith("\nFORWARDED=None") and found["codes"] == [0], found
    assert found["started"] == [], found
    assert warm.server_pid(str(home)) is None and not os.path.exists(path)
