"""Jobs end to end through the SDK and the CLI: real workers, real subprocesses.

Tests that take the ``plane`` fixture run three times: on the embedded control plane, and
against a real server process on SQLite and on PostgreSQL, with workers that joined it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import gpulayer as gl
from gpulayer.fakes import fake_devices_env
from gpulayer.records import JobState, TaskState
from tests.integration.conftest import Plane
from tests.support import cli, start_worker, stop_strays, wait_for


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return out


def test_cli_submit_streams_output_and_exits_with_the_jobs_code(plane: Plane) -> None:
    plane.ensure_worker()
    proc = cli("submit", "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 7")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "to-out\n"
    assert "to-err" in proc.stderr
    listed = cli("jobs", "list", "--json", check=True)
    jobs = json.loads(listed.stdout)
    assert [j["state"] for j in jobs] == ["failed"]


def test_sdk_command_job_success_logs_and_env(plane: Plane) -> None:
    plane.ensure_worker()
    h = gl.submit(gl.CommandJob(command=[sys.executable, "-c",
                                         "import os; print(os.environ['GPULAYER_ACCELERATOR'], "
                                         "os.environ['GPULAYER_JOB_ID'], os.environ['GPULAYER_TASK_ID'][:4])"]))
    assert h.result(timeout=60) == 0
    assert h.logs() == f"cpu {h.id} tsk-\n"
    assert h.status() == "succeeded"


def test_unschedulable_fails_at_once_with_reasons_in_the_seed_wording(plane: Plane) -> None:
    plane.ensure_worker()
    proc = cli("submit", "--accelerator", "cuda", "--framework", "torch>=99", "--framework", "jax", "--",
               "true")
    assert proc.returncode == 125, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "scheduling: no eligible worker"
    worker_lines = [line for line in lines[1:] if line.startswith("wkr-")]
    assert worker_lines, proc.stderr
    text = "\n".join(worker_lines)
    assert ": needs 1 usable cuda device(s), worker has 0" in text
    assert "framework 'jax' not installed" in text
    assert "does not satisfy >=99" in text
    # it ends with the nearest miss and the command that explains the rest
    job = json.loads(cli("jobs", "list", "--json", check=True).stdout)[0]
    assert lines[-2].startswith("closest: wkr-") and "has 0 of 1 cuda device" in lines[-2], proc.stderr
    assert lines[-1] == f"run: gpulayer jobs explain {job['id']}"
    # the decision is kept on the job and shown by `jobs show`
    assert job["state"] == "unschedulable"
    show = cli("jobs", "show", job["id"], check=True).stdout
    assert "scheduling: no eligible worker" in show
    assert "needs 1 usable cuda device(s), worker has 0" in show


def test_sdk_unschedulable_raises_with_reasons(plane: Plane) -> None:
    plane.ensure_worker()
    with pytest.raises(gl.Unschedulable) as err:
        gl.submit(gl.CommandJob(command=["true"], requirements=gl.Requirements(accelerator="cuda")))
    assert str(err.value).startswith("scheduling: no eligible worker\nwkr-")
    *reasons, closest, run = str(err.value).splitlines()
    assert reasons[-1].endswith(": needs 1 usable cuda device(s), worker has 0")
    assert closest.startswith("closest: wkr-") and closest.endswith(" has 0 of 1 cuda device")
    assert run == f"run: gpulayer jobs explain {err.value.job_id}"


def test_timeout_ends_the_tree_and_the_task_is_timed_out(plane: Plane) -> None:
    plane.ensure_worker()
    proc = cli("submit", "--timeout", "1", "--", "sh", "-c", "sleep 60 & sleep 60; wait")
    assert proc.returncode == 124, proc.stderr
    job = gl.get_job(json.loads(cli("jobs", "list", "--json").stdout)[0]["id"]).record()
    assert job.state is JobState.TIMED_OUT
    assert job.tasks[0].state is TaskState.TIMED_OUT


def test_cancel_ends_grandchildren(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    pidfile = tmp_path / "grandchild.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    h = gl.submit(gl.CommandJob(command=["sh", "-c", script]))
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="grandchild pid"))
    assert psutil.pid_exists(pid)
    h.cancel()
    job = h.wait(timeout=30)
    assert job.state is JobState.CANCELLED
    assert job.tasks[0].state is TaskState.CANCELLED

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, timeout=10, what="grandchild to end")
    with pytest.raises(gl.JobFailed):
        h.result(timeout=1)


def test_two_one_gpu_jobs_run_at_once_on_different_fake_gpus(plane: Plane, tmp_path: Path) -> None:
    env = fake_devices_env("cuda:2:80:9.0")
    worker = plane.start_worker("--cpu-slots", "0", env=env)
    try:
        wait_for(plane.online_workers, what="worker to register")
        sync = tmp_path / "sync"
        sync.mkdir()
        code = textwrap.dedent(f"""
            import os, pathlib, time
            me = os.environ["GPULAYER_JOB_ID"]
            pathlib.Path({str(sync)!r}, me).write_text(os.environ["CUDA_VISIBLE_DEVICES"])
            deadline = time.time() + 30
            while len(os.listdir({str(sync)!r})) < 2 and time.time() < deadline:
                time.sleep(0.05)
            print(os.environ["CUDA_VISIBLE_DEVICES"], len(os.listdir({str(sync)!r})),
                  os.environ["GPULAYER_ACCELERATOR"])
        """)
        spec = gl.CommandJob(command=[sys.executable, "-c", code],
                             requirements=gl.Requirements(accelerator="cuda", gpus=1))
        handles = [gl.submit(spec), gl.submit(spec)]
        records = gl.wait(handles, timeout=60)
        assert [r.state for r in records] == [JobState.SUCCEEDED, JobState.SUCCEEDED]
        seen = []
        for h, r in zip(handles, records, strict=True):
            visible, together, accel = h.logs().split()
            assert together == "2", "both jobs were running at the same time"
            assert accel == "cuda"
            assert [int(visible)] == r.tasks[0].devices
            seen.append(int(visible))
        assert sorted(seen) == [0, 1]
        # a third GPU job waits while both GPUs are busy is covered by the scheduler tests;
        # a 3-GPU job can never run here and fails at once:
        with pytest.raises(gl.Unschedulable, match=r"needs 3 usable cuda device\(s\), worker has 2"):
            gl.submit(gl.CommandJob(command=["true"], requirements=gl.Requirements(accelerator="cuda", gpus=3)))
    finally:
        stop(worker)


def test_function_defined_in_a_script_run_as_main(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (proj / "train.py").write_text(textwrap.dedent("""
        import json
        import gpulayer as gl
        from helpers import double

        @gl.remote(retries=0)
        def train(steps, *, lr=0.1):
            return {"steps": double(steps), "lr": lr}

        @gl.remote
        def broken():
            raise KeyError("missing-key")

        if __name__ == "__main__":
            assert train(1) == {"steps": 2, "lr": 0.1}   # a plain call runs here
            h = train.remote(21, lr=0.5)
            out = {"result": h.result(timeout=60)}
            try:
                broken.remote().result(timeout=60)
            except gl.RemoteError as e:
                out["error"] = [e.remote_type, e.remote_message, e.remote_traceback]
            print(json.dumps(out))
    """))
    proc = subprocess.run([sys.executable, "train.py"], cwd=proj, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["result"] == {"steps": 42, "lr": 0.5}
    remote_type, message, tb = out["error"]
    assert remote_type == "KeyError"
    assert "missing-key" in message
    assert 'raise KeyError("missing-key")' in tb and "train.py" in tb


@gl.remote
def accept_anything(*args, **kwargs):  # type: ignore[no-untyped-def]
    return None


def test_non_json_arguments_and_lambdas_are_refused_before_anything_is_stored(plane: Plane) -> None:
    def nested(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(gl.InvalidInput, match=r"nested function or closure.*0002-json-only-arguments"):
        gl.remote(nested)
    f = accept_anything
    with pytest.raises(gl.InvalidInput, match=r'args\[1\]\["weights"\]: a set is not JSON'):
        f.remote(1, {"weights": {1, 2}})
    with pytest.raises(gl.InvalidInput, match=r"kwargs\[\"x\"\]: .*NaN"):
        f.remote(x=float("nan"))
    with pytest.raises(gl.InvalidInput, match=r"args\[0\]: a bytes is not JSON"):
        f.remote(b"raw")
    with pytest.raises(gl.InvalidInput, match="0002-json-only-arguments"):
        gl.remote(lambda x: x)
    assert cli("jobs", "list", "--json", check=True).stdout.strip() == "[]"


def test_bundle_is_stored_once_and_runs_as_the_working_directory(plane: Plane, tmp_path: Path) -> None:
    plane.ensure_worker()
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "data.txt").write_text("payload\n")
    (proj / "run.sh").write_text("#!/bin/sh\ncat data.txt\n")
    (proj / "run.sh").chmod(0o755)
    (proj / "notes.log").write_text("excluded\n")
    (proj / ".gpulayerignore").write_text("*.log\n")
    for _ in range(2):
        proc = cli("submit", "--bundle", str(proj), "--", "sh", "-c", "./run.sh; ls")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("payload\n")
        assert "notes.log" not in proc.stdout
    jobs = gl.connect().api.list_jobs()
    assert len(jobs) == 2 and len({j.spec.bundle_digest for j in jobs}) == 1
    digest = jobs[0].spec.bundle_digest
    assert digest is not None and gl.connect().api.has_bundle(digest)
    if plane.embedded:
        db = sqlite3.connect(plane.home / "gpulayer.db")
        assert db.execute("SELECT COUNT(*) FROM gl_bundles").fetchone()[0] == 1


def test_jobs_from_several_processes_at_once(plane: Plane, tmp_path: Path) -> None:
    """Four processes submitting to one home (or server) at once: every job runs exactly once
    (executions are counted in side files)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    worker = plane.start_worker("--cpu-slots", "2")
    try:
        wait_for(plane.online_workers, what="worker")
        submitter = textwrap.dedent(f"""
            import sys, gpulayer as gl
            cmd = ["sh", "-c", "echo $GPULAYER_ATTEMPT >> {marks}/$GPULAYER_JOB_ID"]
            hs = [gl.submit(gl.CommandJob(command=cmd)) for i in range(5)]
            print(" ".join(str(h.result(timeout=120)) for h in hs))
        """)
        procs = [subprocess.Popen([sys.executable, "-c", submitter], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            assert out.split() == ["0"] * 5
        client = gl.connect()
        jobs = [client.api.get_job(j.id) for j in client.api.list_jobs()]
        assert len(jobs) == 20
        assert all(j.state is JobState.SUCCEEDED and len(j.tasks) == 1 for j in jobs)
        assert sorted(f.name for f in marks.iterdir()) == sorted(j.id for j in jobs)
        assert all((marks / j.id).read_text().split() == ["1"] for j in jobs)  # once each
    finally:
        stop(worker)


def test_worker_sigterm_drains_then_ends_and_reports_its_tasks(plane: Plane) -> None:
    worker = plane.start_worker("--cpu-slots", "1", "--grace", "1")
    try:
        wait_for(plane.online_workers, what="worker")
        out = cli("submit", "--detach", "--", "sh", "-c", "echo started; sleep 300", check=True)
        job_id = out.stdout.strip()
        wait_for(lambda: "started" in cli("jobs", "logs", job_id).stdout, what="job to start")
    finally:
        log = stop(worker)
    assert worker.returncode == 0, log
    job = gl.get_job(job_id).record()
    assert job.state is JobState.FAILED
    assert job.tasks[0].state is TaskState.FAILED
    assert "worker stopped before the task finished" in (job.error.message if job.error else "")
    workers = json.loads(cli("worker", "list", "--json").stdout)
    assert [w["state"] for w in workers] == ["offline"], log


@pytest.mark.parametrize("script", [
    "echo $$ > {pid}; exec sleep 300",  # the task's main process dies of the signal
    "sleep 300 & echo $! > {pid}; wait $!",  # a shell whose command died of it: exit code 143
], ids=["killed", "shell-reports-143"])
def test_a_task_killed_by_the_signal_that_stops_its_worker_is_lost(plane: Plane, tmp_path: Path, script: str) -> None:
    """What scancel of a Slurm allocation, a machine's shutdown or a Ctrl-C does: the same
    signal reaches the worker and its task at once. The machine went away; the task did not
    fail, also when the signal reached the shell's command first and the shell exited 143."""
    worker = plane.start_worker("--cpu-slots", "1", "--grace", "5")
    pidfile = tmp_path / "task.pid"
    try:
        wait_for(plane.online_workers, what="worker")
        out = cli("submit", "--detach", "--", "sh", "-c", script.format(pid=pidfile), check=True)
        job_id = out.stdout.strip()
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), what="job to start")
        os.kill(int(pidfile.read_text()), signal.SIGTERM)  # the task first: its end is seen first
        worker.send_signal(signal.SIGTERM)
    finally:
        log = stop(worker)
    assert worker.returncode == 0, log
    job = gl.get_job(job_id).record()
    assert job.tasks[0].state is TaskState.LOST, log
    assert job.state is JobState.FAILED and job.error is not None and job.error.type == "lost"


def test_a_retry_on_a_running_worker_never_runs_beside_what_a_killed_worker_left(plane: Plane, tmp_path: Path) -> None:
    """A worker killed with SIGKILL takes its task's main process with it; what that process
    had started in a session of its own was ended only by the next worker to *start* on the
    machine. A worker already running there took the retry and ran it beside the first
    attempt's leftover (and would have handed out the devices it held)."""
    left = tmp_path / "left.pid"
    # (ended: gone, or a zombie that its new parent, init where nothing else is, did not reap yet)
    script = (f'if [ "$GPULAYER_ATTEMPT" = 1 ]; then setsid sleep 300 & echo $! > {left}; wait; '
              f'elif grep -qs "^State:[[:space:]]*[RSDT]" /proc/$(cat {left})/status; then echo left-running; '
              f'else echo ended; fi')
    first = plane.start_worker("--cpu-slots", "1")
    wait_for(lambda: len(plane.online_workers()) == 1, 60, "the first worker")
    job_id = cli("submit", "--detach", "--retries", "1", "--", "sh", "-c", script, check=True).stdout.strip()
    wait_for(lambda: left.exists() and left.read_text().strip(), 60, "the first attempt's leftover")
    leftover = psutil.Process(int(left.read_text()))
    plane.start_worker("--cpu-slots", "1")  # running before the first one dies: no start of its sweeps it
    wait_for(lambda: len(plane.online_workers()) == 2, 60, "the second worker")
    first.kill()
    first.wait(30)
    job = gl.get_job(job_id)
    assert job.result(timeout=120) == 0
    assert job.logs() == "ended\n"
    assert [t.attempt for t in job.record().tasks] == [1, 2]
    assert not leftover.is_running() or leftover.status() == psutil.STATUS_ZOMBIE


def test_logs_follow_streams_until_the_end(plane: Plane) -> None:
    worker = plane.start_worker()
    try:
        wait_for(plane.online_workers, what="worker")
        job_id = cli("submit", "--detach", "--", "sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.2; done",
                     check=True).stdout.strip()
        follow = cli("jobs", "logs", job_id, "--follow", timeout=60)
        assert follow.stdout == "line1\nline2\nline3\n"
        result = cli("jobs", "result", job_id)
        assert json.loads(result.stdout) == {"exit_code": 0}
    finally:
        stop(worker)


def test_worker_status_json_reports_frameworks_and_availability(plane: Plane) -> None:
    worker = plane.start_worker("--cpu-slots", "3", env=fake_devices_env("cuda:2:80:9.0"))
    try:
        wait_for(plane.online_workers, what="worker")
        status = json.loads(cli("worker", "status", "--json", check=True).stdout)
        assert len(status) == 1
        st = status[0]
        assert st["frameworks"]["torch"].startswith("2.")
        assert "torch.cuda" not in st["frameworks"]
        assert st["availability"]["online"] is True
        assert st["availability"]["free_cpu_slots"] == 3
        assert st["availability"]["devices"] == {"cuda": {"total": 2, "free": 2}}
        text = cli("worker", "status", check=True).stdout
        assert "device    [0] cuda" in text
    finally:
        stop(worker)


def test_bad_cli_input_names_the_flag(plane: Plane) -> None:
    proc = cli("submit", "--framework", "torch>>2", "--", "true")
    assert proc.returncode == 2
    assert "torch>>2" in proc.stderr
    proc = cli("submit", "--target", "moon", "--", "true")
    assert proc.returncode == 2
    assert "target" in proc.stderr and "local" in proc.stderr
    proc = cli("submit", "--profile", "nope", "--", "true")
    assert proc.returncode == 2
    assert "pytorch-cuda" in proc.stderr
    proc = cli("jobs", "show", "job-doesnotexist")
    assert proc.returncode == 2
    assert "no such job" in proc.stderr
    assert json.loads(cli("jobs", "list", "--json").stdout) == []


def test_detached_job_without_a_worker_gets_a_background_worker(home: Path) -> None:
    proc = cli("submit", "--detach", "--", "sh", "-c", "echo detached-ok")
    assert proc.returncode == 0, proc.stderr
    assert "started a background worker" in proc.stderr
    job_id = proc.stdout.strip()
    try:
        result = cli("jobs", "result", job_id, "--timeout", "60")
        assert json.loads(result.stdout) == {"exit_code": 0}, result.stderr
        assert cli("jobs", "logs", job_id).stdout == "detached-ok\n"
    finally:
        workers = [w.pid for w in gl.connect().api.list_workers() if w.pid]
        # the background worker outlived the command that started it: the teardown's
        # stop_strays (tests/support.py) finds it by its home, and stops it
        assert set(workers) <= set(stop_strays(home)), workers


def test_functions_of_modules_run_with_python_dash_m(home: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "proj" / "mypkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("def twice(x):\n    return 2 * x\n")
    (pkg / "cli.py").write_text(textwrap.dedent("""
        import gpulayer as gl
        from . import helper

        @gl.remote
        def f(x):
            return helper.twice(x)

        if __name__ == "__main__":
            print(f.function, f.remote(21).result(timeout=60))
    """))
    (pkg / "__main__.py").write_text(textwrap.dedent("""
        import gpulayer as gl

        @gl.remote
        def g(x):
            return x + 1

        if __name__ == "__main__":
            print(g.function, g.remote(1).result(timeout=60))
    """))
    for module, expected in (("mypkg.cli", "mypkg.cli:f 42"), ("mypkg", "mypkg.__main__:g 2")):
        proc = subprocess.run([sys.executable, "-m", module], cwd=tmp_path / "proj", capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == expected


# --------------------------------------------------------------------------- bad input to `gpulayer submit`

TEXT = "UTF-8 text without NUL bytes"
KINDS = "cuda, mps, rocm"
TIMEOUT = "accepted: a number of seconds > 0 (leave it out for no limit)"
DEVICES = f"--accelerator KIND ({KINDS}), or with a --profile that names one"

#: (arguments of `gpulayer submit`, before `-- true` unless they hold their own `--`; the exact error)
SUBMIT_BAD: list[tuple[list[str], str]] = [
    (["--gpus", "2"], f"--gpus 2: devices need an accelerator, and none is named; accepted: --gpus together with {DEVICES}"),
    (["--profile", "cpu", "--gpus", "1"],
     f"--gpus 1: devices need an accelerator, and the profile 'cpu' names none; accepted: --gpus together with {DEVICES}"),
    (["--min-gpu-memory", "40"], "--min-gpu-memory 40: applies only to accelerator devices, and none is named; "
     f"accepted: --min-gpu-memory together with {DEVICES}"),
    (["--compute-capability", "8.0"], "--compute-capability 8.0: applies only to accelerator devices, and none is "
     f"named; accepted: --compute-capability together with {DEVICES}"),
    (["--accelerator", "nosuch"], f"--accelerator nosuch: no installed plugin detects this accelerator kind; known "
     f"kinds: {KINDS}, or cpu for none. For a kind only the server's workers know, add --allow-unknown-accelerator"),
    (["--accelerator", "c u"], "--accelerator 'c u': not an accelerator kind; accepted: a kind such as 'cuda', "
     "'rocm' or 'mps', or 'cpu' for none"),
    (["--launcher", "nosuch"],
     "--launcher nosuch: no installed plugin offers this distributed launcher; installed launchers: torchrun"),
    (["--nodes", "2", "--launcher", "nosuch"],
     "--launcher nosuch: no installed plugin offers this distributed launcher; installed launchers: torchrun"),
    (["--profile", "nope"], "--profile nope: no installed plugin offers this runtime profile; known profiles: cpu, "
     "cupy-cuda, jax-cuda, mlx, onnxruntime-cuda, pytorch-cuda, pytorch-mps, pytorch-rocm"),
    (["--timeout", "inf"], f"--timeout inf: not a finite number; {TIMEOUT}"),
    (["--timeout", "nan"], f"--timeout nan: not a finite number; {TIMEOUT}"),
    (["--timeout", "0"], f"--timeout 0: must be more than 0; {TIMEOUT}"),
    (["--target", "moon"], "--target moon: not one of the choices; accepted: local, remote or cloud"),
    (["--fallback", "moon"], "--fallback moon: not one of the choices; accepted: local, remote or cloud, each listed once"),
    (["--target", "remote", "--fallback", "remote"], "--fallback remote: 'remote' is the target already; accepted: "
     "targets other than the target, each listed once"),
    (["--on-unschedulable", "sometimes"], "--on-unschedulable sometimes: not one of the choices; accepted: fail or wait"),
    (["--framework", "torch>>2"], "--framework 'torch>>2': '>>2' is not a PEP 440 version specifier; accepted: "
     "comma-separated clauses such as '>=2.2', '==2.3.*', '>=1.0,<2'"),
    (["-a", "cuda", "--compute-capability", "eight"], "--compute-capability eight: 'eight' is not a PEP 440 version "
     "specifier; accepted: a version such as 8.0 (meaning >=8.0) or PEP 440 clauses such as '>=8.0,<9'"),
    (["--python-version", "3.x"], "--python-version 3.x: '3.x' is not a PEP 440 version specifier; accepted: a "
     "version such as 3.11 (meaning >=3.11) or PEP 440 clauses such as '>=3.10,<3.13'"),
    (["-a", "cuda", "--gpus", "-1"], "--gpus -1: must be at least 0; accepted: a whole number >= 0 (devices per node)"),
    (["-a", "cuda", "--min-gpu-memory", "0"], "--min-gpu-memory 0: must be more than 0; accepted: a number of GB > 0"),
    (["--cpus", "-1"], "--cpus -1: must be at least 0; accepted: a whole number >= 0"),
    (["--memory", "-1"], "--memory -1: must be at least 0; accepted: a number of GB >= 0"),
    (["--retries", "101"], "--retries 101: must be at most 100; accepted: a whole number from 0 to 100"),
    (["--priority", "5000"], "--priority 5000: must be at most 1000; accepted: a whole number from -1000 to 1000"),
    (["--nodes", "0"], "--nodes 0: must be at least 1; accepted: a whole number from 1 to 1024"),
    (["--nproc-per-node", "0"], "--nproc-per-node 0: must be at least 1; accepted: a whole number from 1 to 1024"),
    (["--env", "A-B=1"], "--env A-B=1: not an environment variable name; accepted: letters, digits and '_', not "
     "starting with a digit"),
    (["--env", "AB"], "--env AB: no '='; accepted: KEY=VALUE"),
    (["--label", "zone"], "--label zone: no '='; accepted: KEY=VALUE"),
    # bytes that are not UTF-8 arrive as lone surrogates (b"\xff" -> "\udcff")
    (["--env", "A=\udcff"], f"--env 'A=\\udcff': is not valid UTF-8 (a lone surrogate '\\udcff' at index 0); accepted: {TEXT}"),
    (["--label", "k=\udcff"], f"--label 'k=\\udcff': is not valid UTF-8 (a lone surrogate '\\udcff' at index 0); accepted: {TEXT}"),
    (["--name", "n\udcff"], f"--name 'n\\udcff': is not valid UTF-8 (a lone surrogate '\\udcff' at index 1); accepted: {TEXT}"),
    (["--", "echo", "\udcff"],
     f"argument 2 after -- '\\udcff': is not valid UTF-8 (a lone surrogate '\\udcff' at index 0); accepted: {TEXT}"),
    (["--nodes", "2", "--", "tr\udcffain.py", "--epochs", "3"],
     f"argument 1 after -- 'tr\\udcffain.py': is not valid UTF-8 (a lone surrogate '\\udcff' at index 2); accepted: {TEXT}"),
]


@pytest.mark.parametrize(("args", "message"), SUBMIT_BAD, ids=[" ".join(a) for a, _ in SUBMIT_BAD])
def test_bad_submit_flags_are_refused_naming_the_flag_as_typed(home: Path, args: list[str], message: str) -> None:
    proc = cli("submit", *args, *([] if "--" in args else ["--", "true"]))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: {message}\n"
    assert proc.stdout == ""


def test_refused_input_leaves_no_job_and_the_escape_hatch_submits(home: Path) -> None:
    assert cli("submit", "--accelerator", "npu", "--", "true").returncode == 2
    assert cli("submit", "--gpus", "2", "--", "true").returncode == 2
    assert json.loads(cli("jobs", "list", "--json", check=True).stdout) == []
    # a kind this client has no plugin for reaches the scheduler, which says who has none
    proc = cli("submit", "--accelerator", "npu", "--allow-unknown-accelerator", "--", "true")
    assert proc.returncode == 125, proc.stderr
    assert ": needs 1 usable npu device(s), worker has 0" in proc.stderr
    assert [j["state"] for j in json.loads(cli("jobs", "list", "--json", check=True).stdout)] == ["unschedulable"]


def undecorated() -> None:
    return None


def test_every_submit_flag_sets_the_field_the_sdk_sets(home: Path) -> None:
    from gpulayer import joboptions

    proc = cli("submit", "--dry-run", "--json", "--accelerator", "cuda", "--gpus", "2", "--min-gpu-memory", "40",
               "--compute-capability", "8.0", "--framework", "jax>=0.4", "--python-version", "3.10", "--os", "linux",
               "--cpus", "4", "--memory", "16", "--label", "zone=a", "--target", "local", "--fallback", "remote",
               "--on-unschedulable", "wait", "--timeout", "60", "--retries", "1", "--priority", "5",
               "--env", "A=1", "--name", "n", "--", "echo", "hi", check=True)
    options: joboptions.JobOptions = {
        "accelerator": "cuda", "gpus": 2, "min_gpu_memory_gb": 40, "compute_capability": "8.0",
        "frameworks": ["jax>=0.4"], "python_version": "3.10", "os": "linux", "cpus": 4, "memory_gb": 16,
        "labels": {"zone": "a"}, "target": "local", "fallback_targets": ["remote"], "on_unschedulable": "wait",
        "timeout": 60, "retries": 1, "priority": 5, "env": {"A": "1"}, "name": "n",
    }
    sdk = gl.remote(**options)(undecorated).spec()
    want = json.loads(sdk.model_dump_json(include={"requirements", "placement", "timeout", "retries", "priority",
                                                   "env", "name"}, exclude_defaults=True))
    got = json.loads(proc.stdout)["spec"]
    assert {k: got[k] for k in want} == want
    assert got["command"] == ["echo", "hi"]


def test_submit_without_bundle_notes_a_file_of_this_folder_the_command_names(home: Path, tmp_path: Path) -> None:
    """The job runs in a folder of its own: ``python train.py`` run here would not find
    train.py there, so submit says so (and what sends it); not with --bundle."""
    here = tmp_path / "project"
    here.mkdir()
    (here / "train.py").write_text("print('hi')\n")
    noted = cli("submit", "--dry-run", "--", "python", "train.py", cwd=here)
    assert noted.returncode == 0, noted.stderr
    assert noted.stderr.startswith("gpulayer: train.py is in this folder, and the job will not find it: "
                                   "a job runs in a folder of its own, with only the files --bundle DIR sends "
                                   "(--bundle . sends this one)\n")
    bundled = cli("submit", "--dry-run", "--bundle", ".", "--", "python", "train.py", cwd=here)
    assert bundled.returncode == 0 and "in this folder" not in bundled.stderr


def test_the_folders_of_a_killed_worker_s_tasks_are_removed_by_the_next_worker(home: Path, tmp_path: Path) -> None:
    """A worker killed with SIGKILL (the OOM killer) while it ran a command job and a
    function job left their folders for ever: the command's scratch folder in
    ``$GPULAYER_HOME/tasks`` (with whatever the job wrote there) and the worker's FunctionJob
    files folder in ``$TMPDIR``; neither a later worker's start nor its stop removed them. The
    next worker on the machine removes them now; a running worker's own stay."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}

    def left() -> tuple[list[Path], list[Path]]:
        return sorted((home / "tasks").glob("*")), sorted(tmp.glob("gpulayer-worker-*"))

    def run_two(worker: subprocess.Popen[str]) -> list[gl.JobHandle]:
        wait_for(lambda: [w for w in gl.connect().api.list_workers() if w.online and w.pid == worker.pid],
                 60, "the worker")
        jobs = [gl.submit(gl.CommandJob(command=["sh", "-c", "head -c 100000 /dev/zero > out.bin; sleep 300"])),
                gl.submit(gl.FunctionJob(function="time:sleep", args=[300]))]
        wait_for(lambda: all(j.status() == "running" for j in jobs) and list((home / "tasks").rglob("out.bin")),
                 60, "the jobs to run")
        return jobs

    workers = [start_worker("--cpu-slots", "2", env=env)]
    try:
        killed = run_two(workers[0])
        before = left()
        assert before[0] and len(before[1]) == 1, before
        workers[0].kill()
        workers[0].wait(30)
        gl.cancel(killed)
        workers.append(start_worker("--cpu-slots", "2", env=env))
        running = run_two(workers[1])  # (its start removed the killed one's folders)
        now = left()
        assert not set(now[0]) & set(before[0]) and not set(now[1]) & set(before[1]), (before, now)
        workers.append(start_worker("--cpu-slots", "1", env=env))  # the running worker's stay
        wait_for(lambda: len([w for w in gl.connect().api.list_workers() if w.online]) == 2, 60, "a third worker")
        assert left() == now
        gl.cancel(running)
    finally:
        for w in workers:
            stop(w)
        stop_strays(home)
    assert left() == ([], [])
