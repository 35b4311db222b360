"""Jobs that run after others (``spec.after``, ``gpulayer submit --after``,
``f.options(after=...)``): placed once each has succeeded, failed without running (down the
chain) when one ends otherwise, on SQLite and PostgreSQL (the ``cp`` fixture), through a
server's client tokens, and from schema 10."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidInput, UnknownAfter
from gpulayer.http_client import connect_http
from gpulayer.records import JobState, TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Requirements
from gpulayer.store import Store, migrations
from tests.factories import Clock, cuda_caps, gpu_job, make_capabilities
from tests.factories import run_handed as run


def job(*after: str, **fields: object) -> CommandJob:
    return CommandJob(command=["true"], after=list(after), **fields)  # type: ignore[arg-type]


def pairs(cp: ControlPlane) -> list[tuple[str, str]]:
    with cp.store.read() as s:
        return sorted((a, j) for a, j in s.connection().execute(text("SELECT after_id, job_id FROM gl_job_after")))



def test_a_job_is_placed_once_every_job_it_runs_after_has_succeeded(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=2).id
    first, second = cp.submit(job()), cp.submit(job())
    later = cp.submit(job(first.id, second.id))

    assert later.state is JobState.QUEUED and later.spec.after == [first.id, second.id]
    assert later.decision is not None and later.decision.outcome == "waiting"
    assert later.decision.summary == f"waiting for {first.id} and {second.id} to succeed first (it runs after them)"
    handed = cp.poll_tasks(w)
    assert {a.job_id for a in handed} == {first.id, second.id}  # (two free slots: it took none)
    for a in handed:
        cp.start_task(a.task_id, worker_id=w)
    cp.finish_task(next(a.task_id for a in handed if a.job_id == first.id), worker_id=w,
                   state=TaskState.SUCCEEDED, exit_code=0)
    waiting = cp.get_job(later.id)
    assert waiting.state is JobState.QUEUED and cp.poll_tasks(w) == []  # (a slot is free: it waits still)
    assert waiting.decision is not None and waiting.decision.summary.startswith(f"waiting for {second.id} to succeed")
    assert cp.explain_job(later.id).queue_position is None  # (not in the queue placement reads)

    cp.finish_task(next(a.task_id for a in handed if a.job_id == second.id), worker_id=w,
                   state=TaskState.SUCCEEDED, exit_code=0)
    # placed in the transaction of the end that released it
    assert cp.get_job(later.id).state is JobState.ASSIGNED
    assert [a.job_id for a in cp.poll_tasks(w)] == [later.id]
    assert "released" in [e.kind for e in cp.events(later.id)]
    assert pairs(cp) == []


def test_a_job_that_ends_otherwise_fails_the_chain_after_it_without_running_it(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=4).id
    first = cp.submit(job())
    second = cp.submit(job(first.id))
    third = cp.submit(job(second.id, first.id))
    other = cp.submit(job())

    assert sorted(run(cp, w, TaskState.FAILED)) == sorted([first.id, other.id])

    for ended, why in ((second, f"not run: {first.id}, which it runs after, failed"),
                       (third, f"not run: {first.id}, which it runs after, failed")):
        record = cp.get_job(ended.id)
        assert record.state is JobState.FAILED and not record.tasks and record.decision is None
        assert record.error is not None and record.error.type == "dependency"
        assert record.error.message.startswith(why)
    assert "dependency_failed" in [e.kind for e in cp.events(third.id)]
    assert cp.poll_tasks(w) == [] and pairs(cp) == []


def test_a_chain_fails_link_by_link_with_each_link_named(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    first = cp.submit(job())
    second = cp.submit(job(first.id))
    third = cp.submit(job(second.id))
    run(cp, w, TaskState.FAILED)
    error = cp.get_job(third.id).error
    assert error is not None
    assert error.message == f"not run: {second.id}, which it runs after, did not run either (gpulayer jobs show {second.id})"


def test_a_cancel_of_either_end(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    busy = cp.submit(job())  # (holds the only slot)
    first = cp.submit(job())
    second = cp.submit(job(first.id))
    third = cp.submit(job(busy.id))

    cp.cancel(first.id)  # (it was queued)
    record = cp.get_job(second.id)
    assert record.state is JobState.FAILED and record.error is not None
    assert record.error.message.startswith(f"not run: {first.id}, which it runs after, was cancelled")

    cp.cancel(third.id)  # a job cancelled while it waits: its pairs go with it
    assert cp.get_job(third.id).state is JobState.CANCELLED and pairs(cp) == []
    assert run(cp, w) == [busy.id]
    assert cp.get_job(third.id).state is JobState.CANCELLED


def test_jobs_named_that_ended_already(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    done = cp.submit(job())
    failed = cp.submit(job())
    run(cp, w)
    run(cp, w, TaskState.FAILED)

    assert cp.submit(job(done.id)).state is JobState.ASSIGNED  # a success counts as done
    at_once = cp.submit(job(done.id, failed.id))
    assert at_once.state is JobState.FAILED and at_once.error is not None
    assert at_once.error.message.startswith(f"not run: {failed.id}, which it runs after, failed")
    assert pairs(cp) == []


def test_an_unknown_job_is_refused_and_nothing_is_stored(cp: ControlPlane) -> None:
    known = cp.submit(job())
    before = len(cp.list_jobs())
    with pytest.raises(UnknownAfter, match=r"after\[1\]='job-0123456789ab': no such job; accepted") as e:
        cp.submit(job(known.id, "job-0123456789ab"))
    assert (e.value.index, e.value.job) == (1, "job-0123456789ab")
    with pytest.raises(UnknownAfter, match=r"specs\[1\]: after\[0\]"):
        cp.submit_many([job(), job("job-0123456789ab")])
    assert len(cp.list_jobs()) == before and pairs(cp) == []


@pytest.mark.parametrize(("after", "message"), [
    (["train"], r"CommandJob\(after\[0\]='train'\): not a job id; accepted: a job's id"),
    (["job-1", "job-1"], r"'job-1' is listed twice; accepted: each job once"),
    ([f"job-{i:x}" for i in range(101)], r"after=.*at most 100"),
    ([3], r"after\[0\]=3\): not text"),
])
def test_bad_lists_are_refused_naming_the_entry(after: list[object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        CommandJob(command=["true"], after=after)  # type: ignore[arg-type]


def test_a_job_it_runs_after_that_becomes_unschedulable(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    busy = cp.submit(gpu_job())
    queued = cp.submit(gpu_job())  # waits for the busy worker
    later = cp.submit(job(queued.id, requirements=Requirements(accelerator="cuda")))
    cp.deregister_worker(w)  # the only worker that could run it leaves: it fails as unschedulable
    assert cp.get_job(queued.id).state is JobState.UNSCHEDULABLE
    record = cp.get_job(later.id)
    assert record.state is JobState.FAILED and record.error is not None
    assert record.error.message.startswith(f"not run: {queued.id}, which it runs after, was unschedulable")
    del busy


def test_a_client_token_names_its_own_jobs_only(tmp_path: Path) -> None:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        alice, bob = (connect_http("http://testserver", token=control.create_token(scope="client").token,
                                   retry_for=0.5, transport=tc._transport) for _ in range(2))
        theirs = alice.submit(job(placement={"target": "remote", "on_unschedulable": "wait"}))  # type: ignore[arg-type]
        mine = bob.submit(job(placement={"target": "remote", "on_unschedulable": "wait"}))  # type: ignore[arg-type]
        with pytest.raises(UnknownAfter, match="no such job of yours") as e:
            bob.submit(job(mine.id, theirs.id, placement={"target": "remote", "on_unschedulable": "wait"}))  # type: ignore[arg-type]
        assert (e.value.index, e.value.job) == (1, theirs.id)
        later = bob.submit(job(mine.id, placement={"target": "remote", "on_unschedulable": "wait"}))  # type: ignore[arg-type]
        assert later.spec.after == [mine.id] and later.state is JobState.QUEUED
        # a job without it is sent as older clients know a spec (they refuse a field they do not know)
        auth = {"authorization": f"Bearer {bob.token}"}  # type: ignore[attr-defined]
        assert "after" not in tc.get(f"/v1/jobs/{mine.id}", headers=auth).json()["spec"]
        assert tc.get(f"/v1/jobs/{later.id}", headers=auth).json()["spec"]["after"] == [mine.id]
    control.store.dispose()


def test_the_migration_from_schema_10(store_url: str) -> None:
    store = Store(store_url)
    cp = ControlPlane(store)
    old = cp.submit(job(placement={"on_unschedulable": "wait"}))  # type: ignore[arg-type]
    with store.engine.begin() as conn:  # back to schema 10: no table, no column
        conn.execute(text("DROP TABLE gl_job_after"))
        conn.execute(text("ALTER TABLE gl_jobs DROP COLUMN waiting_for"))
        conn.execute(text("UPDATE gl_schema SET version = 10"))
    store.dispose()
    cp = ControlPlane(Store(store_url))
    try:
        assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
        w = cp.register_worker(make_capabilities(), cpu_slots=1).id
        later = cp.submit(job(old.id))
        assert [a.job_id for a in cp.poll_tasks(w)] == [old.id]
        assert cp.get_job(later.id).state is JobState.QUEUED
    finally:
        cp.store.dispose()


def test_a_placement_pass_that_fails_and_is_undone_ends_nothing_it_had_ended(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    # a pass after a submit or a report runs in a savepoint: when it fails, what it wrote is
    # undone (a job it found unschedulable stays queued), and so must be what it said it ended:
    # the jobs that run after that job keep waiting, and are not failed for a job still queued
    gpu = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    cp.register_worker(make_capabilities(), cpu_slots=1)
    cp.submit(gpu_job())  # (holds the only device)
    queued = cp.submit(gpu_job())  # waits for it
    later = cp.submit(job(queued.id))
    real = cp._place

    def failing(s: object, **kw: object) -> object:
        real(s, **kw)  # type: ignore[arg-type]
        raise RuntimeError("a placement pass failed")

    monkeypatch.setattr(cp, "_place", failing)
    with pytest.raises(RuntimeError):
        cp.deregister_worker(gpu)  # (offline; its own pass fails, with nothing after it kept)
    assert cp.get_job(queued.id).state is JobState.QUEUED
    cp.submit(job())  # its pass finds `queued` unschedulable, then fails: undone
    assert cp.get_job(queued.id).state is JobState.QUEUED
    assert cp.get_job(later.id).state is JobState.QUEUED and pairs(cp) == [(queued.id, later.id)]

    monkeypatch.setattr(cp, "_place", real)
    cp.schedule()
    assert cp.get_job(queued.id).state is JobState.UNSCHEDULABLE
    error = cp.get_job(later.id).error
    assert error is not None and error.message.startswith(f"not run: {queued.id}, which it runs after, was unschedulable")


def test_after_ended_takes_any_end_and_after_still_needs_a_success(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=2).id
    train, other = cp.submit(job()), cp.submit(job())
    evaluate = cp.submit(job(train.id))
    cleanup = cp.submit(CommandJob(command=["true"], after_ended=[train.id]))
    both = cp.submit(CommandJob(command=["true"], after=[other.id], after_ended=[train.id]))
    assert cleanup.decision is not None and cleanup.decision.summary == (
        f"waiting for {train.id} to end first (it runs after it)")
    assert both.decision is not None and both.decision.summary == (
        f"waiting for {other.id} to succeed and {train.id} to end first (it runs after them)")

    handed = {a.job_id: a for a in cp.poll_tasks(w)}
    assert set(handed) == {train.id, other.id}
    for a in handed.values():
        cp.start_task(a.task_id, worker_id=w)
    cp.finish_task(handed[train.id].task_id, worker_id=w, state=TaskState.FAILED, exit_code=1)

    assert cp.get_job(evaluate.id).state is JobState.FAILED  # (it needed a success)
    assert cp.get_job(cleanup.id).state is JobState.ASSIGNED  # any end will do: placed in that transaction
    record = cp.get_job(both.id)
    assert record.state is JobState.QUEUED and record.decision is not None
    assert record.decision.summary.startswith(f"waiting for {other.id} to succeed first")
    cp.finish_task(handed[other.id].task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    assert cp.get_job(both.id).state is JobState.ASSIGNED and pairs(cp) == []
    # one that has ended already counts as done, whatever its end
    done = cp.submit(CommandJob(command=["true"], after_ended=[evaluate.id]))
    assert done.state is JobState.QUEUED and pairs(cp) == []  # (in the queue: the two slots are busy)
    assert cp.explain_job(done.id).queue_position == 1


def test_after_ended_ids_are_checked_as_after_s(cp: ControlPlane) -> None:
    with pytest.raises(UnknownAfter, match=r"after_ended\[0\]='job-0123456789ab': no such job") as e:
        cp.submit(CommandJob(command=["true"], after_ended=["job-0123456789ab"]))
    assert (e.value.field, e.value.index) == ("after_ended", 0)
    with pytest.raises(InvalidInput, match="'job-1' is in after too"):
        CommandJob(command=["true"], after=["job-1"], after_ended=["job-1"])


def test_jobs_that_an_older_gpulayer_ended_release_the_jobs_after_them_at_the_next_look(cp: ControlPlane) -> None:
    """A process of a GPUlayer from before schema 11 that still runs on the database an upgrade
    migrated (an embedded home's worker, started before the upgrade) ends a job as it always
    did: its state, not the waiting pairs. The job after it waited for ever ("waiting for ... to
    succeed first" of a job that had succeeded); the next look of a newer one releases it."""
    w = cp.register_worker(make_capabilities(), cpu_slots=2).id
    good, bad = cp.submit(job()), cp.submit(job())
    after_good, after_bad = cp.submit(job(good.id)), cp.submit(job(bad.id))
    cancelled_while_waiting = cp.submit(job(good.id))
    for a in cp.poll_tasks(w):
        cp.start_task(a.task_id, worker_id=w)
    with cp.store.write() as s:  # (what the older process wrote: the jobs' and tasks' states alone)
        for job_id, state in ((good.id, "succeeded"), (bad.id, "failed"), (cancelled_while_waiting.id, "cancelled")):
            s.connection().execute(text("UPDATE gl_jobs SET state = :state WHERE id = :id"), {"state": state, "id": job_id})
            s.connection().execute(text("UPDATE gl_tasks SET state = :state WHERE job_id = :id"),
                                   {"state": state, "id": job_id})
    assert cp.get_job(after_good.id).state is JobState.QUEUED

    cp.expire_workers()  # (a newer process's look: every embedded command's, the periodic one of a server or worker)

    assert cp.get_job(after_good.id).state is JobState.ASSIGNED
    error = cp.get_job(after_bad.id).error
    assert cp.get_job(after_bad.id).state is JobState.FAILED and error is not None
    assert error.message.startswith(f"not run: {bad.id}, which it runs after, failed")
    assert cp.get_job(cancelled_while_waiting.id).state is JobState.CANCELLED
    assert "released" not in [e.kind for e in cp.events(cancelled_while_waiting.id)]
    assert pairs(cp) == []


def _started_on_a_worker_that_goes_silent(cp: ControlPlane) -> tuple[str, str, str]:
    """A job started on a worker of its own (which :func:`_written_off` writes off): (the
    worker, the task, the job)."""
    silent = cp.register_worker(make_capabilities(labels={"node": "one"}), cpu_slots=1).id
    lost = cp.submit(job(requirements=Requirements(labels={"node": "one"})))
    [a] = cp.poll_tasks(silent)
    cp.start_task(a.task_id, worker_id=silent)
    return silent, a.task_id, lost.id


def _written_off(cp: ControlPlane, lost: str, heard: str, running: tuple[str, ...] = ()) -> None:
    """That worker has been silent past the timeout (``heard``, which runs ``running``, has
    not): its task is lost, and the job, with no retries left, fails."""
    clock: Clock = cp.clock  # type: ignore[assignment]
    clock.now += 6
    cp.heartbeat(heard, running=running)
    clock.now += 5  # silent for 11 s > 10 s
    cp.expire_workers()
    error = cp.get_job(lost).error
    assert cp.get_job(lost).state is JobState.FAILED and error is not None and error.type == "lost"


def test_a_late_success_of_a_lost_job_puts_the_jobs_failed_because_of_it_back_to_wait(cp: ControlPlane) -> None:
    """The loss was only a silence: the job's worker reports it succeeded after all (see
    test_control's late reports). The jobs that failed without running because of it, down
    the chain, wait again, in the report's transaction, for what they run after as it stands
    now; those a user ran again or deleted, or that ran, are left as they are."""
    silent, task, lost_id = _started_on_a_worker_that_goes_silent(cp)
    lost = cp.get_job(lost_id)
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    bad = cp.submit(job())  # (runs on w, and fails after the loss: `two_failed` failed because of both)
    never = cp.submit(job(requirements=Requirements(accelerator="cuda"),
                          placement={"on_unschedulable": "wait"}))  # type: ignore[arg-type]  # (never ends)
    following = cp.submit(job(lost.id))
    second = cp.submit(job(following.id))  # (the chain's second link)
    also_ended = cp.submit(CommandJob(command=["true"], after=[lost.id], after_ended=[never.id]))
    any_end = cp.submit(CommandJob(command=["true"], after_ended=[lost.id]))
    two_failed = cp.submit(job(lost.id, bad.id))
    rerun = cp.submit(job(lost.id))
    deleted = cp.submit(job(lost.id))
    [b] = cp.poll_tasks(w)
    cp.start_task(b.task_id, worker_id=w)
    _written_off(cp, lost.id, w, running=(b.task_id,))
    for failed in (following, second, also_ended, two_failed, rerun, deleted):
        error = cp.get_job(failed.id).error
        assert error is not None and error.type == "dependency", failed
    assert cp.get_job(two_failed.id).error.message.startswith(f"not run: {lost.id},")  # type: ignore[union-attr]
    cp.finish_task(b.task_id, worker_id=w, state=TaskState.FAILED, exit_code=1)
    assert run(cp, w) == [any_end.id]  # (any end will do: it ran)
    [again] = cp.rerun_jobs([rerun.id]).rerun.values()  # (fails at once: it runs after the lost job too)
    assert cp.get_job(again).state is JobState.FAILED
    cp.delete_jobs([deleted.id])

    cp.finish_task(task, worker_id=silent, state=TaskState.SUCCEEDED, exit_code=0)

    assert cp.get_job(lost.id).state is JobState.SUCCEEDED
    # released (nothing else to wait for), and placed in the same transaction
    record = cp.get_job(following.id)
    assert record.state is JobState.ASSIGNED and record.error is None
    events = [(e.kind, e.message) for e in cp.events(following.id)]
    assert ("waits_again", f"waits again: {lost.id}, which it runs after, succeeded after all (a late report)") \
        in events
    assert "released" in [kind for kind, _ in events]
    # the next link waits for it again
    record = cp.get_job(second.id)
    assert record.state is JobState.QUEUED and record.error is None and record.decision is not None
    assert record.decision.summary == f"waiting for {following.id} to succeed first (it runs after it)"
    assert ("waits_again", f"waits again: {following.id}, which it runs after, will run after all "
            f"({lost.id} succeeded after all: a late report)") in [(e.kind, e.message) for e in cp.events(second.id)]
    # what it waits for is what its spec names, as they stand now: `never` has not ended
    record = cp.get_job(also_ended.id)
    assert record.state is JobState.QUEUED and record.decision is not None
    assert record.decision.summary == f"waiting for {never.id} to end first (it runs after it)"
    # the job run again waits (it is the user's run now); the one it was run again of stays
    assert cp.get_job(again).state is JobState.QUEUED
    assert cp.get_job(rerun.id).state is JobState.FAILED
    # one whose other job failed too did not fail because of the lost job alone
    assert cp.get_job(two_failed.id).state is JobState.FAILED
    assert cp.get_job(any_end.id).state is JobState.SUCCEEDED
    assert pairs(cp) == sorted([(following.id, second.id), (never.id, also_ended.id)])

    # and the chain runs on as any does
    assert run(cp, w) == [following.id]
    assert sorted(run(cp, w) + run(cp, w)) == sorted([second.id, again])  # (one slot)
    assert cp.get_job(second.id).state is JobState.SUCCEEDED


def test_a_late_success_sends_the_jobs_after_a_link_that_waits_again_back_to_wait_for_it(cp: ControlPlane) -> None:
    """A job of the chain that waits again has not ended any more: the jobs that run after its
    end (``after_ended``) and have not run wait for it again, whether its end had released
    them (they wait for a free slot) or failed them for another job they run after."""
    silent, task, lost = _started_on_a_worker_that_goes_silent(cp)
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    busy = cp.submit(job())  # (holds w's slot)
    [held] = cp.poll_tasks(w)
    cp.start_task(held.task_id, worker_id=w)
    link = cp.submit(job(lost))
    cleanup = cp.submit(CommandJob(command=["true"], after_ended=[link.id]))
    both = cp.submit(CommandJob(command=["true"], after=[lost], after_ended=[link.id]))
    _written_off(cp, lost, w)
    assert cp.get_job(link.id).state is JobState.FAILED
    record = cp.get_job(cleanup.id)  # released by the link's end: it waits for a free slot
    assert record.state is JobState.QUEUED and not record.tasks and pairs(cp) == []
    assert cp.get_job(both.id).state is JobState.FAILED

    cp.finish_task(task, worker_id=silent, state=TaskState.SUCCEEDED, exit_code=0)

    assert cp.get_job(link.id).state is JobState.QUEUED  # (released: it waits for the slot)
    for waiting, why in ((cleanup, f"{link.id}, which it runs after, will run after all ({lost} succeeded after "
                                   "all: a late report)"),
                         (both, f"{lost}, which it runs after, succeeded after all (a late report)")):
        record = cp.get_job(waiting.id)
        assert record.state is JobState.QUEUED and record.decision is not None, waiting
        assert record.decision.summary == f"waiting for {link.id} to end first (it runs after it)", waiting
        assert ("waits_again", f"waits again: {why}") in [(e.kind, e.message) for e in cp.events(waiting.id)]
    assert pairs(cp) == sorted([(link.id, cleanup.id), (link.id, both.id)])
    cp.finish_task(held.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    assert run(cp, w) == [link.id]  # (before the jobs after its end)
    assert sorted(run(cp, w) + run(cp, w)) == sorted([cleanup.id, both.id])
    del busy


def test_a_late_report_that_the_lost_job_failed_leaves_the_jobs_after_it_failed(cp: ControlPlane) -> None:
    silent, task, lost = _started_on_a_worker_that_goes_silent(cp)
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    following = cp.submit(job(lost))
    _written_off(cp, lost, w)
    cp.finish_task(task, worker_id=silent, state=TaskState.FAILED, exit_code=1)
    assert cp.get_job(lost).state is JobState.FAILED
    record = cp.get_job(following.id)
    assert record.state is JobState.FAILED and record.error is not None and record.error.type == "dependency"
    assert "waits_again" not in [e.kind for e in cp.events(following.id)]
