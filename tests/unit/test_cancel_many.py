"""Cancelling many jobs at once: ``ControlPlane.cancel_many`` (one transaction and one
placement pass for a batch; on SQLite and PostgreSQL: the ``cp`` fixture), its route ``POST /v1/jobs/cancel``, ``Client.cancel_jobs``
(batches, and one at a time against a server without the route), ``gl.cancel``, and a
script's cancel of its jobs at exit, which uses it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import gpulayer as gl
from gpulayer import api as api_mod
from gpulayer import client as client_mod
from gpulayer import leaving
from gpulayer.api import MAX_BATCH
from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidArgument, InvalidInput, NotFound
from gpulayer.http_client import connect_http
from gpulayer.records import JobState, TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement, Requirements
from gpulayer.store import Store
from tests.factories import cuda_caps, gpu_job

WAIT = Placement(on_unschedulable="wait")


def passes(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """A list that grows by one at each placement pass of ``cp``."""
    seen: list[None] = []
    real = cp._place

    def counted(s: Any, **kw: Any) -> Any:
        seen.append(None)
        return real(s, **kw)

    monkeypatch.setattr(cp, "_place", counted)
    return seen


def test_a_batch_ends_queued_and_unstarted_jobs_asks_running_ones_and_places_once(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    w = cp.register_worker(cuda_caps(2), cpu_slots=0)
    running, unstarted = cp.submit(gpu_job()), cp.submit(gpu_job())
    queued = [cp.submit(gpu_job(placement=WAIT)) for _ in range(3)]
    tasks = {a.job_id: a.task_id for a in cp.poll_tasks(w.id)}
    assert set(tasks) == {running.id, unstarted.id}
    cp.start_task(tasks[running.id], worker_id=w.id)
    done = cp.submit(CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", gpus=1),
                                placement=WAIT))
    cp.cancel(done.id)  # ended before the batch: left as it is
    counted = passes(cp, monkeypatch)

    asked = [queued[0].id, "job-000000000000", running.id, done.id, unstarted.id, queued[0].id, queued[1].id]
    got = cp.cancel_many(asked, reason="stopped by the test")

    assert len(counted) == 1  # one pass for the batch (one per job made a long queue quadratic)
    # those that exist, each once, in the order given; brief records
    assert [j.id for j in got] == [queued[0].id, running.id, done.id, unstarted.id, queued[1].id]
    assert all(j.tasks == [] for j in got)
    state = {j.id: j.state for j in got}
    assert state[queued[0].id] is JobState.CANCELLED and state[unstarted.id] is JobState.CANCELLED
    assert state[running.id] is JobState.RUNNING  # until its worker has ended it
    assert cp.get_job(queued[0].id).error.message == "stopped by the test (before it started)"  # type: ignore[union-attr]
    assert cp.get_job(done.id).error.message == "cancelled before it started"  # type: ignore[union-attr]
    # the running task's worker hears it; the freed device goes to the job not cancelled
    assert cp.heartbeat(w.id, running=[tasks[running.id]]).cancel == [tasks[running.id]]
    assert [a.job_id for a in cp.poll_tasks(w.id)] == [queued[2].id]
    cp.finish_task(tasks[running.id], worker_id=w.id, state=TaskState.CANCELLED, exit_code=-15)
    assert cp.get_job(running.id).state is JobState.CANCELLED


def test_a_batch_of_ended_or_unknown_jobs_changes_nothing(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    cp.register_worker(cuda_caps(1), cpu_slots=0)
    job = cp.submit(gpu_job(placement=WAIT))
    cp.cancel(job.id)
    counted = passes(cp, monkeypatch)
    assert [j.state for j in cp.cancel_many([job.id, "job-000000000000"])] == [JobState.CANCELLED]
    assert cp.cancel_many(["job-000000000000"]) == []
    assert counted == []  # nothing was cancelled: no pass


def test_an_owner_cancels_only_its_own_jobs(cp: ControlPlane) -> None:
    mine = cp.submit(gpu_job(placement=WAIT), owner="tok-a")
    theirs = cp.submit(gpu_job(placement=WAIT), owner="tok-b")
    assert [j.id for j in cp.cancel_many([theirs.id, mine.id], owner="tok-a")] == [mine.id]
    assert cp.get_job(theirs.id).state is JobState.QUEUED
    assert [j.id for j in cp.cancel_many([theirs.id, mine.id])] == [theirs.id, mine.id]  # (in process: all)


@pytest.mark.parametrize("ids, message", [
    ([], "job_ids: empty; give the id of at least one job"),
    ([f"job-{i:012x}" for i in range(MAX_BATCH + 1)],
     f"job_ids: {MAX_BATCH + 1} jobs, over the limit of {MAX_BATCH} in one cancel; split them"),
])
def test_a_batch_must_name_one_job_and_at_most_the_limit(cp: ControlPlane, ids: list[str], message: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        cp.cancel_many(ids)
    assert str(exc.value) == message


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient]]:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        yield control, tc


def test_the_route_cancels_the_callers_own_jobs_and_leaves_others_out(
        served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    tokens = [control.create_token(scope="client").token for _ in range(2)]
    a, b = (connect_http("http://testserver", token=t, retry_for=0.5, transport=tc._transport) for t in tokens)
    spec = gpu_job(placement=Placement(target="remote", on_unschedulable="wait"))
    mine, theirs = a.submit(spec), b.submit(spec)
    assert a.cancel_many([theirs.id, mine.id, "job-000000000000"])[0].id == mine.id
    assert len(a.cancel_many([theirs.id, mine.id])) == 1
    assert control.get_job(mine.id).state is JobState.CANCELLED
    assert control.get_job(theirs.id).state is JobState.QUEUED  # another token's: not seen, not touched
    auth = {"authorization": f"Bearer {tokens[0]}"}
    for body in ({"job_ids": []}, {"job_ids": "job-x"}, {}):
        bad = tc.post("/v1/jobs/cancel", headers=auth, json=body)
        assert bad.status_code in (400, 422) and "job_ids" in bad.text, (body, bad.text)
    assert control.get_job(theirs.id).state is JobState.QUEUED


def test_a_client_cancels_in_batches(gpulayer_isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    client = client_mod.connect()
    spec = gpu_job(placement=Placement(target="remote", on_unschedulable="wait"))
    ids = [j.id for j in client.submit_many([spec] * (MAX_BATCH + 2))]
    batches: list[int] = []
    real = client.api.cancel_many
    monkeypatch.setattr(client.api, "cancel_many", lambda job_ids: batches.append(len(job_ids)) or real(job_ids))
    got = client.cancel_jobs([*ids, "job-000000000000", ids[0]])
    assert batches == [MAX_BATCH, 3]  # each id once
    assert list(got) == [*ids, "job-000000000000"]
    assert {r.state for i, r in got.items() if i != "job-000000000000"} == {JobState.CANCELLED}  # type: ignore[union-attr]
    assert isinstance(got["job-000000000000"], NotFound) and "no such job" in str(got["job-000000000000"])


def test_a_client_of_a_server_without_the_route_cancels_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server from before ``POST /v1/jobs/cancel`` (built here without that route) has the
    path as ``GET /v1/jobs/{job_id}``: it answers 405, and the client cancels one job at a
    time from then on."""
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'old.db'}"), heartbeat_timeout=30)
    monkeypatch.setattr(api_mod, "ROUTES", tuple(r for r in api_mod.ROUTES if r.op != "cancel_many"))
    with TestClient(create_app(control, background=False)) as tc:
        token = control.create_token(scope="client").token
        refused = tc.post("/v1/jobs/cancel", headers={"authorization": f"Bearer {token}"}, json={"job_ids": ["x"]})
        assert refused.status_code == 405 and refused.json()["error"]["code"] == "method_not_allowed"
        client = Client(connect_http("http://testserver", token=token, retry_for=0.5, transport=tc._transport),
                        location="http://testserver", default_target="remote")
        asked: list[str] = []
        real = client.api.cancel
        monkeypatch.setattr(client.api, "cancel", lambda job_id: asked.append(job_id) or real(job_id))
        spec = gpu_job(placement=Placement(target="remote", on_unschedulable="wait"))
        jobs = [client.api.submit(spec).id for _ in range(3)]
        got = client.cancel_jobs([jobs[0], "job-000000000000", jobs[1]])
        assert [getattr(r, "state", None) for r in got.values()] == [JobState.CANCELLED, None, JobState.CANCELLED]
        assert isinstance(got["job-000000000000"], NotFound)
        assert asked == [jobs[0], "job-000000000000", jobs[1]]
        client.cancel_jobs([jobs[2]])  # (asked one at a time at once: the batch route is not tried again)
        assert asked[-1] == jobs[2] and control.get_job(jobs[2]).state is JobState.CANCELLED


def test_a_script_cancels_its_batches_with_one_pass_after_the_last(
        gpulayer_isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a script's Ctrl-C at exit does: one transaction a batch, and one placement pass
    (a pass between two batches would start the next batch's jobs, to end them at once)."""
    client = client_mod.connect()
    assert client.control is not None
    spec = gpu_job(placement=Placement(target="remote", on_unschedulable="wait"))
    jobs = client.submit_many([spec] * (MAX_BATCH + 5))
    counted = passes(client.control, monkeypatch)
    leaving.cancel_all(client, [j.id for j in jobs], "the test stopped it")
    assert len(counted) == 1
    assert {j.state for j in client.control.records_of([j.id for j in jobs[-10:]], brief=True)} == {JobState.CANCELLED}


def test_one_string_is_not_taken_for_its_characters(cp: ControlPlane) -> None:
    with pytest.raises(InvalidInput, match="job_ids: 'job-abc' is one string; accepted: a list of job ids"):
        cp.cancel_many("job-abc")
    with pytest.raises(InvalidInput, match="job_ids: 'job-abc' is one string"):
        cp.wait_jobs("job-abc", timeout=0)


def test_gl_cancel_cancels_handles_together_and_refuses_what_is_not_one(gpulayer_isolated: None) -> None:
    spec = gpu_job(placement=Placement(target="remote", on_unschedulable="wait"))
    handles = gl.submit_many([spec] * 3)
    records = gl.cancel([handles[2], handles[0], handles[2]])
    assert [r.id for r in records] == [handles[2].id, handles[0].id, handles[2].id]
    assert {r.state for r in records} == {JobState.CANCELLED}
    assert handles[1].status() == "queued"
    assert gl.cancel([]) == []
    for call, name in ((gl.cancel, "gl.cancel"), (gl.wait, "gl.wait"),
                       (lambda hs: list(gl.as_completed(hs)), "gl.as_completed")):
        with pytest.raises(InvalidArgument) as exc:
            call([handles[1], handles[1].id])
        assert str(exc.value).startswith(f"{name}: {handles[1].id!r} is not a job handle; accepted: the handles "
                                         "that .remote(), gl.submit and gl.submit_many return")
        with pytest.raises(InvalidArgument) as exc:
            call(handles[1])  # one handle, not a list of them
        assert str(exc.value) == (f"{name}: JobHandle({handles[1].id!r}) is one handle; accepted: a list of the "
                                  "handles that .remote(), gl.submit and gl.submit_many return")
    gl.cancel([handles[1]])
