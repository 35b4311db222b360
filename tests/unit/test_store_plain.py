"""The job cycle's plain statements (gpulayer/store/plain.py) on SQLite and PostgreSQL: they
read and write the same rows the ORM does, in the caller's transaction."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import SQLModel, select

from gpulayer.errors import DatabaseFailed
from gpulayer.records import TaskState
from gpulayer.store import EventRow, JobRow, Store, TaskRow, plain, queries


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "sqlite":
        return Store(f"sqlite:///{tmp_path / 'plain.db'}")
    return Store(request.getfixturevalue("postgres_url"))


def _columns(table: type[SQLModel]) -> tuple[str, ...]:
    return tuple(c.name for c in table.__table__.columns)  # type: ignore[attr-defined]


def test_the_named_tuples_are_the_tables_columns() -> None:
    # a column added to a table must be added to its plain row too (the INSERT names them all)
    assert set(plain.Job._fields) == set(_columns(JobRow))
    assert set(plain.Task._fields) == set(_columns(TaskRow))


def _job(job_id: str, **values: object) -> plain.Job:
    base = dict(id=job_id, kind="command", spec="{}", state="queued", priority=0, created_at=1.0,
                updated_at=1.0, attempt=0, max_attempts=1, exit_code=None, result=None, error=None,
                decision=None, cancel_requested=False, idempotency_key=None, owner=None, args=None)
    base.update(values)
    return plain.Job(**base)  # type: ignore[arg-type]


def test_a_plain_insert_is_what_the_orm_reads_and_the_other_way_round(store: Store) -> None:
    with store.write() as s:
        plain.insert_job(s, _job("job_a", cancel_requested=True, args='{"args": [1]}'))
        # an ORM row added in the same transaction is flushed before a plain statement reads
        s.add(TaskRow(id="tsk_a", job_id="job_a", attempt=1, worker_id="wrk_1", state="assigned", created_at=2.0))
        assert [t.id for t in plain.tasks_of(s, "job_a")] == ["tsk_a"]
    with store.read() as s:
        orm = queries.job(s, "job_a")
        assert orm.cancel_requested is True and orm.args == '{"args": [1]}'
        row = plain.find_job(s, "job_a")
        assert row is not None and row.cancel_requested is True  # a bool on both databases
        assert plain.find_job(s, "job_b") is None
        assert plain.job_state(s, "job_a") == "queued"
        task = plain.find_task(s, "tsk_a")
        assert task is not None and (task.job_id, task.worker_id, task.devices) == ("job_a", "wrk_1", "[]")


def test_a_task_moves_only_from_the_states_allowed(store: Store) -> None:
    with store.write() as s:
        plain.insert_job(s, _job("job_c", attempt=1))
        s.add(TaskRow(id="tsk_c", job_id="job_c", attempt=1, worker_id="wrk_1", state="assigned"))
    with store.write() as s:
        assert queries.transition_task(s, "tsk_c", TaskState.RUNNING, started_at=5.0)
        # a second start, or a late report of a state it cannot reach from here: refused
        assert not queries.transition_task(s, "tsk_c", TaskState.RUNNING, started_at=6.0)
        assert not plain.set_task_state(s, "tsk_c", "succeeded", ("assigned",), ended_at=7.0)
        plain.update_job(s, "job_c", state="running", updated_at=5.0)
    with store.read() as s:
        task = queries.task(s, "tsk_c")
        assert (task.state, task.started_at, task.ended_at) == ("running", 5.0, None)
        assert queries.job(s, "job_c").state == "running"


def test_reads_by_id_lists_go_in_chunks(store: Store) -> None:
    ids = [f"tsk_{i:04d}" for i in range(plain.IN_CHUNK * 2 + 3)]
    with store.write() as s:
        plain.insert_job(s, _job("job_d", attempt=1))
        s.add_all([TaskRow(id=t, job_id="job_d", attempt=1, worker_id="wrk_1", state="running") for t in ids])
    with store.read() as s:
        rows = queries.heartbeat_view(s, [*ids, "tsk_gone"])
        assert sorted(r[0] for r in rows) == ids  # every chunk, and nothing for a task that is not there
        assert {(bool(r[5]), r[6]) for r in rows} == {(False, "queued")}  # the job's cancel flag and state
        assert queries.heartbeat_view(s, []) == []


def test_events_and_assignments(store: Store) -> None:
    with store.write() as s:
        plain.insert_job(s, _job("job_e", attempt=1, spec='{"kind": "command"}', args=None))
        s.add(TaskRow(id="tsk_e2", job_id="job_e", attempt=1, worker_id="wrk_2", state="assigned", created_at=3.0))
        s.add(TaskRow(id="tsk_e1", job_id="job_e", attempt=1, node_rank=1, worker_id="wrk_2", state="assigned",
                      created_at=2.0))
        s.add(TaskRow(id="tsk_e3", job_id="job_e", attempt=1, worker_id="wrk_3", state="assigned", created_at=1.0))
        queries.add_event(s, ts=9.0, kind="submitted", job_id="job_e", message="command")
    with store.read() as s:
        got = plain.assigned_of_worker(s, "wrk_2")
        assert [(t.id, spec) for t, spec, _ in got] == [("tsk_e1", '{"kind": "command"}'),
                                                         ("tsk_e2", '{"kind": "command"}')]  # oldest first
        events = s.exec(select(EventRow).where(EventRow.job_id == "job_e")).all()
        assert [(e.kind, e.ts, e.message) for e in events] == [("submitted", 9.0, "command")]


def test_sqlite_writers_of_every_process_queue_on_the_databases_lock_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write holds an exclusive flock of ``gpulayer.db.writers`` (another process, here
    another open file description, cannot take it meanwhile); one that cannot get it in time
    gives up naming the file; the Stores of one process on one file share one lock."""
    import fcntl
    import os

    from gpulayer.store import _WriterLock

    url = f"sqlite:///{tmp_path / 'locked.db'}"
    store, again = Store(url), Store(url)
    assert store._write_lock is again._write_lock  # one per file and process
    fd = os.open(tmp_path / "locked.db.writers", os.O_RDWR)
    try:
        with store.write() as s:
            plain.insert_job(s, _job("job_locked"))
            with pytest.raises(BlockingIOError):  # held while the write is open...
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ...and let go at its end
        # held by "another process": a write waits, then gives up saying why
        monkeypatch.setattr(_WriterLock, "WAIT", 0.2)
        with pytest.raises(DatabaseFailed, match=r"locked\.db\.writers"), again.write() as s:
            plain.insert_job(s, _job("job_never"))
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    with again.write() as s:  # nothing of the refused write; writes go on once it is free
        assert plain.find_job(s, "job_never") is None
        plain.insert_job(s, _job("job_after"))
    with store.read() as s:
        assert [plain.find_job(s, j) is not None for j in ("job_locked", "job_after")] == [True, True]
    store.dispose()
    again.dispose()


def test_a_statement_the_database_refuses_is_a_bug_not_a_database_that_failed(tmp_path: Path) -> None:
    """SQLite says "no such column", "no such table", a syntax error and too many variables
    with the same OperationalError as a full disk or a lock held too long. Those are this
    GPUlayer's mistakes (or a schema it does not match), not a database that may work again
    in a moment: they stay the driver's error, so that a server answers them 500 and logs
    their traceback, and its clients do not retry them as an outage (HTTP 503) for 30 s."""
    from sqlalchemy import exc, text

    store = Store(f"sqlite:///{tmp_path / 'gl.db'}")
    try:
        for sql in ("SELECT no_such_column FROM gl_jobs", "SELECT 1 FROM no_such_table", "SELEC 1"):
            with pytest.raises(exc.OperationalError), store.write() as s:
                s.execute(text(sql))
            with pytest.raises(exc.OperationalError), store.read() as s:
                s.execute(text(sql))
    finally:
        store.dispose()


def test_a_server_says_a_lock_held_too_long_without_naming_its_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server answers DatabaseFailed with the database's own words and none of its paths
    (its log names them); the writers' lock held too long by another process said its lock
    file's path to every client: 'another process has held /srv/.../gpulayer.db.writers'."""
    import fcntl
    import os

    from starlette.testclient import TestClient

    from gpulayer.control import ControlPlane
    from gpulayer.server.app import create_app
    from gpulayer.store import _WriterLock

    folder = tmp_path / "private-server-folder"
    control = ControlPlane(Store(f"sqlite:///{folder / 'gpulayer.db'}"), heartbeat_timeout=30)
    monkeypatch.setattr(_WriterLock, "WAIT", 0.2)
    with TestClient(create_app(control, background=False)) as tc:
        admin = {"authorization": f"Bearer {control.create_token(scope='admin').token}"}
        fd = os.open(folder / "gpulayer.db.writers", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (another process, stopped while it writes)
            answer = tc.post("/v1/jobs", headers=admin, json={"spec": {"kind": "command", "command": ["true"]}})
        finally:
            os.close(fd)
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "database_failed", answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("the server's database failed: the database is locked"), message
    assert "private-server-folder" not in answer.text
    control.store.dispose()


@pytest.mark.postgres
def test_a_server_says_postgresqls_failures_without_its_host_user_or_files(postgres_url: str) -> None:
    """PostgreSQL's own words name its files, its users and its host; a client of a server
    is told the kind of failure (by its SQLSTATE, or libpq's cause), the log the words."""
    import psycopg

    store = Store(postgres_url)
    try:
        for error, said in [
            (psycopg.errors.DiskFull('could not extend file "base/16384/2619": No space left on device'),
             "the database server's disk is full (SQLSTATE 53100)"),
            (psycopg.errors.InvalidPassword('password authentication failed for user "gl_private"'),
             "the database server refused this server's credentials (SQLSTATE 28P01)"),
            (psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
             "the database server is shutting down (SQLSTATE 57P01)"),
            (psycopg.errors.IoError('could not read block 0 in file "base/16384/2619": read only 0 of 8192 bytes'),
             "the database server failed a statement (SQLSTATE 58030)"),
            (psycopg.OperationalError('connection failed: connection to server at "10.9.8.7", port 6543 failed: '
                                      'FATAL:  password authentication failed for user "gl_private"'),
             "the database server refused this server's credentials"),
            (psycopg.OperationalError('consuming input failed: server closed the connection unexpectedly\n'
                                      '\tThis probably means the server terminated abnormally'),
             "the connection to the database server was lost"),
            (psycopg.OperationalError('connection failed: connection to server at "10.9.8.7", port 6543 failed: '
                                      'something new'),
             "the database server could not be reached"),
        ]:
            failed = store._failed(error)
            assert str(failed).endswith(" ".join(str(error).split())), failed  # (the log's words)
            assert str(failed.for_clients()) == f"the server's database failed: {said}"
    finally:
        store.dispose()
