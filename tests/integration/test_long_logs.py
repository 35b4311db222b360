"""A job's whole output, however many chunks it was shipped in and however large they are:
``gpulayer jobs logs`` and ``handle.logs()`` read every page of the ``logs`` API (at most
``MAX_LOG_CHUNKS`` chunks a request, ending with the chunk that brings the page's text to
``LOG_PAGE_TEXT``), embedded and through a server. (Before, both read the first page only: a
job that wrote a line every 0.1 s lost what it wrote after 17 minutes.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from gpulayer.api import LOG_PAGE_TEXT, MAX_LOG_CHUNKS, log_page_cut
from gpulayer.client import http_client
from gpulayer.control import ControlPlane
from gpulayer.records import TaskState
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store
from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc
from tests.support import cli

pytestmark = pytest.mark.timeout(300)

#: a page of chunks and a bit more; then chunks a third of a page's text each (a page holds three);
#: each time in both streams, the last chunk on stderr
MANY: list[tuple[Any, str]] = [("stdout", f"line {i}\n") for i in range(MAX_LOG_CHUNKS + 2)] + [("stderr", "done\n")]
LARGE: list[tuple[Any, str]] = [("stdout", f"{i}" * (LOG_PAGE_TEXT // 3) + "\n") for i in range(10)] + [
    ("stderr", "done\n")]
OUTPUTS = pytest.mark.parametrize("chunks", [MANY, LARGE], ids=["many", "large"])


def stdout_of(chunks: list[tuple[Any, str]]) -> str:
    return "".join(text for stream, text in chunks if stream == "stdout")


@OUTPUTS
def test_jobs_logs_and_handle_logs_read_every_page_embedded(home: Path, chunks: list[tuple[Any, str]]) -> None:
    cp = ControlPlane(Store())
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["true"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    cp.append_logs(a.task_id, worker_id=w.id, chunks=chunks)
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    first = cp.logs(job.id)  # one request's page: the rest is read after it
    assert log_page_cut(first) and len(first) == (MAX_LOG_CHUNKS if chunks is MANY else 3)

    assert gl.get_job(job.id).logs() == "".join(text for _, text in chunks)
    proc = cli("jobs", "logs", job.id, check=True)
    assert proc.stdout == stdout_of(chunks) and proc.stderr == "done\n"
    assert cli("jobs", "logs", job.id, "--node", "0", check=True).stdout == stdout_of(chunks)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, Api, str]]:
    """A server with one worker, whose tasks the tests start and end by hand."""
    srv = ServerProc(tmp_path_factory.mktemp("logs-server"))
    srv.start()
    admin = Api(srv.url, srv.admin_token)
    r = Api(srv.url, admin.token_for("join")["token"])(
        "POST", "/v1/workers/join", json={"capabilities": make_capabilities().model_dump(mode="json"), "cpu_slots": 1})
    assert r.status_code == 201, r.text
    yield srv, Api(srv.url, r.json()["token"]), r.json()["worker_id"]
    srv.stop()


@OUTPUTS
def test_jobs_logs_and_handle_logs_read_every_page_through_a_server(server: tuple[ServerProc, Api, str], tmp_path: Path,
                                                                    chunks: list[tuple[Any, str]]) -> None:
    srv, worker, worker_id = server
    client = http_client(srv.url, token=srv.admin_token)
    job = client.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [task_id] = [t["task_id"] for t in worker("GET", f"/v1/workers/{worker_id}/tasks", params={"wait": 10}).json()]
    assert worker("POST", f"/v1/tasks/{task_id}/start").status_code == 204
    r = worker("POST", f"/v1/tasks/{task_id}/logs", json={"chunks": [list(c) for c in chunks]})
    assert r.status_code == 204, r.text
    r = worker("POST", f"/v1/tasks/{task_id}/finish", json={"state": "succeeded", "exit_code": 0})
    assert r.status_code == 200, r.text

    assert len(client.api.logs(job.id)) == (MAX_LOG_CHUNKS if chunks is MANY else 3)
    assert gl.JobHandle(job.id, client).logs() == "".join(text for _, text in chunks)
    proc = cli("jobs", "logs", job.id, env={"GPULAYER_URL": srv.url, "GPULAYER_TOKEN": srv.admin_token,
                                            "GPULAYER_HOME": str(tmp_path)}, check=True)
    assert proc.stdout == stdout_of(chunks) and proc.stderr == "done\n"


#: a long output whose last lines cross chunks and streams, with characters of several bytes
#: and no line feed at its very end
TAILED: list[tuple[Any, str]] = [("stdout", f"line {i} ü\n") for i in range(3000)] + [
    ("stdout", "split "), ("stderr", "warn ✓\n"), ("stdout", "acröss\nthe end")]


def test_jobs_logs_tail_and_handle_logs_tail_through_a_server(server: tuple[ServerProc, Api, str], tmp_path: Path) -> None:
    """The last lines, found by the server from the newest chunk back; the CLI prints each
    stream to its own, and with --follow goes on to the job's end and exits with its outcome."""
    srv, worker, worker_id = server
    client = http_client(srv.url, token=srv.admin_token)
    job = client.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [task_id] = [t["task_id"] for t in worker("GET", f"/v1/workers/{worker_id}/tasks", params={"wait": 10}).json()]
    assert worker("POST", f"/v1/tasks/{task_id}/start").status_code == 204
    r = worker("POST", f"/v1/tasks/{task_id}/logs", json={"chunks": [list(c) for c in TAILED]})
    assert r.status_code == 204, r.text

    handle = gl.JobHandle(job.id, client)
    assert handle.logs(tail=3) == "split warn ✓\nacröss\nthe end"
    assert handle.logs(tail=0) == ""
    assert handle.logs(tail=5000) == "".join(text for _, text in TAILED)
    env = {"GPULAYER_URL": srv.url, "GPULAYER_TOKEN": srv.admin_token, "GPULAYER_HOME": str(tmp_path)}
    proc = cli("jobs", "logs", job.id, "--tail", "4", env=env, check=True)
    assert (proc.stdout, proc.stderr) == ("line 2999 ü\nsplit acröss\nthe end", "warn ✓\n")

    r = worker("POST", f"/v1/tasks/{task_id}/finish", json={"state": "failed", "exit_code": 3})
    assert r.status_code == 200, r.text
    proc = cli("jobs", "logs", job.id, "--tail", "2", "--follow", env=env)
    assert (proc.returncode, proc.stdout) == (3, "acröss\nthe end")
    assert proc.stderr.startswith("gpulayer: ") and "warn" not in proc.stderr

    # the API refuses a tail that is not a number of lines, naming it; and words a field it does
    # not know as a client of an older server reads it (the client then reads the output whole)
    api = Api(srv.url, srv.admin_token)
    r = api("GET", f"/v1/jobs/{job.id}/logs", params={"tail": 100_001})
    assert r.status_code == 422 and "tail" in r.text, r.text
    r = api("GET", f"/v1/jobs/{job.id}/logs", params={"tails": 1})
    assert r.status_code == 422 and "query.tails" in r.text and "no such field" in r.text, r.text
    proc = cli("jobs", "logs", job.id, "--tail", "-3", env=env)
    assert proc.returncode == 2 and "'--tail' / '-n': '-3': out of range" in proc.stderr
