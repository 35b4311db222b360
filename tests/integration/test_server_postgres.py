"""The server on PostgreSQL: jobs run, a restart resumes, two servers sharing one database
never hand out the same task twice, and a database that goes away is said to clients
without its host or port."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from gpulayer.client import Client, http_client
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob, Placement
from tests.relay import Relay
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers
from tests.support import cli

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(400)]

REMOTE = Placement(target="remote", on_unschedulable="wait")


def test_server_on_postgres_runs_jobs_and_resumes_after_restart(postgres_url: str, tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "s", database=postgres_url).start()
    admin = Api(srv.url, srv.admin_token)
    w = start_remote_worker(srv.url, admin.token_for("join")["token"], tmp_path / "w", cpu_slots=2)
    try:
        wait_workers(admin, 1)
        c = http_client(srv.url, token=srv.admin_token, retry_for=30)
        first = c.submit(CommandJob(command=["echo", "pg"], placement=REMOTE))
        assert c.wait(first.id, timeout=60).state is JobState.SUCCEEDED
        srv.stop()
        srv.start()  # same database: the job, the tokens and the worker are still there
        assert c.api.get_job(first.id).state is JobState.SUCCEEDED
        assert c.api.logs(first.id)[0].data == "pg\n"
        second = c.submit(CommandJob(command=["true"], placement=REMOTE))
        assert c.wait(second.id, timeout=60).state is JobState.SUCCEEDED
    finally:
        stop_proc(w, signal.SIGKILL)
        srv.stop()


def test_two_servers_on_one_database_never_assign_a_task_twice(postgres_url: str, tmp_path: Path) -> None:
    s1 = ServerProc(tmp_path / "s1", database=postgres_url).start()
    s2 = ServerProc(tmp_path / "s2", database=postgres_url).start()  # finds the admin token: makes none
    token = s1.admin_token
    assert not s2.admin_token_file.exists() and s1.admin_token_file.name.startswith("admin-")
    a1, a2 = Api(s1.url, token), Api(s2.url, token)
    workers = [start_remote_worker(s1.url, a1.token_for("join")["token"], tmp_path / "w1", cpu_slots=4),
               start_remote_worker(s2.url, a2.token_for("join")["token"], tmp_path / "w2", cpu_slots=4)]
    try:
        wait_workers(a1, 2)
        clients = [http_client(s.url, token=token, retry_for=30) for s in (s1, s2)]
        n = 120
        ids: list[str] = []
        lock = threading.Lock()

        def submit(c: Client, start: int) -> None:
            for _ in range(start, n, 2):
                job = c.submit(CommandJob(command=["true"], placement=REMOTE))
                with lock:
                    ids.append(job.id)

        threads = [threading.Thread(target=submit, args=(c, k)) for k, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(ids) == n
        final = [clients[k % 2].wait(j, timeout=120) for k, j in enumerate(ids)]
        assert Counter(j.state for j in final) == {JobState.SUCCEEDED: n}
        per_worker: Counter[str] = Counter()
        for j in final:
            per_attempt = Counter((t.attempt, t.node_rank) for t in j.tasks)
            assert all(v == 1 for v in per_attempt.values()), j.tasks
            assert [t.state for t in j.tasks] == [TaskState.SUCCEEDED]
            per_worker[j.tasks[0].worker_id] += 1
        assert len(per_worker) == 2, per_worker  # both servers' workers took work
    finally:
        for w in workers:
            stop_proc(w, signal.SIGKILL)
        s1.stop()
        s2.stop()


def test_a_single_use_token_joins_once_under_concurrent_joins(postgres_url: str, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.factories import make_capabilities

    s1 = ServerProc(tmp_path / "s1", database=postgres_url).start()
    s2 = ServerProc(tmp_path / "s2", database=postgres_url).start()
    try:
        admin = Api(s1.url, s1.admin_token)
        caps = make_capabilities().model_dump(mode="json")
        for scope, body, allowed in (("bootstrap", {}, 1), ("join", {"uses": 3}, 3)):
            secret = admin.token_for(scope, **body)["token"]

            def join(i: int, secret: str = secret) -> int:
                url = (s1.url, s2.url)[i % 2]  # two servers on one database, racing
                r = httpx.post(f"{url}/v1/workers/join", headers={"authorization": f"Bearer {secret}"},
                               json={"capabilities": caps, "name": f"racer{i}", "cpu_slots": 1}, timeout=60)
                return r.status_code

            with ThreadPoolExecutor(max_workers=16) as pool:
                codes = list(pool.map(join, range(16)))
            assert sorted(codes) == [201] * allowed + [401] * (16 - allowed) or \
                sorted(codes) == [200] * allowed + [401] * (16 - allowed), (scope, codes)
    finally:
        s1.stop()
        s2.stop()


def test_the_start_says_the_database_as_given_with_its_password_hidden(postgres_url: str, tmp_path: Path) -> None:
    """``--json`` gave ``"database": "127.0.0.1:5432/test?..."`` (all before the ``@`` cut off,
    the scheme too), and the log line ``postgresql+psycopg://`` where ``postgresql://`` was
    written; the password was hidden in both, and still is."""
    import json

    with_password = postgres_url.replace("://postgres@", "://postgres:s3cret@", 1)
    assert with_password != postgres_url  # (trust auth: the password is not checked)
    srv = ServerProc(tmp_path / "s", database=with_password, args=("--json",)).start()
    try:
        log = srv.log()
    finally:
        srv.stop()
    ready = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
    shown = with_password.replace(":s3cret@", ":***@")
    assert ready["database"] == shown
    assert f"(database {shown})" in log
    assert "s3cret" not in log


def test_a_database_server_that_goes_away_is_said_to_clients_without_its_host_or_port(
        postgres_url: str, tmp_path: Path) -> None:
    """A server whose PostgreSQL went away answered its clients 503 with psycopg's words:
    'connection to server at "127.0.0.1", port 5432 failed: Connection refused ...'. A client
    is now told the kind of failure alone, as for SQLite's files; the server's log keeps
    psycopg's words. (The database is reached through a relay, cut after the start.)"""
    parts = urlsplit(postgres_url)
    relay = Relay(parts.port or 5432)
    through = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{relay.port}"))
    srv = ServerProc(tmp_path / "s", database=through).start()
    try:
        admin = Api(srv.url, srv.admin_token)
        assert admin("GET", "/v1/jobs").status_code == 200
        relay.cut()
        said = "the server's database failed: could not connect to the database server (connection refused)"
        answer = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"]}})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == {"code": "database_failed", "message": said}
        listed = cli("--url", srv.url, "--token", srv.admin_token, "jobs", "list", env={"GPULAYER_HTTP_RETRY_SECONDS": "1"})
        assert (listed.returncode, listed.stdout, listed.stderr.strip()) == (1, "", f"error: {said}"), listed.stderr
    finally:
        relay.cut()
        srv.stop()
    assert f'port {relay.port} failed: Connection refused' in srv.log()
