"""Pausing a worker (``gpulayer worker pause``, :meth:`ControlPlane.pause_worker`): it takes no
new work, what it was handed and had not started goes back to the queue, what it runs goes on,
and the jobs only it could run wait (they do not fail as unschedulable); resumed, it takes work
again. On SQLite and PostgreSQL (the ``cp`` fixture), through a server (admin only), across a
restart of the worker, and from schema 9."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from gpulayer.control import ControlPlane
from gpulayer.errors import Forbidden, NotFound
from gpulayer.http_client import connect_http
from gpulayer.records import JobState, TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Requirements
from gpulayer.store import Store, marks, migrations
from tests.factories import cuda_caps, gpu_job


def test_a_paused_worker_gets_no_new_work_and_its_jobs_wait_until_it_is_resumed(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(2), cpu_slots=0).id
    running = cp.submit(gpu_job())
    handed = cp.submit(gpu_job())
    first, second = cp.poll_tasks(w)
    cp.start_task(first.task_id, worker_id=w)

    record = cp.pause_worker(w)

    assert record.paused and record.online
    # what it had not started goes back to the queue, at no cost to its job; what it runs goes on
    assert cp.get_job(handed.id).state is JobState.QUEUED
    assert cp.get_job(running.id).state is JobState.RUNNING
    waiting = cp.submit(gpu_job())  # only this worker could run it: it waits, it does not fail
    assert cp.get_job(waiting.id).state is JobState.QUEUED
    decision = cp.get_job(waiting.id).decision
    assert decision is not None and decision.outcome == "waiting"
    assert any(r.code == "paused" and f"gpulayer worker resume {w}" in r.message for r in decision.reasons)
    assert cp.poll_tasks(w) == []
    seen = {x.worker: x for x in cp.explain_job(waiting.id).workers}[w]
    assert seen.status == "busy" and any(r.message.startswith("worker is paused") for r in seen.reasons)
    cp.finish_task(first.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    assert cp.get_job(running.id).state is JobState.SUCCEEDED
    assert cp.poll_tasks(w) == []  # a freed device takes nothing either
    kinds = [e.kind for e in cp.events(handed.id)]
    assert "task_released" in kinds

    assert not cp.pause_worker(w, paused=False).paused
    assert {a.job_id for a in cp.poll_tasks(w)} == {handed.id, waiting.id}
    del second


def test_other_workers_take_the_work_and_a_pause_outlives_a_restart(cp: ControlPlane) -> None:
    paused = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    cp.pause_worker(paused)
    other = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    job = cp.submit(gpu_job())
    assert [a.job_id for a in cp.poll_tasks(other)] == [job.id]
    again = cp.register_worker(cuda_caps(1), worker_id=paused, cpu_slots=0)  # (the worker restarted)
    assert again.paused
    assert [w.paused for w in cp.list_workers() if w.id == paused] == [True]
    with pytest.raises(NotFound):
        cp.pause_worker("wkr-000000000000")


def test_a_job_no_worker_could_ever_run_still_fails_at_once(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    cp.pause_worker(w)
    job = cp.submit(CommandJob(command=["train"], requirements=Requirements(accelerator="cuda", gpus=4)))
    assert cp.get_job(job.id).state is JobState.UNSCHEDULABLE


def test_only_an_admin_pauses_a_worker_through_a_server(tmp_path: Path) -> None:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    w = control.register_worker(cuda_caps(1), cpu_slots=0).id
    with TestClient(create_app(control, background=False)) as tc:
        admin = connect_http("http://testserver", token=control.create_token(scope="admin").token, retry_for=0.5,
                             transport=tc._transport)
        client = connect_http("http://testserver", token=control.create_token(scope="client").token, retry_for=0.5,
                              transport=tc._transport)
        with pytest.raises(Forbidden):
            client.pause_worker(w)
        assert admin.pause_worker(w).paused and control.get_worker(w).paused
        assert [x.paused for x in client.list_workers()] == [True]  # (what a user sees)
        auth = {"authorization": f"Bearer {admin.token}"}  # type: ignore[attr-defined]
        assert [x["paused"] for x in tc.get("/v1/workers", headers=auth).json()] == [True]
        assert not admin.pause_worker(w, paused=False).paused
        # not paused, it is sent as older clients know a worker's record (they refuse a field they do not know)
        assert ["paused" in x for x in tc.get("/v1/workers", headers=auth).json()] == [False]
        assert [x.paused for x in client.list_workers()] == [False]
        with pytest.raises(NotFound):
            admin.pause_worker("wkr-000000000000")
        bad = tc.post(f"/v1/workers/{w}/pause", headers=auth, json={"paused": "yes"})
        assert bad.status_code == 422 and "paused" in bad.text


def test_the_migration_from_schema_9_adds_the_column_and_the_triggers_follow_it(store_url: str) -> None:
    store = Store(store_url)
    sqlite = store.is_sqlite
    w = ControlPlane(store).register_worker(cuda_caps(1), cpu_slots=0).id
    with store.engine.begin() as conn:  # back to schema 9: its triggers, no column
        for statement in marks._sqlite_ddl() if sqlite else marks._postgres_ddl():
            if statement.startswith("CREATE TRIGGER"):
                name = statement.split()[2]
                conn.execute(text(f"DROP TRIGGER {name}" + ("" if sqlite else f" ON {marks._table(statement)}")))
        conn.execute(text("ALTER TABLE gl_workers DROP COLUMN paused"))
        marks.install(conn, paused=False)
        conn.execute(text("UPDATE gl_schema SET version = 9"))
    store.dispose()
    cp = ControlPlane(Store(store_url))
    try:
        assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
        assert not cp.get_worker(w).paused
        cp.schedule_queue()  # (a pass that keeps the fleet: the pause must move the marks)
        cp.pause_worker(w)
        job = cp.submit(gpu_job())
        assert cp.get_job(job.id).state is JobState.QUEUED and cp.poll_tasks(w) == []
    finally:
        cp.store.dispose()


def test_the_cli_says_a_server_without_the_route_is_older(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A server from before pausing has no such path (404, as for an unknown worker): the CLI
    tells the two apart by the worker list, and says the server is older."""
    import types

    import typer

    from gpulayer import api as api_mod
    from gpulayer import client as client_mod
    from gpulayer.cli import worker as worker_cli
    from gpulayer.errors import InvalidInput

    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'old.db'}"), heartbeat_timeout=30)
    w = control.register_worker(cuda_caps(1), cpu_slots=0).id
    monkeypatch.setattr(api_mod, "ROUTES", tuple(r for r in api_mod.ROUTES if r.op != "pause_worker"))
    with TestClient(create_app(control, background=False)) as tc:
        admin = connect_http("http://testserver", token=control.create_token(scope="admin").token, retry_for=0.5,
                             transport=tc._transport)
        monkeypatch.setattr(client_mod, "connect", lambda: types.SimpleNamespace(api=admin))
        with pytest.raises(InvalidInput, match="older than gpulayer worker pause and resume"):
            worker_cli._pause([w], True, False)
        with pytest.raises(typer.Exit) as exited:
            worker_cli._pause(["wkr-000000000000"], True, False)
        assert exited.value.exit_code == 2 and "no such worker" in capsys.readouterr().err
    assert not control.get_worker(w).paused
