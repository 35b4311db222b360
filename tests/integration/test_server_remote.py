"""Remote workers and clients against a real server process: jobs through the SDK, a worker
killed mid-task, the server killed mid-run, TLS with a pinned self-signed certificate."""

from __future__ import annotations

import signal
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from gpulayer import client as client_mod
from gpulayer.client import http_client
from gpulayer.errors import RemoteError
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob, FunctionJob, Placement
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, until, wait_workers

pytestmark = pytest.mark.timeout(400)

REMOTE = Placement(target="remote", on_unschedulable="wait")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A server (heartbeat timeout 3 s) and a way to add workers; all stopped afterwards."""
    srv = ServerProc(tmp_path / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "3"}).start()
    admin = Api(srv.url, srv.admin_token)
    join = admin.token_for("join")["token"]
    workers: list[Any] = []

    def add_worker(slots: int = 2) -> Any:
        p = start_remote_worker(srv.url, join, tmp_path / f"worker{len(workers)}", cpu_slots=slots)
        workers.append(p)
        return p

    yield {"server": srv, "admin": admin, "join": join, "add_worker": add_worker, "tmp": tmp_path}
    for p in workers:
        stop_proc(p, signal.SIGKILL)
    srv.stop()


def test_remote_worker_runs_command_and_function_jobs_via_sdk(stack: dict[str, Any], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    srv, admin = stack["server"], stack["admin"]
    stack["add_worker"]()
    workers = wait_workers(admin, 1)
    assert workers[0]["origin"] == "existing"
    client_token = admin.token_for("client")["token"]
    monkeypatch.setenv("GPULAYER_URL", srv.url)
    monkeypatch.setenv("GPULAYER_TOKEN", client_token)
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "client-home"))
    client_mod.reset()
    h = gl.submit(CommandJob(command=["sh", "-c", "echo hello from $GPULAYER_JOB_ID"], placement=REMOTE))
    assert h.result(timeout=60) == 0
    assert h.logs().strip() == f"hello from {h.id}"
    # a function job with its source in a bundle, uploaded through the server
    src = tmp_path / "src"
    src.mkdir()
    (src / "mathmod.py").write_text(textwrap.dedent("""
        def add(a, b):
            return {"sum": a + b}
    """))
    h2 = gl.submit(FunctionJob(function="mathmod:add", args=[2, 3], bundle=str(src), placement=REMOTE))
    assert h2.result(timeout=60) == {"sum": 5}
    # a function that raises comes back as RemoteError
    h3 = gl.submit(FunctionJob(function="json:loads", args=["{"], placement=REMOTE))
    with pytest.raises(RemoteError):
        h3.result(timeout=60)
    # the client token sees its jobs; the worker's record is visible
    c = client_mod.connect()
    assert not c.embedded and c.location == stack["server"].url
    assert {j.id for j in c.api.list_jobs()} >= {h.id, h2.id, h3.id}
    assert c.api.list_workers()[0].id == workers[0]["id"]


def test_killed_worker_tasks_are_lost_and_retried_elsewhere(stack: dict[str, Any]) -> None:
    admin = stack["admin"]
    a = stack["add_worker"](1)
    b = stack["add_worker"](1)
    ws = wait_workers(admin, 2)
    c = http_client(stack["server"].url, token=admin.token, retry_for=5)
    # the first attempt runs until its worker is killed, however late that comes (it dies with
    # the worker: the parent-death signal is kept across the exec); the retry ends at once
    job = c.submit(CommandJob(command=["sh", "-c", 'if [ "$GPULAYER_ATTEMPT" = 1 ]; then exec sleep 120; fi'],
                              retries=1, placement=REMOTE))
    rec = until(lambda: (j := c.api.get_job(job.id)).state is JobState.RUNNING and j, 60, "the job to run")
    first_worker = rec.tasks[-1].worker_id
    pids = {w["id"]: w["pid"] for w in ws}
    victim = a if a.pid == pids[first_worker] else b
    assert victim.pid == pids[first_worker]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    done = c.wait(job.id, timeout=60)
    assert done.state is JobState.SUCCEEDED, done
    assert done.attempt == 2
    states = [(t.attempt, t.state, t.worker_id) for t in done.tasks]
    assert states[0][1] is TaskState.LOST and states[0][2] == first_worker
    assert states[1][1] is TaskState.SUCCEEDED and states[1][2] != first_worker
    offline = next(w for w in c.api.list_workers() if w.id == first_worker)
    assert not offline.online


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_server_killed_twice_mid_run_loses_nothing_and_runs_nothing_twice(
        tmp_path: Path, request: pytest.FixtureRequest, database: str) -> None:
    """kill -9 of the server twice during a few hundred short jobs, restarted on the same
    home (and database): every job ends once, succeeded; none runs twice unless a task of it
    was lost (executions are counted in side files)."""
    url = request.getfixturevalue("postgres_url") if database == "postgresql" else None
    srv = ServerProc(tmp_path / "server", database=url).start()
    admin = Api(srv.url, srv.admin_token)
    join = admin.token_for("join")["token"]
    marks = tmp_path / "marks"
    marks.mkdir()
    workers = [start_remote_worker(srv.url, join, tmp_path / f"w{i}", cpu_slots=4) for i in range(2)]
    try:
        wait_workers(admin, 2)
        c = http_client(srv.url, token=srv.admin_token, retry_for=60)
        n = 120
        ids: list[str] = []
        errors: list[BaseException] = []

        def submit_all() -> None:
            try:
                for i in range(n):
                    job = c.submit(CommandJob(
                        command=["sh", "-c", f"echo $GPULAYER_ATTEMPT >> {marks}/$GPULAYER_JOB_ID; sleep 0.05"],
                        placement=REMOTE, retries=2), idempotency_key=f"job-{i}")
                    ids.append(job.id)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        t = threading.Thread(target=submit_all)
        t.start()
        for kill_at in (30, 80):
            until(lambda k=kill_at: len(ids) >= k, 120, f"{kill_at} submissions")
            srv.kill(signal.SIGKILL)
            time.sleep(1.0)
            srv.start()
        t.join(180)
        assert not errors, errors
        assert len(ids) == n and len(set(ids)) == n  # a retried submit never made a second job
        final = {i: c.wait(i, timeout=180) for i in ids}
        states = Counter(j.state for j in final.values())
        assert states == {JobState.SUCCEEDED: n}, states
        twice = []
        for j in final.values():
            runs = (marks / j.id).read_text().split()
            lost = [tk for tk in j.tasks if tk.state is TaskState.LOST]
            assert len(runs) == 1 + len(lost), (j.id, runs, [tk.state for tk in j.tasks])
            if len(runs) > 1:
                twice.append(j.id)
        assert len(c.api.list_jobs(limit=1000)) == n
        print(f"{database}: {n} jobs, 2 server kills: 0 lost, {len(twice)} ran twice after a lost task")
    finally:
        for w in workers:
            stop_proc(w, signal.SIGKILL)
        srv.stop()


def test_a_server_down_for_longer_than_the_heartbeat_timeout_loses_nothing(tmp_path: Path) -> None:
    """The worker keeps running its task through the outage; after the restart it is given
    a grace period, reconnects, and its report counts: the job succeeds, having run once."""
    outage = 5.0  # seconds the server is down
    srv = ServerProc(tmp_path / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "3"}).start()
    admin = Api(srv.url, srv.admin_token)
    join = admin.token_for("join")["token"]
    marks = tmp_path / "marks"
    worker = start_remote_worker(srv.url, join, tmp_path / "w", cpu_slots=1)
    try:
        wait_workers(admin, 1)
        c = http_client(srv.url, token=srv.admin_token, retry_for=60)
        job = c.submit(CommandJob(command=["sh", "-c", f"echo run >> {marks}; sleep 6"], retries=1,
                                  placement=REMOTE))
        until(lambda: c.api.get_job(job.id).state is JobState.RUNNING, 60, "the job to run")
        srv.kill(signal.SIGKILL)
        time.sleep(outage)
        # restarted with a heartbeat timeout as long as the outage: the worker's last heartbeat
        # (before the kill) is older than that when the server comes back, however fast it
        # does, so only the grace keeps the worker online; and the grace (one heartbeat
        # timeout) leaves the worker, whose calls retry a refused connection every 2 s at
        # most, time to reconnect on a slow machine
        srv.extra_env["GPULAYER_HEARTBEAT_TIMEOUT"] = str(outage)
        srv.start()
        done = c.wait(job.id, timeout=90)
        assert done.state is JobState.SUCCEEDED, (done.state, done.error, srv.log()[-2000:])
        assert [t.state for t in done.tasks] == [TaskState.SUCCEEDED]
        assert marks.read_text().split() == ["run"]  # ran exactly once
        assert all(w.online for w in c.api.list_workers())
    finally:
        stop_proc(worker, signal.SIGKILL)
        srv.stop()


def test_output_a_task_writes_while_its_server_is_down_is_stored_once_it_is_back(tmp_path: Path) -> None:
    """The worker ships it when the server is back, though the task ended meanwhile: the
    task's output went on being read while a shipment retried through the outage (a reader
    kept waiting for it lost what the task wrote after it, the job still succeeding)."""
    srv = ServerProc(tmp_path / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "5"}).start()
    admin = Api(srv.url, srv.admin_token)
    done_mark = tmp_path / "done"
    worker = start_remote_worker(srv.url, admin.token_for("join")["token"], tmp_path / "w", cpu_slots=1)
    try:
        wait_workers(admin, 1)
        c = http_client(srv.url, token=srv.admin_token, retry_for=60)
        script = (f"echo tick 0; while [ ! -e {done_mark}.go ]; do sleep 0.1; done; "
                  f"for i in 1 2 3 4 5; do echo tick $i; sleep 0.2; done; touch {done_mark}")
        job = c.submit(CommandJob(command=["sh", "-c", script], placement=REMOTE))
        until(lambda: "tick 0" in "".join(ch.data for ch in c.api.logs(job.id)), 60, "the first output")
        srv.kill(signal.SIGKILL)
        (tmp_path / "done.go").touch()  # the task writes the rest while the server is down
        until(done_mark.exists, 60, "the task to write the rest of its output")
        time.sleep(3.0)  # (its process ended: the worker reads its pipes 2 s more at most)
        srv.start()
        done = c.wait(job.id, timeout=90)
        assert done.state is JobState.SUCCEEDED, (done.state, done.error)
        text = "".join(ch.data for ch in c.api.logs(job.id))
        assert text == "".join(f"tick {i}\n" for i in range(6)), text
    finally:
        stop_proc(worker, signal.SIGKILL)
        srv.stop()


def test_a_worker_stopped_while_its_server_is_down_stops_without_retrying_for_the_retry_period(
        tmp_path: Path) -> None:
    """Its drain and its deregistration each retried for GPULAYER_HTTP_RETRY_SECONDS, saying
    nothing, before it even began its grace and before it exited."""
    srv = ServerProc(tmp_path / "server").start()
    admin = Api(srv.url, srv.admin_token)
    worker = start_remote_worker(srv.url, admin.token_for("join")["token"], tmp_path / "w", cpu_slots=1,
                                 env={"GPULAYER_HTTP_RETRY_SECONDS": "600"})
    try:
        wait_workers(admin, 1)
        srv.kill(signal.SIGKILL)
        worker.send_signal(signal.SIGTERM)
        # (a hang check, not a measure: each call would retry for 600 s)
        assert worker.wait(timeout=120) == 0
        log = (tmp_path / "w" / "worker.log").read_text()
        assert "mark the worker draining: no answer from the control plane within 5 s" in log, log
        assert "deregister the worker: no answer from the control plane within 5 s" in log, log
    finally:
        stop_proc(worker, signal.SIGKILL)


def test_tls_self_signed_with_pinned_fingerprint(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "server", args=("--self-signed",)).start()
    try:
        info = (tmp_path / "server" / "server.json").read_text()
        import json

        fp = json.loads(info)["fingerprint"]
        assert fp.startswith("sha256:")
        assert f"TLS certificate fingerprint: {fp}" in srv.log()
        ok = http_client(srv.url, token=srv.admin_token, ca=fp, retry_for=1)
        assert ok.api.list_jobs() == []
        ca = http_client(srv.url, token=srv.admin_token, ca=str(tmp_path / "server" / "tls" / "server.crt"), retry_for=1)
        assert ca.api.list_workers() == []
        from gpulayer.errors import AuthError, ConnectionFailed

        with pytest.raises(AuthError):
            http_client(srv.url, token=srv.admin_token, ca="sha256:" + "00" * 32, retry_for=1)
        with pytest.raises(ConnectionFailed):  # the system trust store does not know it
            http_client(srv.url, token=srv.admin_token, retry_for=0.5).api.list_jobs()
    finally:
        srv.stop()


def test_non_loopback_plain_http_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.server_support import base_env

    r = subprocess.run([sys.executable, "-m", "gpulayer.cli", "server", "start", "--host", "0.0.0.0", "--port", "1"],
                       env=base_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refusing to serve plain HTTP" in r.stderr
