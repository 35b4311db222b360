"""A task's output uploaded again (its answer lost) is stored once: each upload says where in
the task's output it begins, and the control plane keeps how far it stored (schema 12)."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from gpulayer import api
from gpulayer.control import ControlPlane
from gpulayer.errors import ConnectionFailed, InvalidInput
from gpulayer.http_client import RemoteAPI, connect_http
from gpulayer.records import TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, migrations
from gpulayer.wire import Wire
from gpulayer.worker.logbuffer import LogBuffer, task_sender
from tests.factories import make_capabilities, running_task


def stored(cp: ControlPlane, job_id: str) -> list[tuple[str, str]]:
    return [(c.stream, c.data) for c in cp.logs(job_id)]


def test_an_upload_sent_again_is_stored_once(cp: ControlPlane) -> None:
    job_id, task_id, w = running_task(cp)
    cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "one\n"), ("stderr", "two\n")], offset=0)
    cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "one\n"), ("stderr", "two\n")], offset=0)  # its answer was lost
    assert stored(cp, job_id) == [("stdout", "one\n"), ("stderr", "two\n")]
    # sent again with what came since (the worker kept it and added the rest): the new part alone
    cp.append_logs(task_id, worker_id=w, chunks=[("stderr", "two\n"), ("stdout", "three\n")], offset=4)
    assert stored(cp, job_id) == [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")]
    # cut inside a chunk: the part of it not stored yet
    cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "three\nfour\n")], offset=8)
    assert stored(cp, job_id)[-1] == ("stdout", "four\n")
    # past what is stored (output its worker gave up on): stored whole
    cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "six\n")], offset=100)
    cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "six\n")], offset=100)
    assert [d for _, d in stored(cp, job_id)][-2:] == ["four\n", "six\n"]
    # a worker from before offsets: stored as it comes, as before
    cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "old\n")])
    cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "old\n")])
    assert [d for _, d in stored(cp, job_id)][-2:] == ["old\n", "old\n"]
    with pytest.raises(InvalidInput, match="offset -1: expected a count of characters, 0 or more"):
        cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "x")], offset=-1)


def test_an_embedded_worker_ships_its_output_with_offsets(cp: ControlPlane) -> None:
    """The worker's sender against the control plane in its own process (not hashable: the
    memory of servers that refused offsets is kept by identity)."""
    job_id, task_id, w = running_task(cp)
    buf = LogBuffer(task_sender(cp, task_id, w), interval=3600.0)
    buf.write("stdout", b"one\n")
    buf.flush()
    buf.write("stderr", b"two\n")
    buf.close()
    assert stored(cp, job_id) == [("stdout", "one\n"), ("stderr", "two\n")]
    cp.append_logs(task_id, worker_id=w, chunks=[("stderr", "two\n")], offset=4)  # (they were numbered)
    assert len(stored(cp, job_id)) == 2


def test_the_migration_from_schema_11(store_url: str) -> None:
    store = Store(store_url)
    cp = ControlPlane(store)
    job_id, task_id, w = running_task(cp)
    with store.engine.begin() as conn:  # back to schema 11: no column
        conn.execute(text("ALTER TABLE gl_tasks DROP COLUMN log_chars"))
        conn.execute(text("UPDATE gl_schema SET version = 11"))
    store.dispose()
    cp = ControlPlane(Store(store_url))
    try:
        assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
        # a task stored before counts 0 characters stored: its output is taken from there
        cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "a\n")], offset=0)
        cp.append_logs(task_id, worker_id=w, chunks=[("stdout", "a\n")], offset=0)
        assert stored(cp, job_id) == [("stdout", "a\n")]
    finally:
        cp.store.dispose()


def remote_task(control: ControlPlane, tc: TestClient) -> tuple[RemoteAPI, str, str, str]:
    """A worker over HTTP that runs a job's task: (its API, job id, task id, worker id)."""
    worker = connect_http("http://testserver", retry_for=0.5, transport=tc._transport)
    join = control.create_token(scope="join", uses=1)
    reply = worker.join_worker(make_capabilities(), join_token=join.token, name="w", cpu_slots=1, pid=1)
    worker.token = reply.token  # type: ignore[attr-defined]
    job = control.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [a] = worker.poll_tasks(reply.worker_id, wait=0)
    worker.start_task(a.task_id, worker_id=reply.worker_id)
    return worker, job.id, a.task_id, reply.worker_id


def test_an_upload_sent_again_over_http_is_stored_once(served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    worker, job_id, task_id, w = remote_task(control, tc)
    for _ in range(2):
        worker.append_logs(task_id, worker_id=w, chunks=[("stdout", "one\n")], offset=0)
    worker.append_logs(task_id, worker_id=w, chunks=[("stdout", "one\ntwo\n")], offset=0)
    assert stored(control, job_id) == [("stdout", "one\n"), ("stdout", "two\n")]
    with pytest.raises(InvalidInput, match="offset"):
        worker.append_logs(task_id, worker_id=w, chunks=[("stdout", "x")], offset=-1)


def test_a_worker_ships_to_a_server_from_before_offsets_without_them(
        served: tuple[ControlPlane, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """An older server refuses the field it does not know ("body.offset=0: no such field"): the
    output is stored all the same, sent as before, and later uploads leave the field out."""
    class OldLogsBody(Wire):  # (what a server of schema 11 reads)
        chunks: list[tuple[api.LogStream, str]]

    control = served[0]
    old = tuple(dataclasses.replace(r, body=OldLogsBody) if r.op == "append_logs" else r for r in api.ROUTES)
    monkeypatch.setattr(api, "ROUTES", old)
    with TestClient(create_app(control, background=False)) as older:
        worker, job_id, task_id, w = remote_task(control, older)
        with pytest.raises(InvalidInput, match=r"body\.offset=0: no such field; accepted: chunks"):
            worker.append_logs(task_id, worker_id=w, chunks=[("stdout", "x")], offset=0)
        sent: list[str] = []
        real = worker.append_logs

        def append_logs(*args: object, **kw: object) -> None:
            sent.append("offset" if "offset" in kw else "none")
            real(*args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(worker, "append_logs", append_logs)
        send = task_sender(worker, task_id, w)
        send([("stdout", "one\n")], 0)
        send([("stdout", "two\n")], 4)
        assert stored(control, job_id) == [("stdout", "one\n"), ("stdout", "two\n")]
        assert sent == ["offset", "none", "none"]  # refused once, then never sent again


def test_a_shipment_kept_after_a_failure_is_sent_again_from_where_it_began() -> None:
    """What a failed shipment held goes again, with what came since, at the offset it had;
    the shipments after it go on from its end."""
    calls: list[tuple[int, str]] = []
    fail = iter([False, True, False, False])

    def send(chunks: list[tuple[api.LogStream, str]], offset: int) -> None:
        calls.append((offset, "".join(t for _, t in chunks)))
        if next(fail, False):
            raise ConnectionFailed("the server died before it answered")

    buf = LogBuffer(send, interval=3600.0)  # (no time-based shipping in this test)
    buf.write("stdout", b"one\n")
    buf.flush()
    buf.write("stderr", b"two\n")
    buf.flush()  # fails: kept
    buf.write("stderr", b"three\n")
    buf.flush()
    buf.add("system", "done\n")
    buf.close()
    assert calls == [(0, "one\n"), (4, "two\n"), (4, "two\nthree\n"), (14, "done\n")]


def test_a_task_s_output_through_a_server_that_stored_it_and_lost_its_answer_is_stored_once(
        served: tuple[ControlPlane, TestClient]) -> None:
    """The worker's log buffer against the HTTP route: the first sending of a shipment is
    stored, its answer lost; the buffer sends it again with what came since."""
    control, tc = served
    worker, job_id, task_id, w = remote_task(control, tc)
    send = task_sender(worker, task_id, w)
    lost = [True]

    def stored_then_lost(chunks: list[tuple[api.LogStream, str]], offset: int) -> None:
        send(chunks, offset)
        if lost and chunks[0][1].startswith("line 2"):
            lost.clear()
            raise ConnectionFailed("the server was killed before it answered")

    buf = LogBuffer(stored_then_lost, interval=3600.0)
    for i in range(1, 6):
        buf.write("stdout", f"line {i}\n".encode())
        buf.flush()
    buf.close()
    worker.finish_task(task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    assert "".join(d for _, d in stored(control, job_id)) == "".join(f"line {i}\n" for i in range(1, 6))
