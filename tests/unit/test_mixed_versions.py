"""Clients, workers and servers of different versions together (docs/server.md, "Upgrading")."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlmodel import select
from starlette.testclient import TestClient

from gpulayer import api
from gpulayer.control import ControlPlane
from gpulayer.http_client import connect_http
from gpulayer.records import JobState, TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement
from gpulayer.store.tables import ArtifactsRow
from gpulayer.worker.artifacts import keep as keep_artifacts
from gpulayer.worker.logbuffer import LogBuffer, task_sender
from tests.bundle_attacks import make_zip
from tests.factories import make_capabilities

#: a task's record as the clients before the lenient read of records knew it: they refuse
#: an answer with any other field (pydantic's extra_forbidden), and before schema 9 every
#: answer with a task in it said ``"lent": false``
TASK_FIELDS_BEFORE_LENDING = {"accelerator", "attempt", "created_at", "devices", "ended_at", "error", "exit_code",
                              "id", "job_id", "node_rank", "rendezvous", "started_at", "state", "worker_id"}


def _running_over_http(tc: TestClient, join_token: str, submit: Callable[[], Any]) -> tuple[Any, Any, Any, Any]:
    """A worker joined through ``tc``'s server with ``join_token``, then a job (``submit()``),
    whose task the worker took and started: (its HTTP client, its join reply, the job, the task)."""
    worker = connect_http("http://testserver", retry_for=0.5, transport=tc._transport)
    reply = worker.join_worker(make_capabilities(), join_token=join_token, name="w", cpu_slots=1, pid=1)
    worker.token = reply.token
    job = submit()
    [task] = worker.poll_tasks(reply.worker_id, wait=0)
    worker.start_task(task.task_id, worker_id=reply.worker_id)
    return worker, reply, job, task


def test_a_task_that_lends_nothing_is_sent_as_older_clients_read_it(served: tuple[ControlPlane, TestClient]) -> None:
    """An older client's submit, jobs show and wait read a newer server's job: a task's
    record says ``lent`` only while its slot is lent (a client of schema 8 failed every
    submit with a traceback: ``tasks.0.lent: Extra inputs are not permitted``)."""
    control, tc = served
    admin = connect_http("http://testserver", token=control.create_token(scope="admin").token, retry_for=0.5,
                         transport=tc._transport)
    client = connect_http("http://testserver", token=admin.create_token(scope="client").token, retry_for=0.5,
                          transport=tc._transport)
    _, _, job, task = _running_over_http(tc, admin.create_token(scope="join", uses=1).token, lambda: client.submit(
        CommandJob(command=["true"], placement=Placement(target="remote"))))
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


def test_a_job_that_runs_after_others_is_handed_to_its_worker_without_those_fields(cp: ControlPlane) -> None:
    """The control plane placed it once what it runs after had ended: a worker has nothing to
    do with ``after`` and ``after_ended``, and one from before schema 11 refuses a spec with
    them (a real server's answers: tests/integration/test_older_workers.py). Here, in process."""
    w = cp.register_worker(make_capabilities(), cpu_slots=2).id
    first = cp.submit(CommandJob(command=["true"]))
    later = cp.submit(CommandJob(command=["true"], after=[first.id]))
    cleanup = cp.submit(CommandJob(command=["true"], after_ended=[first.id]))
    [a] = cp.poll_tasks(w)
    cp.start_task(a.task_id, worker_id=w)
    assert cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0) == []  # (placed after)
    handed = {t.job_id: t for t in cp.poll_work(w).tasks}
    assert set(handed) == {later.id, cleanup.id}
    for t in handed.values():
        assert t.spec.after == [] and t.spec.after_ended == []
        assert not {"after", "after_ended"} & set(t.model_dump(mode="json")["spec"])
    assert cp.get_job(later.id).spec.after == [first.id]  # (the control plane keeps them)


def test_a_worker_whose_server_is_older_than_artifacts_says_so_and_reports(
        served: tuple[ControlPlane, TestClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server of schema 12 has no artifacts route (404, ``no such route``): the task's output
    says its artifacts were not kept because the server is older, in the words a reader of
    them is told (not the route's digest), and the task's report is stored as ever."""
    control = served[0]
    monkeypatch.setattr(api, "ROUTES", tuple(r for r in api.ROUTES if r.op != "put_artifacts"))
    with TestClient(create_app(control, background=False)) as older:
        worker, reply, job, a = _running_over_http(older, control.create_token(scope="join", uses=1).token,
                                                   lambda: control.submit(CommandJob(command=["true"],
                                                                                     placement=Placement(target="remote"))))
        (tmp_path / "left").mkdir()
        (tmp_path / "left" / "loss.txt").write_text("0.1\n")
        logbuf = LogBuffer(task_sender(worker, a.task_id, reply.worker_id))
        keep_artifacts(worker, a, reply.worker_id, tmp_path / "left", logbuf)
        logbuf.close()
        worker.finish_task(a.task_id, worker_id=reply.worker_id, state=TaskState.SUCCEEDED, exit_code=0)
    assert [(c.stream, c.data) for c in control.logs(job.id)] == [
        ("stderr", "gpulayer: artifacts not kept (1 file(s), 4 B): the control plane at http://testserver keeps no "
                   "artifacts: its server is older than artifacts; upgrade it\n")]
    assert control.get_job(job.id).state is JobState.SUCCEEDED


def test_artifacts_an_older_process_left_when_it_deleted_their_job_go_with_an_admins_prune(cp: ControlPlane) -> None:
    """A GPUlayer of schema 12 left running on a database a newer one migrated (an embedded
    worker whose heartbeats run GPULAYER_KEEP_JOBS' prune) deletes jobs as it knows them,
    without the artifacts, whose table it does not know: a prune of the newer version deletes
    those whose job is gone, and no other."""
    w = cp.register_worker(make_capabilities(), cpu_slots=2).id
    kept_job, gone_job = (cp.submit(CommandJob(command=["true"])).id for _ in range(2))
    tasks = {a.job_id: a.task_id for a in cp.poll_tasks(w)}
    for job_id, task_id in tasks.items():
        cp.start_task(task_id, worker_id=w)
        data = make_zip([(f"{job_id}.txt", b"left", 0o100644)])
        cp.put_artifacts(task_id, hashlib.sha256(data).hexdigest(), data, worker_id=w)
        cp.finish_task(task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    with cp.store.write() as s:  # (what the delete of schema 12, gpulayer.store.retention.delete_jobs, ran)
        for table in ("gl_logs", "gl_events", "gl_tasks"):
            s.execute(text(f"DELETE FROM {table} WHERE job_id = :j"), {"j": gone_job})
        s.execute(text("DELETE FROM gl_jobs WHERE id = :j"), {"j": gone_job})
    cp.prune_jobs(older_than=3600)  # (deletes no job: they ended a moment ago)
    with cp.store.read() as s:
        assert sorted((r.job_id, r.task_id) for r in s.exec(select(ArtifactsRow))) == [(kept_job, tasks[kept_job])]
    assert [t.task_id for t in cp.list_artifacts(kept_job)] == [tasks[kept_job]]
