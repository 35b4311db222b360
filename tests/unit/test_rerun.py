"""Running ended jobs again (``gpulayer jobs rerun``, :meth:`ControlPlane.rerun_jobs`,
``handle.rerun()``): a new job with the stored spec and arguments; with ``downstream``, the
ended jobs after them too, naming the new jobs. SQLite and PostgreSQL (the ``cp`` fixture),
and a server's client tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidInput
from gpulayer.http_client import connect_http
from gpulayer.records import JobState, TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, FunctionJob
from gpulayer.store import Store
from tests.factories import make_capabilities
from tests.factories import run_handed as run_all


def test_a_rerun_is_a_new_job_with_the_same_spec_and_arguments(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    first = cp.submit(FunctionJob(function="m:f", args=[{"rows": [1, 2]}], kwargs={"k": "v"}, name="step",
                                  retries=2, priority=5))
    run_all(cp, w, TaskState.FAILED)
    run_all(cp, w, TaskState.FAILED)
    run_all(cp, w, TaskState.FAILED)
    assert cp.get_job(first.id).state is JobState.FAILED

    answer = cp.rerun_jobs([first.id])

    new = cp.get_job(answer.rerun[first.id])
    assert new.id != first.id and new.state is JobState.ASSIGNED and new.attempt == 1  # (a fresh retry budget)
    assert new.spec == cp.get_job(first.id).spec  # its function, arguments, name, options
    assert new.spec.kind == "function" and new.spec.args == [{"rows": [1, 2]}] and new.spec.kwargs == {"k": "v"}
    assert cp.get_job(first.id).state is JobState.FAILED  # (left as it was)
    assert ("rerun", f"rerun as {new.id}") in [(e.kind, e.message) for e in cp.events(first.id)]
    assert ("rerun_of", f"rerun of {first.id}") in [(e.kind, e.message) for e in cp.events(new.id)]


def test_jobs_that_have_not_ended_and_unknown_ids_are_left(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    running = cp.submit(CommandJob(command=["sleep", "1"]))
    assert [a.job_id for a in cp.poll_tasks(w)] == [running.id]
    answer = cp.rerun_jobs([running.id, "job-0123456789ab"])
    assert answer.rerun == {} and answer.not_ended == {running.id: JobState.ASSIGNED}
    assert len(cp.list_jobs()) == 1


def test_downstream_runs_the_pipeline_again_after_the_new_jobs(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    prepare = cp.submit(CommandJob(command=["prepare"]))
    train = cp.submit(CommandJob(command=["train"], after=[prepare.id]))
    report = cp.submit(CommandJob(command=["report"], after_ended=[train.id]))
    unrelated = cp.submit(CommandJob(command=["other"]))
    assert run_all(cp, w, TaskState.FAILED) == [prepare.id]
    assert cp.get_job(train.id).state is JobState.FAILED  # (without running)
    assert {*run_all(cp, w), *run_all(cp, w)} == {report.id, unrelated.id}  # (any end of train will do)

    answer = cp.rerun_jobs([prepare.id], downstream=True)

    assert list(answer.rerun) == [prepare.id, train.id, report.id] and unrelated.id not in answer.rerun
    new_prepare, new_train, new_report = (cp.get_job(answer.rerun[j]) for j in (prepare.id, train.id, report.id))
    assert new_train.spec.after == [new_prepare.id] and new_report.spec.after_ended == [new_train.id]
    assert new_train.state is JobState.QUEUED and new_report.state is JobState.QUEUED  # (waiting, in order)
    assert run_all(cp, w) == [new_prepare.id]
    assert run_all(cp, w) == [new_train.id]
    assert run_all(cp, w) == [new_report.id]


def test_downstream_leaves_the_jobs_after_that_have_not_ended(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    first = cp.submit(CommandJob(command=["a"]))
    assert run_all(cp, w) == [first.id]
    busy = cp.submit(CommandJob(command=["b"], after_ended=[first.id]))  # running now
    assert [a.job_id for a in cp.poll_tasks(w)] == [busy.id]
    answer = cp.rerun_jobs([first.id], downstream=True)
    assert list(answer.rerun) == [first.id] and answer.not_ended == {busy.id: JobState.ASSIGNED}


def test_without_downstream_a_rerun_keeps_the_ids_its_spec_names(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    first = cp.submit(CommandJob(command=["a"]))
    later = cp.submit(CommandJob(command=["b"], after=[first.id]))
    run_all(cp, w)
    run_all(cp, w)
    answer = cp.rerun_jobs([later.id])
    again = cp.get_job(answer.rerun[later.id])
    assert again.spec.after == [first.id] and again.state is JobState.ASSIGNED  # (first had succeeded)
    assert list(answer.rerun) == [later.id]


def test_a_client_token_runs_its_own_jobs_again(tmp_path: Path) -> None:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        alice, bob = (connect_http("http://testserver", token=control.create_token(scope="client").token,
                                   retry_for=0.5, transport=tc._transport) for _ in range(2))
        spec = CommandJob(command=["true"], placement={"target": "remote"})  # type: ignore[arg-type]
        theirs, mine = alice.submit(spec), bob.submit(spec)  # (no remote worker: unschedulable, ended)
        answer = bob.rerun_jobs([theirs.id, mine.id])
        assert list(answer.rerun) == [mine.id] and answer.not_ended == {}
        new = bob.get_job(answer.rerun[mine.id])
        assert new.spec == mine.spec and new.state is JobState.UNSCHEDULABLE
        assert [j.id for j in alice.list_jobs()] == [theirs.id]  # (nothing of bob's)
    control.store.dispose()


def test_a_server_from_before_reruns_is_said_to_be_older(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer import api as api_mod
    from gpulayer.client import Client

    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'old.db'}"), heartbeat_timeout=30)
    monkeypatch.setattr(api_mod, "ROUTES", tuple(r for r in api_mod.ROUTES if r.op != "rerun_jobs"))
    with TestClient(create_app(control, background=False)) as tc:
        remote = connect_http("http://testserver", token=control.create_token(scope="admin").token, retry_for=0.5,
                              transport=tc._transport)
        client = Client(remote, location="http://testserver", default_target="remote")
        job = client.api.submit(CommandJob(command=["true"], placement={"target": "remote"}))  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="the control plane at http://testserver does not run jobs again: its "
                                               "server is older than job reruns; upgrade it"):
            client.rerun([job.id])
    control.store.dispose()
