"""The control plane's store against real databases: schema migrations, several processes on
one database, what is stored (logs, results, arguments) and a placement pass that fails."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control import ControlPlane, placement
from gpulayer.errors import Conflict, InvalidInput
from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, migrations
from tests.factories import Clock, cuda_caps, gpu_job, make_capabilities


def test_migration_from_the_previous_schema_keeps_stored_jobs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for statement in migrations.HISTORY[1]:
        db.execute(statement)
    spec = CommandJob(command=["echo", "from v1"]).model_dump_json()
    db.execute(
        "INSERT INTO gl_jobs (id, kind, spec, state, priority, created_at, updated_at, attempt,"
        " max_attempts, cancel_requested) VALUES ('job-000000000001', 'command', ?, 'succeeded', 0,"
        " 1.0, 2.0, 1, 1, 0)", (spec,))
    db.commit()
    db.close()
    store = Store(f"sqlite:///{path}")
    assert store.schema_version() == migrations.SCHEMA_VERSION == 15
    cp = ControlPlane(store)
    job = cp.get_job("job-000000000001")
    assert job.state is JobState.SUCCEEDED
    assert job.spec.command == ["echo", "from v1"]  # type: ignore[union-attr]
    # the new columns work on the migrated database
    cp.register_worker(make_capabilities(), cpu_slots=1)
    assert cp.submit(CommandJob(command=["true"]), idempotency_key="x").id == \
        cp.submit(CommandJob(command=["true"]), idempotency_key="x").id
    assert len(cp.list_jobs()) == 2


def _job_indexes(store: Store) -> dict[str, tuple[str, ...]]:
    from sqlalchemy import inspect

    return {ix["name"]: tuple(c or "" for c in ix["column_names"]) for ix in inspect(store.engine).get_indexes("gl_jobs")
            if ix["name"] is not None}


def test_schema_8_gives_a_database_of_schema_7_the_indexes_of_a_new_one(store_url: str) -> None:
    """Lists of one state's or one owner's jobs, newest first, have indexes to read in that
    order; the indexes of state and owner alone, which they begin with, are gone."""
    from sqlalchemy import text

    store = Store(store_url)
    new = _job_indexes(store)
    assert new["ix_gl_jobs_state_created"] == ("state", "created_at")
    assert new["ix_gl_jobs_owner_created"] == ("owner", "created_at")
    assert not {"ix_gl_jobs_state", "ix_gl_jobs_owner"} & set(new)
    with store.engine.begin() as conn:  # the jobs' indexes as schema 7 had them
        for statement in ("DROP INDEX ix_gl_jobs_state_created", "DROP INDEX ix_gl_jobs_owner_created",
                          "CREATE INDEX ix_gl_jobs_state ON gl_jobs (state)",
                          "CREATE INDEX ix_gl_jobs_owner ON gl_jobs (owner)", "UPDATE gl_schema SET version = 7"):
            conn.execute(text(statement))
    store.dispose()
    migrated = Store(store_url)
    assert migrated.schema_version() == migrations.SCHEMA_VERSION and _job_indexes(migrated) == new
    migrated.dispose()


def test_a_list_of_one_state_or_one_owner_is_read_in_index_order(tmp_path: Path) -> None:
    """No list sorts all the jobs of its state or owner first (SQLite's plan has no
    temporary B-tree for the ORDER BY), on the full path and on the CLI's light path alike.
    Jobs of one submit time are ordered by id (a page's cursor needs a total order): that is
    a partial sort of each tie, in index order, which the LIMIT still stops early
    ("USE TEMP B-TREE FOR RIGHT PART OF ORDER BY"; 50 of 20,000 jobs in 2.4 ms before and
    after it)."""
    from sqlalchemy import event

    from gpulayer import embedded_reads

    path = tmp_path / "gpulayer.db"
    cp = ControlPlane(Store(f"sqlite:///{path}"))
    statements: list[str] = []
    event.listen(cp.store.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, params, context, many: statements.append(
                     statement.replace("?", "{!r}").format(*params) if "FROM gl_jobs" in statement else ""))
    cp.list_jobs(state="queued", limit=5)
    cp.list_jobs(owner="tok-1", limit=5)
    cp.list_jobs(state="failed", owner="tok-1", limit=5)
    db = sqlite3.connect(path)
    db.set_trace_callback(statements.append)
    embedded_reads.job_lines(db, state="succeeded", limit=5)
    db.set_trace_callback(None)
    lists = [s for s in statements if "FROM gl_jobs" in s and "ORDER BY gl_jobs.created_at DESC" in s]
    assert len(lists) == 4, statements
    for statement in lists:
        plan = " / ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {statement}"))
        assert "TEMP B-TREE FOR ORDER BY" not in plan and "_created" in plan, (statement, plan)
    db.close()
    cp.store.dispose()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    Store(f"sqlite:///{path}").dispose()
    db = sqlite3.connect(path)
    db.execute("UPDATE gl_schema SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(migrations.SchemaTooNew, match="schema version 99"):
        Store(f"sqlite:///{path}")
    # which database is said (a server may be started on any of several; it was not)
    with pytest.raises(migrations.SchemaTooNew, match=rf"^--database sqlite:///{path}: the database has schema "
                                                      rf"version 99, newer than this GPUlayer understands "
                                                      rf"\({migrations.SCHEMA_VERSION}\)"):
        Store(f"sqlite:///{path}", where="--database")


def test_a_new_database_another_process_holds_is_put_in_wal_mode_once_it_lets_go(tmp_path: Path) -> None:
    """Processes that open a new home at once meet on its switch to WAL mode, which SQLite
    refuses at once ("database is locked", without its busy handler) while another holds
    the file: the open waits for it instead of failing."""
    import threading
    import time

    path = tmp_path / "gpulayer.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE t (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO t VALUES (1)")
    released: list[float] = []

    def release() -> None:
        time.sleep(0.3)
        released.append(time.monotonic())
        other.execute("COMMIT")

    releaser = threading.Thread(target=release)
    releaser.start()
    store = Store(f"sqlite:///{path}")
    try:
        assert released and time.monotonic() >= released[0]  # it waited for the other to let go
        with store.read() as s:
            assert s.connection().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        store.dispose()
        releaser.join()
        other.close()


@pytest.mark.parametrize(("setting", "synchronous"), [(None, 2), ("normal", 1), ("FULL", 2)])
def test_an_sqlite_commit_is_synced_to_disk_unless_the_setting_says_normal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None, synchronous: int) -> None:
    """PRAGMA synchronous on the connections that write: FULL (2) by default, so that in WAL
    mode each commit syncs the log before it is acknowledged; NORMAL (1) with
    GPULAYER_SQLITE_SYNC=normal (docs/settings.md)."""
    if setting is None:
        monkeypatch.delenv("GPULAYER_SQLITE_SYNC", raising=False)
    else:
        monkeypatch.setenv("GPULAYER_SQLITE_SYNC", setting)
    store = Store(f"sqlite:///{tmp_path / 'gpulayer.db'}")
    try:
        with store.write() as s:
            assert s.connection().exec_driver_sql("PRAGMA synchronous").scalar() == synchronous
            assert s.connection().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        store.dispose()


@pytest.mark.parametrize(("setting", "synchronous"), [(None, 2), ("normal", 1)])
def test_signs_of_life_are_committed_unsynced_and_every_other_write_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None, synchronous: int) -> None:
    """A worker's heartbeats and other signs of life commit with PRAGMA synchronous=NORMAL
    (1): an idle embedded worker heartbeats twice a second, and losing its last heartbeats
    to an OS crash harms nothing. The connection is synced again at once (the job's start
    after them on the same thread is), also after a transaction that failed."""
    from gpulayer.store import queries

    if setting is None:
        monkeypatch.delenv("GPULAYER_SQLITE_SYNC", raising=False)
    else:
        monkeypatch.setenv("GPULAYER_SQLITE_SYNC", setting)
    cp = ControlPlane(Store(f"sqlite:///{tmp_path / 'gpulayer.db'}"), clock=Clock())
    seen: list[tuple[str, int]] = []

    def spy(name: str, real: Any) -> Any:
        def wrapped(s: Any, *args: Any, **kw: Any) -> Any:
            seen.append((name, s.connection().exec_driver_sql("PRAGMA synchronous").scalar()))
            return real(s, *args, **kw)
        return wrapped

    monkeypatch.setattr(queries, "touch_workers", spy("touch", queries.touch_workers))
    monkeypatch.setattr(queries, "touch_workers_at", spy("touch_at", queries.touch_workers_at))
    try:
        w = cp.register_worker(make_capabilities(), cpu_slots=1).id
        job = cp.submit(CommandJob(command=["true"]))
        cp.heartbeat(w)
        cp.heartbeats_heard({w: cp.clock()})
        cp.seen([w])
        [task] = cp.poll_tasks(w)
        cp.start_task(task.task_id, worker_id=w)  # (on the same thread's connection as the heartbeats)
        with cp.store.read() as s:
            assert s.connection().exec_driver_sql("PRAGMA synchronous").scalar() == synchronous
        with pytest.raises(RuntimeError), cp.store.write(synced=False):
            raise RuntimeError("a write that fails")
        with cp.store.write() as s:
            assert s.connection().exec_driver_sql("PRAGMA synchronous").scalar() == synchronous
        assert [name for name, _ in seen] == ["touch", "touch_at", "touch"]
        assert {level for _, level in seen} == {1}
        assert cp.get_job(job.id).state is JobState.RUNNING
    finally:
        cp.store.dispose()


def test_bad_database_urls_name_what_is_accepted() -> None:
    with pytest.raises(InvalidInput, match="accepted: sqlite:///PATH or postgresql://"):
        Store("mysql://root@localhost/db")


# --------------------------------------------------------------------------- several processes


def _claimer(url: str, worker_id: str, rounds: int, out: Any) -> None:
    cp = ControlPlane(Store(url))
    claimed = []
    for _ in range(rounds):
        cp.submit(gpu_job(placement=Placement(on_unschedulable="wait")))
        for a in cp.poll_tasks(worker_id):
            try:
                cp.start_task(a.task_id, worker_id=worker_id)
            except Conflict:
                continue
            claimed.append((a.task_id, a.devices))
            cp.finish_task(a.task_id, worker_id=worker_id, state=TaskState.SUCCEEDED, exit_code=0)
    out.put(claimed)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_several_processes_on_one_database_never_double_assign(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    cp = ControlPlane(Store(url))
    workers = [cp.register_worker(cuda_caps(2), cpu_slots=0).id for _ in range(3)]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(url, workers[i], 15, out)) for i in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    claimed = [task for r in results for task in r]
    assert len(claimed) == len({t for t, _ in claimed})
    with cp.store.read() as s:
        from sqlmodel import select

        from gpulayer.store import TaskRow

        tasks = s.exec(select(TaskRow)).all()
    per_job: dict[str, int] = {}
    for t in tasks:
        per_job[t.job_id] = per_job.get(t.job_id, 0) + 1
    assert set(per_job.values()) == {1}, "one task per job per attempt"
    assert len(per_job) <= 45
    # drain whatever is still queued and check nothing was granted twice at any moment
    active = [t for t in tasks if t.state in ("assigned", "running")]
    grants = [(t.worker_id, d) for t in active for d in json.loads(t.devices)]
    assert len(grants) == len(set(grants))


def test_heartbeat_reports_are_safe_to_read_while_written_and_are_pruned(tmp_path: Path) -> None:
    """Heartbeat batches write what each worker runs while reconciliation reads it on other
    threads (the server does both); a worker gone silent leaves no entry behind."""
    import threading

    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    clock = Clock()
    cp = ControlPlane(store, heartbeat_timeout=10.0, clock=clock)
    ids = [cp.register_worker(make_capabilities(), cpu_slots=1).id for _ in range(40)]
    failures: list[BaseException] = []
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.is_set():
                for i in range(0, len(ids), 7):
                    cp.heartbeats({w: [] for w in ids[i:i + 7]})
        except BaseException as exc:  # pragma: no cover - what the test is for
            failures.append(exc)

    def reconcile() -> None:
        try:
            for i in range(300):
                # every other pass looks from past the timeout: it prunes every entry while
                # the heartbeat threads add them back
                cp._reconcile(clock.now + (11 if i % 2 else 0))
        except BaseException as exc:  # pragma: no cover
            failures.append(exc)

    threads = [threading.Thread(target=beat) for _ in range(2)] + [threading.Thread(target=reconcile)]
    for t in threads:
        t.start()
    threads[-1].join(120)
    stop.set()
    for t in threads:
        t.join(60)
    assert failures == []
    cp.heartbeats({w: [] for w in ids})
    assert len(cp._reports) == len(ids)
    clock.now += 11  # every worker is silent for longer than the timeout
    cp._reconcile(clock.now)
    assert cp._reports == {}
    store.dispose()


def test_log_text_is_stored_faithfully_on_every_database(cp: ControlPlane) -> None:
    """PostgreSQL's text cannot hold NUL: such chunks are stored quoted and come back as
    written; lone surrogates (not encodable) become U+FFFD; neighbours are unaffected."""
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["x"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    chunks = [("stdout", "before\n"), ("stdout", "a\x00b\n"), ("stderr", "\ue000looks quoted\n"),
              ("stdout", "bad \ud800 half\n"), ("stdout", "after\n")]
    cp.append_logs(a.task_id, worker_id=w.id, chunks=chunks)  # type: ignore[arg-type]
    assert [(c.stream, c.data) for c in cp.logs(job.id)] == [
        ("stdout", "before\n"), ("stdout", "a\x00b\n"), ("stderr", "\ue000looks quoted\n"),
        ("stdout", "bad \ufffd half\n"), ("stdout", "after\n")]


def test_a_result_over_the_limit_is_refused_naming_the_function_and_the_limit(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer.specs import FunctionJob

    monkeypatch.setenv("GPULAYER_MAX_RESULT_MB", "0.001")  # 1048 bytes
    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(FunctionJob(function="pkg.mod:make"))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    with pytest.raises(InvalidInput) as e:
        cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0, result="x" * 5000)
    assert str(e.value) == ("the result of pkg.mod:make is 5002 bytes of JSON, over the limit of 0.001 MB "
                            "(GPULAYER_MAX_RESULT_MB); return a path or a URL to large data instead")
    assert cp.get_job(job.id).state is JobState.RUNNING  # nothing was written
    cp.finish_task(a.task_id, worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0, result="small")
    assert cp.get_job(job.id).result == "small"


def test_a_result_given_as_its_json_text_is_stored_as_it_is_within_the_same_limit(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a worker reports for a function that returned: the runner's JSON text, stored
    without being parsed and written again; read back as the value."""
    from gpulayer.api import ResultJSON
    from gpulayer.specs import FunctionJob

    monkeypatch.setenv("GPULAYER_MAX_RESULT_MB", "0.001")  # 1048 bytes
    w = cp.register_worker(make_capabilities(), cpu_slots=2)
    big, small = (cp.submit(FunctionJob(function="pkg.mod:make")) for _ in range(2))
    tasks = {t.job_id: t.task_id for t in cp.poll_tasks(w.id)}
    for job in (big, small):
        cp.start_task(tasks[job.id], worker_id=w.id)
    with pytest.raises(InvalidInput, match=r"^the result of pkg.mod:make is 5002 bytes of JSON, over the limit"):
        cp.finish_task(tasks[big.id], worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0,
                       result=ResultJSON('"' + "x" * 5000 + '"'))
    text = '{"a": [1, 2.5, null, true], "b": "caf\\u00e9 \\ud83d\\ude00"}'
    cp.finish_task(tasks[small.id], worker_id=w.id, state=TaskState.SUCCEEDED, exit_code=0, result=ResultJSON(text))
    assert cp.get_job(small.id).result == {"a": [1, 2.5, None, True], "b": "caf\u00e9 \U0001f600"}


def test_arguments_are_stored_apart_and_capped(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """Placement never reads a function's arguments; too many or too large are refused at
    submit, in bounded time, naming the function and the limit."""
    from gpulayer.errors import InvalidArgument
    from gpulayer.specs import FunctionJob
    from gpulayer.store import JobRow

    cp.register_worker(make_capabilities(), cpu_slots=0)  # nothing runs: the jobs stay queued
    wait = Placement(on_unschedulable="wait")
    job = cp.submit(FunctionJob(function="m:f", args=[1, [2, 3]], kwargs={"k": "v"}, placement=wait))
    with cp.store.read() as s:
        row = s.get(JobRow, job.id)
        assert row is not None and '"args":[]' in row.spec.replace(" ", "") and row.args is not None
    assert cp.get_job(job.id).spec.args == [1, [2, 3]]  # type: ignore[union-attr]
    monkeypatch.setenv("GPULAYER_MAX_ARGS_VALUES", "1000")
    with pytest.raises(InvalidArgument, match=r"arguments of m:f: more than 1000 values \(GPULAYER_MAX_ARGS_VALUES\)"):
        cp.submit(FunctionJob(function="m:f", args=[list(range(2000))], placement=wait))
    monkeypatch.setenv("GPULAYER_MAX_ARGS_MB", "0.001")
    with pytest.raises(InvalidArgument, match=r"arguments of m:f: \d+ bytes of JSON, over the limit of 0.001 MB"):
        cp.submit(FunctionJob(function="m:f", args=["x" * 2000], placement=wait))
    assert len(cp.list_jobs()) == 1


def test_a_placement_pass_that_fails_is_undone_alone_and_the_submit_is_kept(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0)
    real_assign = placement.assign

    def assign_then_fail(*args: Any, **kwargs: Any) -> Any:
        real_assign(*args, **kwargs)  # the task row and the job's new state are written...
        raise RuntimeError("a bug in the pass")  # ...and then the pass fails

    monkeypatch.setattr(placement, "assign", assign_then_fail)
    job = cp.submit(gpu_job())
    # the job is stored, as submitted; nothing of the pass is left (no task, still attempt 0)
    assert (job.state, job.attempt, job.tasks) == (JobState.QUEUED, 0, [])
    assert [e.kind for e in cp.events(job.id)] == ["submitted"]
    assert cp.poll_tasks(w.id) == []
    monkeypatch.setattr(placement, "assign", real_assign)
    cp.schedule()  # the next pass places it
    placed = cp.get_job(job.id)
    assert (placed.state, placed.attempt, len(placed.tasks)) == (JobState.ASSIGNED, 1, 1)
    assert [a.job_id for a in cp.poll_tasks(w.id)] == [job.id]


def test_submit_answers_with_the_job_as_stored(cp: ControlPlane) -> None:
    """The record a submit returns is what later reads return (the arguments as JSON stored
    them), not the caller's own spec object."""
    from gpulayer.specs import FunctionJob

    cp.register_worker(make_capabilities(), cpu_slots=0)  # nothing runs: it stays queued
    spec = FunctionJob(function="m:f", args=[(1, 2)], kwargs={"k": (3,)}, placement=Placement(on_unschedulable="wait"))
    job = cp.submit(spec)
    assert job.spec is not spec
    assert job.spec.args == [[1, 2]] and job.spec.kwargs == {"k": [3]}  # type: ignore[union-attr]
    assert job == cp.get_job(job.id)


def test_a_page_of_logs_ends_with_the_chunk_that_fills_its_text_on_every_database(cp: ControlPlane) -> None:
    """Read as a stream (a server-side cursor on PostgreSQL): the chunks after the one that
    brings a page's text to LOG_PAGE_TEXT are left for the next page."""
    from gpulayer.api import LOG_PAGE_TEXT, log_page_cut

    w = cp.register_worker(make_capabilities(), cpu_slots=1)
    job = cp.submit(CommandJob(command=["x"]))
    [a] = cp.poll_tasks(w.id)
    cp.start_task(a.task_id, worker_id=w.id)
    half = LOG_PAGE_TEXT // 2
    cp.append_logs(a.task_id, worker_id=w.id, chunks=[("stdout", str(i) * half) for i in range(5)])
    pages, after = [], 0
    while True:
        page = cp.logs(job.id, after=after)
        pages.append([c.data[0] for c in page])
        if not log_page_cut(page):
            break
        after = page[-1].id
    assert pages == [["0", "1"], ["2", "3"], ["4"]]
    assert [len(c.data) for c in cp.logs(job.id, after=0, limit=1)] == [half]  # the count limit still holds
