"""A waiting task's CPU slot, lent to the queue (gpulayer/control/lending.py), on SQLite and
PostgreSQL: what a pass places while it is lent, what taking it back leaves, what lends
nothing, and a second control plane on the same database seeing it (the change marks)."""

from __future__ import annotations

import pytest

from gpulayer.control import ControlPlane
from gpulayer.errors import NotFound
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob
from gpulayer.store import Store
from tests.factories import cuda_caps, gpu_job, make_capabilities


def cpu_job() -> CommandJob:
    return CommandJob(command=["work"])


def started(cp: ControlPlane, worker_id: str, job_id: str) -> str:
    """The job's task on the worker, started; its id."""
    [a] = [t for t in cp.poll_tasks(worker_id) if t.job_id == job_id]
    cp.start_task(a.task_id, worker_id=worker_id)
    return a.task_id


def finish(cp: ControlPlane, worker_id: str, task_id: str) -> None:
    cp.finish_task(task_id, worker_id=worker_id, state=TaskState.SUCCEEDED, exit_code=0)


def test_a_lent_slot_runs_the_queued_job_and_is_taken_back(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    outer = cp.submit(cpu_job())
    outer_task = started(cp, w, outer.id)
    inner = cp.submit(cpu_job())
    assert cp.get_job(inner.id).state is JobState.QUEUED  # the one slot is the outer job's

    assert cp.lend_slot(outer.id, task_id=outer_task, lent=True).lent is True
    assert cp.get_job(inner.id).state is JobState.ASSIGNED  # placed by the lending's pass
    assert [t.lent for t in cp.get_job(outer.id).tasks] == [True]  # (jobs show, the dashboard say so)
    assert cp.worker_usage()[w].busy_cpu_slots == 1  # the inner job's; the outer holds nothing
    inner_task = started(cp, w, inner.id)
    assert cp.lend_slot(outer.id, task_id=outer_task, lent=True).lent is True  # (again: no change)

    assert cp.lend_slot(outer.id, task_id=outer_task, lent=False).lent is False
    assert [t.lent for t in cp.get_job(outer.id).tasks] == [False]
    assert cp.worker_usage()[w].busy_cpu_slots == 2  # over its one slot until a task ends
    third = cp.submit(cpu_job())
    finish(cp, w, inner_task)
    assert cp.get_job(third.id).state is JobState.QUEUED  # the outer job holds the slot again
    finish(cp, w, outer_task)
    assert cp.get_job(third.id).state is JobState.ASSIGNED


def test_a_task_that_holds_devices_or_has_ended_lends_nothing(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    gpu = cp.submit(gpu_job())
    gpu_task = started(cp, w, gpu.id)
    waiting = cp.submit(gpu_job())
    assert cp.lend_slot(gpu.id, task_id=gpu_task, lent=True).lent is False
    assert cp.get_job(waiting.id).state is JobState.QUEUED
    assert cp.worker_usage()[w].busy_devices == ["cuda:0"]

    c = cp.register_worker(make_capabilities(), cpu_slots=1).id
    done = cp.submit(cpu_job())
    done_task = started(cp, c, done.id)
    finish(cp, c, done_task)
    assert cp.lend_slot(done.id, task_id=done_task, lent=True).lent is False


def test_with_lending_off_where_the_control_plane_runs_nothing_is_lent(cp: ControlPlane,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    outer = cp.submit(cpu_job())
    outer_task = started(cp, w, outer.id)
    inner = cp.submit(cpu_job())
    monkeypatch.setenv("GPULAYER_SLOT_LENDING", "off")
    assert cp.lend_slot(outer.id, task_id=outer_task, lent=True).lent is False
    assert cp.get_job(inner.id).state is JobState.QUEUED


def test_another_job_s_task_or_an_unknown_one_is_not_found(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=2).id
    a, b = cp.submit(cpu_job()), cp.submit(cpu_job())
    a_task = started(cp, w, a.id)
    with pytest.raises(NotFound, match=a_task):
        cp.lend_slot(b.id, task_id=a_task, lent=True)
    with pytest.raises(NotFound, match="tsk-nope"):
        cp.lend_slot(a.id, task_id="tsk-nope", lent=True)
    assert cp.worker_usage()[w].busy_cpu_slots == 2  # both jobs' tasks hold their slots


def test_a_slot_lent_through_another_control_plane_is_seen_by_the_next_pass(cp: ControlPlane, store_url: str) -> None:
    """The first control plane keeps its fleet between passes; a lending elsewhere moves the
    change marks, so its next pass counts the slot as free (and again as held when taken back)."""
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    outer = cp.submit(cpu_job())
    outer_task = started(cp, w, outer.id)
    other = ControlPlane(Store(store_url))
    try:
        inner = cp.submit(cpu_job())  # queued: the fleet the pass kept has no room
        assert cp.get_job(inner.id).state is JobState.QUEUED
        with other.store.write() as s:  # lent without a pass: only the first plane's pass may place it
            from gpulayer.store import plain

            assert plain.set_task_lent(s, outer_task, True)
        cp.schedule()
        assert cp.get_job(inner.id).state is JobState.ASSIGNED
        inner_task = started(cp, w, inner.id)
        other.lend_slot(outer.id, task_id=outer_task, lent=False)
        third = cp.submit(cpu_job())
        finish(cp, w, inner_task)
        assert cp.get_job(third.id).state is JobState.QUEUED
    finally:
        other.store.dispose()


def test_schema_9_gives_a_database_of_schema_8_the_column_and_its_triggers(store_url: str) -> None:
    """A running task stored before the upgrade holds its slot after it, and lends it."""
    from sqlalchemy import text

    from gpulayer.store import marks, migrations

    cp = ControlPlane(Store(store_url))
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    outer = cp.submit(cpu_job())
    outer_task = started(cp, w, outer.id)
    sqlite = cp.store.is_sqlite
    with cp.store.engine.begin() as conn:  # back to schema 8: its triggers, no column
        for statement in marks._sqlite_ddl() if sqlite else marks._postgres_ddl():
            if statement.startswith("CREATE TRIGGER"):
                name = statement.split()[2]
                conn.execute(text(f"DROP TRIGGER {name}" + ("" if sqlite else f" ON {marks._table(statement)}")))
        conn.execute(text("ALTER TABLE gl_tasks DROP COLUMN lent"))
        marks.install(conn, lent=False, paused=False)
        conn.execute(text("UPDATE gl_schema SET version = 8"))
    cp.store.dispose()
    cp = ControlPlane(Store(store_url))
    try:
        assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
        inner = cp.submit(cpu_job())
        assert cp.get_job(inner.id).state is JobState.QUEUED
        assert cp.lend_slot(outer.id, task_id=outer_task, lent=True).lent is True
        assert cp.get_job(inner.id).state is JobState.ASSIGNED
    finally:
        cp.store.dispose()
