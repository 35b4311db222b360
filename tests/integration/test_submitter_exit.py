"""What a script that submits jobs does when it ends, as a real process: a job is never
silently dropped, a job's processes never outlive it, and a script that forgot its
``if __name__ == "__main__":`` guard fails at once instead of submitting itself forever."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def run_script(home: Path, script: Path, extra_env: dict[str, str] | None = None,
               **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "GPULAYER_HOME": str(home), "GPULAYER_HEARTBEAT_INTERVAL": "0.2", **(extra_env or {})}
    return subprocess.Popen([sys.executable, str(script)], cwd=script.parent, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def jobs_in(home: Path) -> list[object]:
    """The home's jobs, each with its tasks."""
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store

    store = Store(f"sqlite:///{home / 'gpulayer.db'}")
    try:
        plane = ControlPlane(store)
        return [plane.get_job(j.id) for j in plane.list_jobs(limit=1000)]
    finally:
        store.dispose()


def test_a_remote_call_at_the_top_of_a_script_fails_the_job_at_once(home: Path, tmp_path: Path) -> None:
    """The README's snippet as people paste it first: no __main__ guard."""
    script = write(tmp_path / "main.py", """\
        import gpulayer as gl

        @gl.remote
        def train(steps: int) -> dict:
            return {"steps": steps}

        h = train.remote(100)
        print(h.result())
    """)
    proc = run_script(home, script)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert "SubmitWhileImporting" in err
    assert "a job was submitted while a worker imported module 'main' to run main:train" in err
    assert 'if __name__ == "__main__":' in err
    jobs = jobs_in(home)
    assert len(jobs) == 1  # the worker's import did not submit a second job


def test_a_job_submitted_as_the_last_line_runs_before_the_script_ends(home: Path, tmp_path: Path) -> None:
    script = write(tmp_path / "last.py", """\
        import sys
        import gpulayer as gl

        if __name__ == "__main__":
            gl.submit(gl.CommandJob(command=[sys.executable, "-c",
                      "import time; time.sleep(1); open('done.txt', 'w').write('ok')"], bundle="."))
    """)
    proc = run_script(home, script)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "gpulayer: waiting for 1 job(s) this process submitted to end" in err
    [job] = jobs_in(home)
    assert job.state.value == "succeeded"  # type: ignore[attr-defined]


def _started(pid_file: Path) -> int:
    return int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the job to start"))


LONG_JOB = """\
    import sys
    import gpulayer as gl

    CODE = "import os, time; open({pid!r}, 'w').write(str(os.getpid())); time.sleep(120)"

    if __name__ == "__main__":
        gl.submit(gl.CommandJob(command=[sys.executable, "-c", CODE]))
"""


def test_ctrl_c_while_waiting_at_exit_cancels_the_jobs_saying_why(home: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = write(tmp_path / "wait.py", LONG_JOB.format(pid=str(pid_file)))
    proc = run_script(home, script)
    child = _started(pid_file)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "press Ctrl-C to cancel them" in err
    assert "gpulayer: cancelled 1 job(s): the process that submitted it was interrupted" in err
    [job] = jobs_in(home)
    assert job.state.value == "cancelled"  # type: ignore[attr-defined]
    assert "interrupted while waiting for it at exit" in job.error.message  # type: ignore[attr-defined]
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("where", ["at exit", "in the script", "submitted from a thread"])
def test_sigterm_to_the_script_ends_its_jobs_and_their_processes(home: Path, tmp_path: Path, where: str) -> None:
    """From a thread: the first submit (which starts the in-process worker) ran in a pool's
    thread, where no signal handler can be set, and none was set later: SIGTERM killed the
    script and left its job running (lost once another process opened the home, and retried
    where retries allowed) while the main thread waited for its result."""
    pid_file = tmp_path / "pid"
    text = LONG_JOB.format(pid=str(pid_file))
    if where == "in the script":  # SIGTERM arrives while the script waits for a result
        text = text.replace("        gl.submit(", "        h = gl.submit(") + "        h.result()\n"
    if where == "submitted from a thread":
        text = text.replace("        gl.submit(", "        from concurrent.futures import ThreadPoolExecutor\n"
                            "        with ThreadPoolExecutor(1) as pool:\n"
                            "            h = pool.submit(gl.submit, ") + "        h.result().result()\n"
    script = write(tmp_path / "term.py", text)
    proc = run_script(home, script)
    child = _started(pid_file)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "received SIGTERM" in err
    wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE,
             20, "the job's process to end")
    [job] = jobs_in(home)
    assert job.state.value == "cancelled"  # type: ignore[attr-defined]
    assert job.error.message == "the process that submitted it received SIGTERM"  # type: ignore[attr-defined]
    [task] = job.tasks  # type: ignore[attr-defined]
    # the grace the stop gave it (the in-process worker's is GPULAYER_EXIT_GRACE's 2 s at most), not
    # the worker's default of 10 s
    assert task.error is None or "(grace 10 s)" not in task.error.message, task.error
    assert not any((home / "tasks").glob("*")), "task directories are removed"


TWO_JOBS = """\
    import sys
    import gpulayer as gl

    CODE = "import os, time; open({pid!r}, 'w').write(str(os.getpid())); time.sleep(120)"

    if __name__ == "__main__":
        for _ in range(2):
            gl.submit(gl.CommandJob(command=[sys.executable, "-c", CODE]))
        input()
"""


def test_a_script_killed_with_sigkill_names_its_worker_to_the_jobs_that_waited_for_it(home: Path,
                                                                                      tmp_path: Path) -> None:
    """A script with its own worker (one CPU slot), killed with -9 while its first job ran:
    the jobs queued behind it failed as `unschedulable: ... local: no local worker
    registered`, as if there had never been one; they say which worker, in which process,
    exited before they started."""
    pid_file = tmp_path / "pid"
    script = write(tmp_path / "killed.py", TWO_JOBS.format(pid=str(pid_file)))
    proc = run_script(home, script, {"GPULAYER_CPU_SLOTS": "1"}, stdin=subprocess.PIPE)
    _started(pid_file)
    proc.kill()
    proc.communicate(timeout=60)
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store

    store = Store(f"sqlite:///{home / 'gpulayer.db'}")
    try:
        plane = ControlPlane(store)
        plane.expire_workers()  # (what the next process to open the home does)
        ran, waited = sorted((plane.get_job(j.id) for j in plane.list_jobs()), key=lambda j: j.attempt, reverse=True)
        assert plane.list_workers() == []  # (the script's worker is not kept once gone)
    finally:
        store.dispose()
    assert ran.state.value == "failed" and f"(pid {proc.pid}) is gone" in ran.error.message  # type: ignore[union-attr]
    assert waited.state.value == "unschedulable", waited
    lines = waited.error.message.splitlines()  # type: ignore[union-attr]
    assert lines[:2] == ["scheduling: no eligible worker", "local: no local worker registered"], lines
    assert re.fullmatch(rf"wkr-[0-9a-f]+: the worker that would run it, in process {proc.pid}, exited before it "
                        "started", lines[2]), lines
    assert lines[-1] == f"run: gpulayer jobs explain {waited.id}"


NESTED = """\
    import time

    import gpulayer as gl


    @gl.remote
    def inner(x):
        time.sleep(float(__import__("os").environ.get("INNER_SLEEP", "0")))
        return x + 1


    @gl.remote
    def outer(x):
        return inner.remote(x).result() * 10
"""

NESTED_RUN = """\
    import time
    import gpulayer as gl
    from nest import outer

    if __name__ == "__main__":
        outers = outer.map([1, 2])
        c = gl.connect()
        deadline = time.monotonic() + 90
        while len([j for j in c.api.list_jobs() if j.spec.kind == "function" and j.spec.function == "nest:inner"
                   and j.state.value == "running"]) < 2:
            assert time.monotonic() < deadline, "the inner jobs never ran"
            time.sleep(0.1)
        gl.cancel(outers)
        gl.wait(outers, timeout=60)
"""


def test_a_cancelled_job_cancels_the_jobs_it_submitted(home: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs that each wait for a job of their own (which runs in the slot its waiting
    job lent) on a worker of two slots: cancelled, their jobs would run on, unasked."""
    write(tmp_path / "nest.py", NESTED)
    script = write(tmp_path / "run.py", NESTED_RUN)
    monkeypatch.setenv("GPULAYER_CPU_SLOTS", "2")
    monkeypatch.setenv("INNER_SLEEP", "60")
    proc = run_script(home, script)
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, err
    jobs = {j.id: j for j in jobs_in(home)}  # type: ignore[attr-defined]
    inner = [j for j in jobs.values() if j.spec.function == "nest:inner"]  # type: ignore[attr-defined]
    assert len(inner) == 2 and {j.state.value for j in inner} == {"cancelled"}, [  # type: ignore[attr-defined]
        (j.state, j.error) for j in inner]  # type: ignore[attr-defined]
    said = [j.error.message for j in inner]  # type: ignore[attr-defined]
    assert said == ["the job that submitted it was cancelled"] * 2, said


NESTED_TIMEOUT_RUN = """\
    import gpulayer as gl
    from nest import inner

    @gl.remote(timeout=3)
    def outer(x):
        return inner.remote(x).result() * 10
"""


def test_a_job_ended_by_its_timeout_leaves_the_jobs_it_submitted(home: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a cancel reaches them: a job ended by its timeout, its group's end or its worker
    stopping may run again, and its next attempt may want what the first started."""
    write(tmp_path / "nest.py", NESTED)
    monkeypatch.setenv("INNER_SLEEP", "6")  # (the outer jobs' timeout is 3 s)
    write(tmp_path / "nest_timeout.py", NESTED_TIMEOUT_RUN)
    script = write(tmp_path / "run.py", """\
        import gpulayer as gl
        from nest_timeout import outer

        if __name__ == "__main__":
            outers = outer.map([1, 2])
            gl.wait(outers, timeout=60)
            c = gl.connect()
            inner = [j for j in c.api.list_jobs() if j.spec.function == "nest:inner"]
            gl.wait([gl.get_job(j.id) for j in inner], timeout=60)
    """)
    monkeypatch.setenv("GPULAYER_CPU_SLOTS", "2")
    proc = run_script(home, script)
    _, err = proc.communicate(timeout=150)
    assert proc.returncode == 0, err
    jobs = jobs_in(home)
    assert sorted(j.state.value for j in jobs) == ["succeeded", "succeeded", "timed_out", "timed_out"], [  # type: ignore[attr-defined]
        (j.spec.function, j.state, j.error) for j in jobs]  # type: ignore[attr-defined]
