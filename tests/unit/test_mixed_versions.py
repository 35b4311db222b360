"""Clients, workers and servers of different versions together (docs/server.md, "Upgrading")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpulayer.control import ControlPlane
from gpulayer.http_client import connect_http
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store
from tests.factories import make_capabilities

#: a task's record as the clients before the lenient read of records knew it: they refuse
#: an answer with any other field (pydantic's extra_forbidden), and before schema 9 every
#: answer with a task in it said ``"lent": false``
TASK_FIELDS_BEFORE_LENDING = {"accelerator", "attempt", "created_at", "devices", "ended_at", "error", "exit_code",
                              "id", "job_id", "node_rank", "rendezvous", "started_at", "state", "worker_id"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient]]:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        yield control, tc
    control.store.dispose()


def test_a_task_that_lends_nothing_is_sent_as_older_clients_read_it(served: tuple[ControlPlane, TestClient]) -> None:
    """An older client's submit, jobs show and wait read a newer server's job: a task's
    record says ``lent`` only while its slot is lent (a client of schema 8 failed every
    submit with a traceback: ``tasks.0.lent: Extra inputs are not permitted``)."""
    control, tc = served
    admin = connect_http("http://testserver", token=control.create_token(scope="admin").token, retry_for=0.5,
                         transport=tc._transport)
    client = connect_http("http://testserver", token=admin.create_token(scope="client").token, retry_for=0.5,
                          transport=tc._transport)
    worker = connect_http("http://testserver", retry_for=0.5, transport=tc._transport)
    reply = worker.join_worker(make_capabilities(), join_token=admin.create_token(scope="join", uses=1).token,
                               name="w", cpu_slots=1, pid=1)
    worker.token = reply.token
    job = client.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [task] = worker.poll_tasks(reply.worker_id, wait=0)
    worker.start_task(task.task_id, worker_id=reply.worker_id)
    headers = {"Authorization": f"Bearer {client.token}"}

    def sent() -> dict[str, object]:
        [record] = tc.get(f"/v1/jobs/{job.id}", headers=headers).json()["tasks"]
        return dict(record)

    assert set(sent()) <= TASK_FIELDS_BEFORE_LENDING
    assert client.get_job(job.id).tasks[0].lent is False  # (absent reads as not lent)
    assert client.lend_slot(job.id, task_id=task.task_id, lent=True).lent is True
    assert sent()["lent"] is True and client.get_job(job.id).tasks[0].lent is True
    assert client.lend_slot(job.id, task_id=task.task_id, lent=False).lent is False
    assert set(sent()) <= TASK_FIELDS_BEFORE_LENDING
