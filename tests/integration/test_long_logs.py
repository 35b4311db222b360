"""A job's whole output, however many chunks it was shipped in: ``gpulayer jobs logs`` and
``handle.logs()`` read every page of the ``logs`` API (at most ``MAX_LOG_CHUNKS`` chunks a
request), embedded and through a server. (Before, both read the first page only: a job that
wrote a line every 0.1 s lost what it wrote after 17 minutes.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from gpulayer.api import MAX_LOG_CHUNKS
from gpulayer.client import http_client
from gpulayer.control import ControlPlane
from gpulayer.records import TaskState
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store
from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc
from tests.support import cli

pytestmark = pytest.mark.timeout(300)

#: one page and a bit more, in both streams, the last chunk on stderr
CHUNKS: list[tuple[Any, str]] = [("stdout", f"line {i}\n") for i in range(MAX_LOG_CHUNKS + 2)] + [("stderr", "done\n")]
STDOUT = "".join(text for stream, text in CHUNKS if stream == "stdout")


def test_jobs_logs_and_handle_logs_read_every_page_embedded(home: Path) -> None:
    cp = ControlPlane(Store())
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["true"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    cp.append_logs(a.task_id, worker_id=w.id, chunks=CHUNKS)
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0)
    assert len(cp.logs(job.id)) == MAX_LOG_CHUNKS  # one request's page: the rest is read after it

    assert gl.get_job(job.id).logs() == "".join(text for _, text in CHUNKS)
    proc = cli("jobs", "logs", job.id, check=True)
    assert proc.stdout == STDOUT and proc.stderr == "done\n"
    assert cli("jobs", "logs", job.id, "--node", "0", check=True).stdout == STDOUT


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path_factory.mktemp("logs-server"))
    srv.start()
    yield srv
    srv.stop()


def test_jobs_logs_and_handle_logs_read_every_page_through_a_server(server: ServerProc, tmp_path: Path) -> None:
    admin = Api(server.url, server.admin_token)
    r = Api(server.url, admin.token_for("join")["token"])(
        "POST", "/v1/workers/join", json={"capabilities": make_capabilities().model_dump(mode="json"), "cpu_slots": 1})
    assert r.status_code == 201, r.text
    worker = Api(server.url, r.json()["token"])
    worker_id = r.json()["worker_id"]
    client = http_client(server.url, token=server.admin_token)
    job = client.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [task_id] = [t["task_id"] for t in worker("GET", f"/v1/workers/{worker_id}/tasks", params={"wait": 10}).json()]
    assert worker("POST", f"/v1/tasks/{task_id}/start").status_code == 204
    r = worker("POST", f"/v1/tasks/{task_id}/logs", json={"chunks": [list(c) for c in CHUNKS]})
    assert r.status_code == 204, r.text
    r = worker("POST", f"/v1/tasks/{task_id}/finish", json={"state": "succeeded", "exit_code": 0})
    assert r.status_code == 200, r.text

    assert len(client.api.logs(job.id)) == MAX_LOG_CHUNKS
    assert gl.JobHandle(job.id, client).logs() == "".join(text for _, text in CHUNKS)
    proc = cli("jobs", "logs", job.id, env={"GPULAYER_URL": server.url, "GPULAYER_TOKEN": server.admin_token,
                                            "GPULAYER_HOME": str(tmp_path)}, check=True)
    assert proc.stdout == STDOUT and proc.stderr == "done\n"
