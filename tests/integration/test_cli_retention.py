"""``gpulayer jobs delete`` and ``gpulayer jobs prune`` as a user runs them (docs/concepts.md,
Deleting jobs), their bad input, and ``GPULAYER_KEEP_JOBS`` in a real ``gpulayer worker start``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server_support import stop_proc
from tests.support import cli


def _worker(env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "worker", "start", "--cpu-slots", "2", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    assert proc.stdout.readline(), "the worker printed no ready line"  # (EOF if it cannot start)
    return proc


@pytest.fixture
def worker(home: Path) -> Iterator[None]:
    proc = _worker()
    try:
        yield
    finally:
        stop_proc(proc)


def _detach(*command: str) -> str:
    return cli("submit", "--detach", "--", *command, check=True).stdout.strip()


def _ids() -> set[str]:
    return {j["id"] for j in json.loads(cli("jobs", "list", "--json", check=True).stdout)}


@pytest.mark.usefixtures("worker")
def test_delete_and_prune_as_a_user_runs_them() -> None:
    ok, ok2, failed = _detach("echo", "hi"), _detach("true"), _detach("sh", "-c", "exit 3")
    slow = _detach("sleep", "600")  # (cancelled below: the time is only a bound)
    assert cli("jobs", "wait", ok, ok2, timeout=60).returncode == 0
    assert cli("jobs", "wait", failed, timeout=60).returncode == 3

    deleted = cli("jobs", "delete", ok, slow, "job-000000000000", "--json")
    assert deleted.returncode == 2, deleted.stderr
    records = json.loads(deleted.stdout)
    assert [(r["id"], r["deleted"]) for r in records] == [(ok, True), (slow, False), ("job-000000000000", False)]
    assert f"only a job that has ended is deleted; cancel it first (gpulayer jobs cancel {slow})" in deleted.stderr
    assert "job 'job-000000000000': no such job" in deleted.stderr
    gone = cli("jobs", "logs", ok)
    assert gone.returncode == 2 and "no such job" in gone.stderr
    assert _ids() == {ok2, failed, slow}

    dry = cli("jobs", "prune", "--older-than", "0", "--dry-run", check=True)
    assert dry.stdout == "would delete 2 job(s) that have ended (nothing deleted: --dry-run)\n"
    assert cli("jobs", "prune", "--older-than", "1h", check=True).stdout.startswith("deleted 0 job(s) that ended at least 1h ago")
    pruned = cli("jobs", "prune", "--older-than", "0", "--state", "failed", "--json", check=True)
    assert json.loads(pruned.stdout) == {"jobs": 1, "bundles": 0, "dry_run": False}
    assert _ids() == {ok2, slow}
    assert cli("jobs", "delete", ok2, check=True).stdout == f"deleted {ok2}\n"
    cli("jobs", "cancel", slow, check=True)


@pytest.mark.parametrize(("args", "message"), [
    (["--older-than", "abc"], "--older-than 'abc': expected a number with an optional unit s, m, h or d"),
    (["--older-than", "-1d"], "--older-than '-1d': expected more than 0 seconds"),
    (["--older-than", "1d", "--state", "running"],
     "--state 'running': accepted: an ended state, one of succeeded, failed, cancelled, timed_out, unschedulable"),
    ([], "Missing option '--older-than'"),
])
def test_prune_refuses_bad_input_with_exit_2(home: Path, args: list[str], message: str) -> None:
    proc = cli("jobs", "prune", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_keep_jobs_deletes_old_jobs_in_a_worker(home: Path) -> None:
    first = _worker()
    try:
        done = _detach("true")
        assert cli("jobs", "wait", done, timeout=60).returncode == 0
    finally:
        stop_proc(first)
    time.sleep(1.1)  # (older than the 1 s kept below)
    keeper = _worker({"GPULAYER_KEEP_JOBS": "1s"})
    try:
        deadline = time.monotonic() + 30
        while done in _ids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done not in _ids()
    finally:
        stop_proc(keeper)
    bad = cli("worker", "start", env={"GPULAYER_KEEP_JOBS": "forever"})
    assert bad.returncode == 2 and "GPULAYER_KEEP_JOBS='forever'" in bad.stderr, bad.stderr


def test_keep_jobs_deletes_old_jobs_in_a_server(tmp_path: Path) -> None:
    """A real ``gpulayer server start`` with ``GPULAYER_KEEP_JOBS``: its housekeeping pass
    deletes a job that ended longer ago; a client token prunes its own jobs only."""
    from tests.server_support import Api, ServerProc

    srv = ServerProc(tmp_path / "server", env={"GPULAYER_KEEP_JOBS": "2s"}).start()
    try:
        admin = Api(srv.url, srv.admin_token)
        users = [Api(srv.url, admin.token_for("client")["token"]) for _ in range(2)]
        spec = {"spec": {"kind": "command", "command": ["true"],
                         "placement": {"target": "remote", "on_unschedulable": "wait"}}}
        jobs = []
        for user in users:
            r = user("POST", "/v1/jobs", json=spec)
            assert r.status_code == 201, r.text
            jobs.append(r.json()["id"])
            assert user("POST", f"/v1/jobs/{jobs[-1]}/cancel").status_code == 200
        pruned = users[0]("POST", "/v1/jobs/prune", json={"older_than": 0, "dry_run": True})
        assert pruned.status_code == 200 and pruned.json() == {"jobs": 1, "bundles": 0, "dry_run": True}
        deadline = time.monotonic() + 30
        while admin("GET", "/v1/jobs").json() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert admin("GET", "/v1/jobs").json() == []
        assert "GPULAYER_KEEP_JOBS: deleted 2 job(s)" in srv.log()
    finally:
        srv.stop()


def test_a_delete_sent_again_after_its_answer_was_lost_says_the_jobs_deleted(tmp_path: Path) -> None:
    """The answer to ``POST /v1/jobs/delete`` lost on the way (a relay closes the connection
    as it comes out of the server): the CLI sent it again, the server found no such jobs any
    more, and the command said "no such job" for each and exited 2, for a delete that did what
    it was asked. A job the first try left (not ended) is still said as such."""
    import re

    from tests.relay import Relay
    from tests.server_support import Api, ServerProc

    srv = ServerProc(tmp_path / "server").start()
    relay = Relay(srv.port)
    try:
        admin = Api(srv.url, srv.admin_token)
        jobs = [_queued(admin, cancelled=True), _queued(admin, cancelled=True), _queued(admin)]
        env = {"GPULAYER_URL": relay.url, "GPULAYER_TOKEN": srv.admin_token}
        relay.drop_next(re.compile(rb"POST /v1/jobs/delete "))
        deleted = cli("jobs", "delete", *jobs, env=env)
        assert relay.fired.is_set()
        assert deleted.stdout.splitlines() == [f"deleted {jobs[0]}", f"deleted {jobs[1]}"], deleted.stderr
        assert (deleted.returncode, deleted.stderr.strip()) == (
            2, f"error: job {jobs[2]} is queued: only a job that has ended is deleted; cancel it first "
               f"(gpulayer jobs cancel {jobs[2]})")
        assert [j["id"] for j in admin("GET", "/v1/jobs").json()] == [jobs[2]]
        again = cli("jobs", "delete", jobs[0], env=env)  # (no answer lost: no such job, as before)
        assert (again.returncode, again.stderr.strip()) == (2, f"error: job {jobs[0]!r}: no such job")
    finally:
        relay.close()
        srv.stop()


def test_a_prune_sent_again_after_its_answer_was_lost_says_its_count_may_be_short(tmp_path: Path) -> None:
    """The answer to ``POST /v1/jobs/prune`` lost on the way: the CLI sent it again, the
    server found the jobs the first try deleted gone, and the command said "deleted 0 job(s)"
    for a prune that deleted two. What the first try deleted cannot be known; the count is
    said to be a lower bound, in words and in ``--json``, and a prune whose answer came
    (or an embedded one) says its count as it is."""
    import re

    from tests.relay import Relay
    from tests.server_support import Api, ServerProc

    srv = ServerProc(tmp_path / "server").start()
    relay = Relay(srv.port)
    try:
        admin = Api(srv.url, srv.admin_token)

        def ended_jobs(n: int) -> None:
            for _ in range(n):
                _queued(admin, cancelled=True)

        env = {"GPULAYER_URL": relay.url, "GPULAYER_TOKEN": srv.admin_token}
        ended_jobs(2)
        relay.drop_next(re.compile(rb"POST /v1/jobs/prune "))
        pruned = cli("jobs", "prune", "--older-than", "0", env=env)
        assert relay.fired.is_set()
        assert (pruned.returncode, pruned.stdout.strip()) == (
            0, "deleted at least 0 job(s) that have ended, with their output, results and events (its answer "
               "lost, the prune was sent again: what the first try deleted is not counted)"), pruned.stderr
        assert admin("GET", "/v1/jobs").json() == []
        ended_jobs(1)
        relay.drop_next(re.compile(rb"POST /v1/jobs/prune "))
        pruned = cli("jobs", "prune", "--older-than", "0", "--json", env=env)
        assert json.loads(pruned.stdout) == {"jobs": 0, "bundles": 0, "dry_run": False, "at_least": True}
        ended_jobs(1)
        pruned = cli("jobs", "prune", "--older-than", "0", env=env)  # (no answer lost: the count as it is)
        assert pruned.stdout.strip() == "deleted 1 job(s) that have ended, with their output, results and events"
    finally:
        relay.close()
        srv.stop()


def _queued(admin: Any, *, cancelled: bool = False) -> str:
    """A job of the server ``admin`` calls (an Api) that waits in its queue, no worker being
    there (``cancelled``: then cancelled, an ended job); its id."""
    r = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"],
                                                 "placement": {"target": "remote", "on_unschedulable": "wait"}}})
    assert r.status_code == 201, r.text
    if cancelled:
        assert admin("POST", f"/v1/jobs/{r.json()['id']}/cancel").status_code == 200
    return str(r.json()["id"])
