"""The change marks a placement pass trusts its kept fleet by (gpulayer/store/marks.py,
gpulayer/control/fleetcache.py), on SQLite and PostgreSQL: a change made by another
process reaches the next pass, a pass rolled back leaves nothing trusted, and the marks
move exactly when what a pass reads of the fleet changed."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from sqlalchemy import text

from gpulayer.control import ControlPlane
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob, Placement, Requirements
from gpulayer.store import Store, marks, migrations, queries
from tests.factories import cuda_caps, make_capabilities


def waiting_gpu_job(gpus: int = 1) -> CommandJob:
    return CommandJob(command=["train"], requirements=Requirements(accelerator="cuda", gpus=gpus),
                      placement=Placement(on_unschedulable="wait"))


def current(cp: ControlPlane) -> marks.Marks | None:
    with cp.store.read() as s:
        return marks.read(s)


def _run_sql(url: str, statements: list[tuple[str, dict[str, Any]]]) -> None:
    """In a process of its own, with its own connection: what another server would do."""
    store = Store(url)
    with store.write() as s:
        for sql, params in statements:
            s.execute(text(sql), params)
    store.dispose()


def in_another_process(url: str, *statements: tuple[str, dict[str, Any]]) -> None:
    p = multiprocessing.get_context("spawn").Process(target=_run_sql, args=(url, list(statements)))
    p.start()
    p.join(60)
    assert p.exitcode == 0


#: the triggers' text as each schema installs them (schema 8 kept 7's; 9 made them anew, a lent
#: task holding nothing; 10 too, a worker's pause being read by a pass; 11 kept 10's).
#: Databases keep the triggers they were given: a change here (the columns a pass reads, the
#: active states) needs a schema version whose migration installs them again; then record the
#: new digest with the new version.
TRIGGERS = {7: "3d4aecd4ab38f690ccbd42f80a37f214719b78361571b892e76c41dae4840bb5",
            8: "3d4aecd4ab38f690ccbd42f80a37f214719b78361571b892e76c41dae4840bb5",
            9: "c12b1ae289a0be1198e10b7eb4ff0cc5092078fdfda30e5db5de188577a84fd5",
            10: "6bc5489bba45bf8e3fe13ab7542436a1381dcc572b827cd85b72d4604a129f82",
            11: "6bc5489bba45bf8e3fe13ab7542436a1381dcc572b827cd85b72d4604a129f82",
            12: "6bc5489bba45bf8e3fe13ab7542436a1381dcc572b827cd85b72d4604a129f82",
            13: "6bc5489bba45bf8e3fe13ab7542436a1381dcc572b827cd85b72d4604a129f82",
            14: "6bc5489bba45bf8e3fe13ab7542436a1381dcc572b827cd85b72d4604a129f82",
            15: "6bc5489bba45bf8e3fe13ab7542436a1381dcc572b827cd85b72d4604a129f82"}


def test_the_triggers_change_only_with_the_schema() -> None:
    import hashlib

    ddl = "\n".join(marks._sqlite_ddl() + marks._postgres_ddl())
    assert TRIGGERS.get(migrations.SCHEMA_VERSION) == hashlib.sha256(ddl.encode()).hexdigest(), (
        "the change marks' triggers changed: add a schema version whose migration installs them again")
    # the migration from schema 6 installs schema 7's, before the column schema 9 tests
    v7 = "\n".join(marks._sqlite_ddl(lent=False, paused=False) + marks._postgres_ddl(lent=False, paused=False))
    assert hashlib.sha256(v7.encode()).hexdigest() == TRIGGERS[7]
    # and the migration from schema 8 installs schema 9's, before the column schema 10 tests
    v9 = "\n".join(marks._sqlite_ddl(paused=False) + marks._postgres_ddl(paused=False))
    assert hashlib.sha256(v9.encode()).hexdigest() == TRIGGERS[9]
    assert marks.WORKER_COLUMNS == queries.WORKER_COLUMNS and marks.ACTIVE == queries.ACTIVE_TASK_STATES


def test_the_marks_move_exactly_when_the_fleet_a_pass_reads_changed(cp: ControlPlane) -> None:
    m0 = current(cp)
    assert m0 is not None
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    m1 = current(cp)
    assert m1 is not None and m1.workers.n == m0.workers.n + 1 and m1.tasks == m0.tasks
    cp.clock.now += 1  # type: ignore[attr-defined]
    cp.heartbeat(w)  # only the heartbeat's time: nothing a pass reads
    assert current(cp) == m1
    job = cp.submit(waiting_gpu_job())
    m2 = current(cp)
    assert m2 is not None and m2.workers == m1.workers and m2.tasks.n == m1.tasks.n + 1
    [a] = cp.poll_tasks(w)
    cp.start_task(a.task_id, worker_id=w)  # assigned -> running holds the same device
    assert current(cp) == m2
    cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    m3 = current(cp)
    assert m3 is not None and m3.tasks.n == m2.tasks.n + 1 and m3.tasks.salt != m2.tasks.salt
    assert cp.get_job(job.id).state is JobState.SUCCEEDED
    cp.drain_worker(w)
    m4 = current(cp)
    assert m4 is not None and m4.workers.n > m3.workers.n


def test_an_active_task_moved_to_other_devices_elsewhere_is_seen_by_the_next_pass(
    cp: ControlPlane, store_url: str,
) -> None:
    """No code of ours moves an active task; a hand-written UPDATE may, and it moves the
    ``workers`` mark, which makes the next pass read everything again."""
    w = cp.register_worker(cuda_caps(2), cpu_slots=0).id
    cp.submit(waiting_gpu_job())
    [a] = cp.poll_tasks(w)
    assert a.devices == [0]
    cp.schedule()
    before = current(cp)
    in_another_process(store_url, ("UPDATE gl_tasks SET devices = '[1]' WHERE id = :id", {"id": a.task_id}))
    after = current(cp)
    assert before is not None and after is not None and after.workers.n == before.workers.n + 1
    job = cp.submit(waiting_gpu_job())
    assert cp.get_job(job.id).tasks[0].devices == [0]  # device 1 is the moved task's now


def test_a_pass_with_nothing_changed_reads_no_fleet(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    cp.submit(waiting_gpu_job())  # takes the GPU
    cp.submit(waiting_gpu_job())  # waits
    cache = cp._placement_cache.workers
    with cp.store.write() as s:
        kept, room = cache.fleet(s)
        assert not room
        assert cache.fleet(s)[0] is kept  # the very states kept: nothing was read again
    [a] = cp.poll_tasks(w)
    cp.start_task(a.task_id, worker_id=w)
    cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)  # the waiting job runs
    with cp.store.write() as s:
        states, room = cache.fleet(s)
        assert [sorted(ws.busy_devices) for ws in states] == [[("cuda", 0)]] and not room


def test_a_task_ended_by_another_process_frees_its_device_for_the_next_pass(cp: ControlPlane, store_url: str) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    first = cp.submit(waiting_gpu_job())
    second = cp.submit(waiting_gpu_job())
    cp.schedule()  # the pass keeps a fleet in which the GPU is busy
    assert cp.get_job(second.id).state is JobState.QUEUED
    [a] = cp.poll_tasks(w)
    in_another_process(store_url, ("UPDATE gl_tasks SET state = 'succeeded' WHERE id = :id", {"id": a.task_id}),
                       ("UPDATE gl_jobs SET state = 'succeeded' WHERE id = :id", {"id": first.id}))
    cp.schedule()
    job = cp.get_job(second.id)
    assert job.state is JobState.ASSIGNED and job.tasks[0].worker_id == w


def test_a_worker_changed_by_another_process_is_seen_by_the_next_pass(cp: ControlPlane, store_url: str) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    job = cp.submit(waiting_gpu_job(gpus=2))  # no worker has two GPUs: it waits
    cp.schedule()
    assert cp.get_job(job.id).state is JobState.QUEUED
    caps = cuda_caps(2).model_dump_json()
    in_another_process(store_url, ("UPDATE gl_workers SET capabilities = :c WHERE id = :id", {"c": caps, "id": w}))
    cp.schedule()
    got = cp.get_job(job.id)
    assert got.state is JobState.ASSIGNED and got.tasks[0].devices == [0, 1]


@pytest.mark.parametrize("column", ["draining", "paused"])
def test_a_worker_drained_by_another_process_gets_nothing_from_the_next_pass(cp: ControlPlane, store_url: str,
                                                                             column: str) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    first = cp.submit(waiting_gpu_job())
    second = cp.submit(waiting_gpu_job())
    cp.schedule()
    [a] = cp.poll_tasks(w)
    # the task ends and the worker drains in one transaction elsewhere: were only the tasks
    # read again, the pass would hand the freed GPU of a draining worker to the second job
    in_another_process(store_url, ("UPDATE gl_tasks SET state = 'succeeded' WHERE id = :id", {"id": a.task_id}),
                       ("UPDATE gl_jobs SET state = 'succeeded' WHERE id = :id", {"id": first.id}),
                       (f"UPDATE gl_workers SET {column} = :yes WHERE id = :id", {"yes": True, "id": w}))
    cp.schedule()
    assert cp.get_job(second.id).state is JobState.QUEUED


def test_what_a_rolled_back_transaction_showed_a_pass_is_not_trusted(cp: ControlPlane, store_url: str) -> None:
    """The salt: a rolled-back change counted the mark up, and another writer's change
    counts it to the same number; the kept fleet (of the rolled-back change) must not pass."""
    gpu = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    cpu = cp.register_worker(make_capabilities(), cpu_slots=1).id
    cp.submit(waiting_gpu_job())
    [a] = cp.poll_tasks(gpu)
    cp.start_task(a.task_id, worker_id=gpu)
    waiting = cp.submit(waiting_gpu_job())
    cp.schedule()
    before = current(cp)
    with pytest.raises(RuntimeError), cp.store.write() as s:
        assert queries.transition_task(s, a.task_id, TaskState.SUCCEEDED, ended_at=cp.clock(), exit_code=0)
        _, room = cp._placement_cache.fleet(s)  # a pass reads the fleet: the GPU looks free
        assert room
        raise RuntimeError("rolled back")
    in_another_process(store_url, (
        "INSERT INTO gl_tasks (id, job_id, attempt, node_rank, worker_id, accelerator, devices, state, created_at)"
        " VALUES ('tsk-elsewhere', 'job-elsewhere', 1, 0, :w, NULL, '[]', 'running', 0)", {"w": cpu}))
    after = current(cp)
    assert before is not None and after is not None and after.tasks.n == before.tasks.n + 1
    cp.schedule()
    assert cp.get_job(waiting.id).state is JobState.QUEUED  # the GPU is still the first job's
    with cp.store.write() as s:
        held = {ws.record.id: (sorted(ws.busy_devices), ws.busy_cpu_slots) for ws in cp._placement_cache.fleet(s)[0]}
    assert held == {gpu: ([("cuda", 0)], 0), cpu: ([], 1)}


def test_the_marks_are_installed_by_the_migration_from_schema_6(store_url: str) -> None:
    store = Store(store_url)
    sqlite = store.is_sqlite
    with store.engine.begin() as conn:  # schema 6: without what 7 added
        for statement in marks._sqlite_ddl() if sqlite else marks._postgres_ddl():
            if statement.startswith("CREATE TRIGGER"):
                name = statement.split()[2]
                conn.execute(text(f"DROP TRIGGER {name}" + ("" if sqlite else f" ON {marks._table(statement)}")))
        if not sqlite:
            conn.execute(text("DROP FUNCTION gl_mark_workers(), gl_mark_tasks()"))
        conn.execute(text("DROP TABLE gl_marks"))
        conn.execute(text("ALTER TABLE gl_tasks DROP COLUMN lent"))  # (schema 9's)
        conn.execute(text("ALTER TABLE gl_workers DROP COLUMN paused"))  # (schema 10's)
        conn.execute(text("UPDATE gl_schema SET version = 6"))
    store.dispose()
    cp = ControlPlane(Store(store_url))
    assert cp.store.schema_version() == migrations.SCHEMA_VERSION  # (7, 8: indexes alone, 9 and 10: a column each)
    before = current(cp)
    assert before is not None
    cp.register_worker(cuda_caps(1), cpu_slots=0)
    after = current(cp)
    assert after is not None and after.workers.n == before.workers.n + 1
    cp.store.dispose()


def test_a_decision_payload_is_unchanged_by_the_kept_fleet(cp: ControlPlane) -> None:
    """The waiting job's stored reasons name the busy worker, as with a fleet read anew."""
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    cp.submit(waiting_gpu_job())
    waiting = cp.submit(waiting_gpu_job())
    cp.schedule()
    decision = cp.get_job(waiting.id).decision
    assert decision is not None and decision.outcome == "waiting"
    assert [r.render() for r in decision.reasons] == [f"{w}: compatible but busy: no free cuda device"]
