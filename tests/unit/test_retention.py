"""Deleting ended jobs (:mod:`gpulayer.control.retention`): by id, by age, on a schedule
(``GPULAYER_KEEP_JOBS``), with the bundles no job names any more; on SQLite and PostgreSQL
(the ``cp`` fixture), through a server's routes (a client token's own jobs only), and a
client that uploads a bundle again when it was deleted since it uploaded it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, inspect, select, update
from starlette.testclient import TestClient

from gpulayer import bundles, config
from gpulayer.client import Client
from gpulayer.control import ControlPlane, retention
from gpulayer.errors import BundleMissing, InvalidInput
from gpulayer.http_client import connect_http
from gpulayer.records import JobState, TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, migrations
from gpulayer.store import retention as store_retention
from gpulayer.store.tables import BundleReaderRow, BundleRow, EventRow, JobRow, LogRow, TaskRow
from tests.factories import Clock, cuda_caps, gpu_job

WAIT = Placement(on_unschedulable="wait")


def _run(cp: ControlPlane, worker: str, state: TaskState = TaskState.SUCCEEDED, owner: str | None = None,
         **spec: object) -> str:
    """A job of ``owner`` that ran on ``worker``, printed a line and ended in ``state``."""
    job = cp.submit(gpu_job(**spec), owner=owner)  # type: ignore[arg-type]
    (a,) = cp.poll_tasks(worker)
    cp.start_task(a.task_id, worker_id=worker)
    cp.append_logs(a.task_id, worker_id=worker, chunks=[("stdout", "hello\n")])
    cp.finish_task(a.task_id, worker_id=worker, state=state, exit_code=0 if state is TaskState.SUCCEEDED else 1)
    return job.id


def _rows(cp: ControlPlane, table: type, **where: str) -> int:
    with cp.store.read() as s:
        q = select(func.count()).select_from(table)
        for column, value in where.items():
            q = q.where(getattr(table, column) == value)
        return int(s.execute(q).scalar_one())


def _bundle(tmp_path: Path, text: str) -> bundles.Bundle:
    folder = tmp_path / f"proj-{abs(hash(text))}"
    folder.mkdir()
    (folder / "main.py").write_text(text)
    return bundles.build_bundle(str(folder))


def test_delete_removes_ended_jobs_with_their_tasks_output_and_events_and_leaves_others(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    done = _run(cp, w)
    failed = _run(cp, w, TaskState.FAILED)
    running = cp.submit(gpu_job())
    queued = cp.submit(gpu_job(placement=WAIT))
    (a,) = cp.poll_tasks(w)
    cp.start_task(a.task_id, worker_id=w)
    assert _rows(cp, LogRow, job_id=done) == 1 and _rows(cp, EventRow, job_id=done) > 0

    got = cp.delete_jobs([running.id, done, "job-000000000000", queued.id, failed, done])

    assert got.deleted == [done, failed]  # in the order given, each once
    assert got.not_ended == {running.id: JobState.RUNNING, queued.id: JobState.QUEUED}
    for job_id in (done, failed):
        assert [_rows(cp, t, job_id=job_id) for t in (TaskRow, LogRow, EventRow)] == [0, 0, 0]
        assert _rows(cp, JobRow, id=job_id) == 0
    assert cp.get_job(running.id).state is JobState.RUNNING and cp.get_job(queued.id).state is JobState.QUEUED
    assert {j.id for j in cp.list_jobs()} == {queued.id, running.id}
    # the running job's task still reports as usual; the queue still moves
    cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    assert [x.job_id for x in cp.poll_tasks(w)] == [queued.id]


def test_an_owner_deletes_only_its_own_jobs(cp: ControlPlane) -> None:
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    mine, theirs = _run(cp, w), _run(cp, w)
    with cp.store.write() as s:
        for job_id, owner in ((mine, "tok-a"), (theirs, "tok-b")):
            row = s.get(JobRow, job_id)
            assert row is not None
            row.owner = owner
    assert cp.delete_jobs([theirs, mine], owner="tok-a").deleted == [mine]
    assert cp.get_job(theirs).state is JobState.SUCCEEDED
    assert cp.prune_jobs(older_than=0, owner="tok-a").jobs == 0
    assert cp.prune_jobs(older_than=0, owner="tok-b").jobs == 1


def test_prune_deletes_by_end_time_and_state_in_batches(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = cp.clock
    assert isinstance(clock, Clock)
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    old_ok = [_run(cp, w) for _ in range(5)]
    old_failed = _run(cp, w, TaskState.FAILED)
    clock.now += 5 * 86400
    long_running = cp.submit(gpu_job())  # submitted now, ends a day later: its end is what counts
    (a,) = cp.poll_tasks(w)
    cp.start_task(a.task_id, worker_id=w)
    clock.now += 86400
    cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    clock.now += 3600
    recent = _run(cp, w)
    cp.heartbeat(w)  # (the worker stays online as the clock moves)
    monkeypatch.setattr(retention, "BATCH", 2)

    assert cp.prune_jobs(older_than=3 * 86400, dry_run=True).model_dump() == {"jobs": 6, "bundles": 0, "dry_run": True}
    assert _rows(cp, JobRow) == 8  # a dry run deletes nothing
    assert cp.prune_jobs(older_than=3 * 86400, states=["failed"]).jobs == 1
    assert cp.prune_jobs(older_than=3 * 86400).jobs == 5  # over three batches of two
    assert {j.id for j in cp.list_jobs()} == {long_running.id, recent}
    assert cp.prune_jobs(older_than=1800).jobs == 1  # ended a day and an hour ago
    assert [j.id for j in cp.list_jobs()] == [recent]
    assert not set(old_ok + [old_failed]) & {j.id for j in cp.list_jobs()}


def test_output_goes_a_bounded_number_of_chunks_a_transaction(cp: ControlPlane,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that prints ships a chunk every 0.1 s: 500 jobs of 4,000 chunks each were one
    transaction that held the writers' lock for 4.4 s (SQLite). Their output goes first,
    LOG_BATCH chunks a transaction; the jobs then, with what is left."""
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    jobs = []
    for _ in range(3):
        job = cp.submit(gpu_job())
        (a,) = cp.poll_tasks(w)
        cp.start_task(a.task_id, worker_id=w)
        for n in range(7):
            cp.append_logs(a.task_id, worker_id=w, chunks=[("stdout", f"step {n}\n")])
        cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
        jobs.append(job.id)
    monkeypatch.setattr(retention, "LOG_BATCH", 4, raising=False)
    deleted: list[int] = []

    def seen(_conn: object, cursor: Any, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM GL_LOGS"):
            deleted.append(cursor.rowcount)

    event.listen(cp.store.engine, "after_cursor_execute", seen)
    try:
        assert cp.delete_jobs(jobs[:1]).deleted == jobs[:1]
        assert max(deleted) == 4 and sum(deleted) == 7
        deleted.clear()
        cp.clock.now += 60  # type: ignore[attr-defined]
        assert cp.prune_jobs(older_than=30).jobs == 2
        assert max(deleted) == 4 and sum(deleted) == 14
    finally:
        event.remove(cp.store.engine, "after_cursor_execute", seen)
    assert _rows(cp, LogRow) == 0 == _rows(cp, JobRow)


def test_a_job_deleted_by_another_meanwhile_is_not_said_to_be_running(cp: ControlPlane,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Between choosing the ended jobs and deleting them (their output goes first, in
    transactions of its own), another delete or a prune may take one: it is left out of the
    answer (no such job), not named as a job that has not ended."""
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    first, second = _run(cp, w), _run(cp, w)
    output = retention._delete_output

    def meanwhile(plane: ControlPlane, job_ids: list[str]) -> None:
        output(plane, job_ids)
        with plane.store.write() as s:
            store_retention.delete_jobs(s, [second])

    monkeypatch.setattr(retention, "_delete_output", meanwhile)
    got = cp.delete_jobs([first, second])
    assert (got.deleted, got.not_ended) == ([first], {})


def test_a_cancel_of_many_leaves_out_a_job_deleted_meanwhile(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel of many jobs reads their records after its transaction: an ended one that a
    prune deleted in between made the whole call NotFound (found while two servers shared a
    database: one cancelled and the other pruned), though the others were cancelled. It is
    left out, as an id that names no job is."""
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    done = _run(cp, w)
    queued = cp.submit(gpu_job(placement=WAIT))
    cancelled = cp._cancelled

    def meanwhile(*args: Any, **kwargs: Any) -> None:
        cancelled(*args, **kwargs)
        cp.delete_jobs([done])

    monkeypatch.setattr(cp, "_cancelled", meanwhile)
    assert [(j.id, j.state) for j in cp.cancel_many([done, queued.id])] == [(queued.id, JobState.CANCELLED)]


@pytest.mark.parametrize(("states", "older_than", "message"), [
    (["running"], 0, "states ['running']: accepted: one or more of the ended states succeeded, failed"),
    ([], 0, "states []: accepted"),
    (None, -1, "older_than -1: accepted: a number of seconds >= 0"),
    (None, float("nan"), "older_than nan: accepted"),
])
def test_prune_refuses_what_it_cannot_take(cp: ControlPlane, states: list[str] | None, older_than: float,
                                           message: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        cp.prune_jobs(older_than=older_than, states=states)
    assert str(exc.value).startswith(message)


def test_bundles_go_once_no_stored_job_names_them(cp: ControlPlane, tmp_path: Path) -> None:
    clock = cp.clock
    assert isinstance(clock, Clock)
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    shared, alone, unused, fresh = (_bundle(tmp_path, t) for t in ("a = 1\n", "b = 2\n", "c = 3\n", "d = 4\n"))
    for b in (shared, alone, unused):
        cp.put_bundle(b.digest, b.data, owner="tok-a")
    first = _run(cp, w, owner="tok-a", bundle_digest=shared.digest)
    _run(cp, w, owner="tok-a", bundle_digest=shared.digest)
    only = _run(cp, w, owner="tok-a", bundle_digest=alone.digest)
    clock.now += 7200
    cp.heartbeat(w)
    cp.put_bundle(fresh.digest, fresh.data)  # stored after the cut: not the prune's, used or not

    cp.delete_jobs([first, only])  # the bundle only deleted jobs named goes with them
    assert _rows(cp, BundleRow, digest=alone.digest) == 0 == _rows(cp, BundleReaderRow, digest=alone.digest)
    assert _rows(cp, BundleRow, digest=shared.digest) == 1  # another job names it
    assert _rows(cp, BundleRow, digest=unused.digest) == 1  # a delete removes only its jobs' bundles

    assert cp.prune_jobs(older_than=3600, owner="tok-a").model_dump() == {"jobs": 1, "bundles": 0, "dry_run": False}
    assert _rows(cp, BundleRow) == 3  # a client's prune leaves bundles to the admin's
    assert cp.prune_jobs(older_than=3600).bundles == 2  # shared (its last job went) and unused
    with cp.store.read() as s:
        assert [d for (d,) in s.execute(select(BundleRow.digest))] == [fresh.digest]
    with pytest.raises(BundleMissing, match="upload it first"):
        cp.submit(gpu_job(bundle_digest=shared.digest))


def test_whether_a_stored_job_names_a_bundle_is_an_index_lookup(cp: ControlPlane, tmp_path: Path) -> None:
    """The bundle pass of a delete or a prune read every stored job's spec for its bundle
    (a search of their text per bundle, or one pass over them all): 0.6 s for 200,000 kept
    jobs on PostgreSQL, in the write transaction. Each job's bundle is a column of its own
    now, indexed: no statement of a delete or a prune reads all the jobs (no full scan of
    ``gl_jobs`` in its plan, with the planner told to avoid one where it can), whatever the
    number of bundles asked about."""
    clock = cp.clock
    assert isinstance(clock, Clock)
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    made = [_bundle(tmp_path, f"n = {i}\n") for i in range(12)]
    for b in made:
        cp.put_bundle(b.digest, b.data)
    kept = [_run(cp, w, bundle_digest=b.digest) for b in made[:4]]
    gone = [_run(cp, w, bundle_digest=b.digest) for b in made[4:8]]
    clock.now += 7200
    cp.heartbeat(w)
    statements: list[tuple[str, Any]] = []

    def seen(_conn: object, _cursor: object, statement: str, parameters: Any, *_: object) -> None:
        if "gl_jobs" in statement:
            statements.append((statement, parameters))

    event.listen(cp.store.engine, "before_cursor_execute", seen)
    try:
        assert cp.delete_jobs(gone[:1]).deleted == gone[:1]
        assert cp.delete_jobs(gone[1:]).deleted == gone[1:]
        assert _rows(cp, BundleRow) == 8  # their 4 bundles went
        # the 4 no job ever named go; those of the kept jobs stay
        assert cp.prune_jobs(older_than=3600, states=["failed"]).model_dump() == {
            "jobs": 0, "bundles": 4, "dry_run": False}
    finally:
        event.remove(cp.store.engine, "before_cursor_execute", seen)
    with cp.store.read() as s:
        assert {d for (d,) in s.execute(select(BundleRow.digest))} == {b.digest for b in made[:4]}
    assert {j.id for j in cp.list_jobs()} == set(kept)
    assert any("bundle_digest" in q for q, _ in statements), statements  # (the pass was seen)
    with cp.store.engine.begin() as conn:
        for statement, parameters in statements:
            assert not _reads_all_jobs(conn, statement, parameters), statement


def _reads_all_jobs(conn: Any, statement: str, parameters: Any) -> list[str]:
    """The steps of ``statement``'s plan that read all of ``gl_jobs`` (its table or one of its
    indexes, whole): SQLite's ``SCAN gl_jobs``; PostgreSQL's scans of it without an index
    condition, the planner told to avoid a sequential scan where it can (it reads a table
    this small whole otherwise)."""
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)
        return [str(r[-1]) for r in rows if str(r[-1]).startswith("SCAN gl_jobs")]
    conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
    (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).one()
    out: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "gl_jobs" and node["Node Type"] != "ModifyTable" and not (
                "Index Cond" in node or "Recheck Cond" in node):
            out.append(f"{node['Node Type']} on gl_jobs")
        for child in node.get("Plans", []):
            walk(child)

    walk((json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"])
    return out


def test_a_client_uploads_a_deleted_bundle_again(gpulayer_isolated: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK uploads a bundle once per client; a prune may delete it meanwhile (no stored
    job named it): the next submit is refused with BundleMissing, and the client uploads it
    again and submits (one job, under the same idempotency key)."""
    from gpulayer.client import connect

    monkeypatch.setattr(retention, "FRESH", 0.0)  # (bundles stored a moment ago go too)
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "main.py").write_text("print('hi')\n")
    client = connect()
    spec = CommandJob(command=["python", "main.py"], bundle=str(folder), placement=Placement(target="remote", on_unschedulable="wait"))
    first = client.submit(spec)
    assert client.control is not None
    client.control.cancel(first.id)
    assert client.control.prune_jobs(older_than=0).model_dump() == {"jobs": 1, "bundles": 1, "dry_run": False}

    again = client.submit(spec)
    assert client.control.get_job(again.id).spec.bundle_digest == first.spec.bundle_digest
    assert client.api.has_bundle(str(first.spec.bundle_digest))
    many = client.submit_many([spec, spec])
    client.control.cancel_many([again.id, *(j.id for j in many)])
    client.control.prune_jobs(older_than=0)
    assert [j.spec.bundle_digest for j in client.submit_many([spec, spec])] == [first.spec.bundle_digest] * 2


def test_a_bundle_stored_a_moment_ago_outlives_a_prune(gpulayer_isolated: None, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Uploading a bundle and submitting the job that names it are two calls. A prune came
    between them, so the SDK uploaded the bundle again, and a second prune deleted that
    upload before the second submit: BundleMissing reached the user. Two servers on one
    PostgreSQL database, with `prune_jobs(older_than=0)` running in a loop, did this to 2
    of 1,011 submits. A bundle stored in the last FRESH seconds is kept."""
    from gpulayer.client import connect

    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "main.py").write_text("print('hi')\n")
    client = connect()
    assert client.control is not None
    control = client.control
    spec = CommandJob(command=["python", "main.py"], bundle=str(folder), placement=Placement(target="remote", on_unschedulable="wait"))
    first = client.submit(spec)
    control.cancel(first.id)
    with control.store.write() as s:  # stored long ago (and held by the client since)
        s.execute(update(BundleRow).values(created_at=BundleRow.created_at - 2 * retention.FRESH))
    submit = control.submit

    def pruned_first(*args: Any, **kwargs: Any) -> Any:  # a prune just before each submit arrives
        control.prune_jobs(older_than=0)
        return submit(*args, **kwargs)

    monkeypatch.setattr(control, "submit", pruned_first)
    again = client.submit(spec)  # deleted, uploaded again, and the second prune leaves it
    assert control.get_job(again.id).spec.bundle_digest == first.spec.bundle_digest
    monkeypatch.setattr(control, "submit", submit)
    control.cancel(again.id)
    assert control.delete_jobs([again.id]).deleted == [again.id]
    assert client.api.has_bundle(str(first.spec.bundle_digest))  # (a delete leaves it as well)
    control.clock = lambda: time.time() + retention.FRESH + 1
    assert control.prune_jobs(older_than=0).bundles == 1


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient]]:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        yield control, tc


def test_the_routes_delete_the_callers_own_jobs(served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    tokens = [control.create_token(scope="client").token for _ in range(2)]
    a, b = (connect_http("http://testserver", token=t, retry_for=0.5, transport=tc._transport) for t in tokens)
    spec = gpu_job(placement=Placement(target="remote", on_unschedulable="wait"))
    mine, theirs, queued = a.submit(spec), b.submit(spec), a.submit(spec)
    a.cancel(mine.id)
    b.cancel(theirs.id)

    got = a.delete_jobs([theirs.id, mine.id, queued.id])
    assert got.deleted == [mine.id] and got.not_ended == {queued.id: JobState.QUEUED}  # another's: left out
    assert control.get_job(theirs.id).state is JobState.CANCELLED
    assert a.prune_jobs(older_than=0).jobs == 0 and b.prune_jobs(older_than=0, dry_run=True).jobs == 1
    assert b.prune_jobs(older_than=0, states=["cancelled"]).jobs == 1
    auth = {"authorization": f"Bearer {tokens[0]}"}
    for path, body, word in (("/v1/jobs/delete", {"job_ids": []}, "job_ids"),
                             ("/v1/jobs/delete", {"job_ids": "job-x"}, "job_ids"),
                             ("/v1/jobs/prune", {}, "older_than"),
                             ("/v1/jobs/prune", {"older_than": -1}, "older_than"),
                             ("/v1/jobs/prune", {"older_than": 0, "states": ["running"]}, "states"),
                             ("/v1/jobs/prune", {"older_than": 0, "dry_run": "yes"}, "dry_run")):
        bad = tc.post(path, headers=auth, json=body)
        assert bad.status_code in (400, 422) and word in bad.text, (body, bad.text)
    assert control.get_job(queued.id).state is JobState.QUEUED


def test_keep_jobs_prunes_on_a_schedule_where_heartbeats_are_heard(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = cp.clock
    assert isinstance(clock, Clock)
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    old = _run(cp, w)
    clock.now += 2 * 86400
    recent = _run(cp, w)
    ran = threading.Event()
    real = retention.prune_jobs
    monkeypatch.setattr(retention, "prune_jobs", lambda *a: (ran.set(), real(*a))[1])

    cp.heartbeat(w)
    time.sleep(0.05)
    assert not ran.is_set()  # unset: every job is kept

    monkeypatch.setenv("GPULAYER_KEEP_JOBS", "1d")
    clock.now += 60  # (the heartbeats' housekeeping runs once per third of the timeout)
    cp.heartbeat(w)
    assert ran.wait(10)
    deadline = time.monotonic() + 10
    while _rows(cp, JobRow, id=old) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [j.id for j in cp.list_jobs()] == [recent]
    ran.clear()
    clock.now += 60
    cp.heartbeat(w)
    time.sleep(0.05)
    assert not ran.is_set()  # at most every retention.EVERY seconds


@pytest.mark.parametrize(("raw", "message"), [
    ("abc", "GPULAYER_KEEP_JOBS='abc': expected a number with an optional unit s, m, h or d"),
    ("0", "GPULAYER_KEEP_JOBS='0': expected more than 0 seconds"),
    ("-1d", "GPULAYER_KEEP_JOBS='-1d': expected more than 0 seconds"),
])
def test_keep_jobs_refuses_what_is_not_a_duration(monkeypatch: pytest.MonkeyPatch, raw: str, message: str) -> None:
    monkeypatch.setenv("GPULAYER_KEEP_JOBS", raw)
    with pytest.raises(InvalidInput) as exc:
        config.settings()
    assert str(exc.value).startswith(message)
    monkeypatch.setenv("GPULAYER_KEEP_JOBS", "30d")
    assert config.settings().keep_jobs == 30 * 86400


def test_a_client_of_a_server_without_the_routes_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer import api as api_mod
    from gpulayer.errors import MethodNotAllowed

    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'old.db'}"), heartbeat_timeout=30)
    monkeypatch.setattr(api_mod, "ROUTES", tuple(r for r in api_mod.ROUTES if r.op not in ("delete_jobs", "prune_jobs")))
    with TestClient(create_app(control, background=False)) as tc:
        token = control.create_token(scope="client").token
        client = Client(connect_http("http://testserver", token=token, retry_for=0.5, transport=tc._transport),
                        location="http://testserver", default_target="remote")
        with pytest.raises(MethodNotAllowed):
            client.api.delete_jobs(["job-000000000000"])


def test_the_migration_from_schema_10_fills_the_jobs_bundle_column(store_url: str, tmp_path: Path) -> None:
    """Jobs stored before schema 11 name their bundle in their spec alone: the migration
    copies it to the new column, so that their bundles are kept while they are and go with
    them after."""
    clock = Clock()
    store = Store(store_url)
    cp = ControlPlane(store, heartbeat_timeout=10.0, clock=clock)
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    used, alone = _bundle(tmp_path, "a = 1\n"), _bundle(tmp_path, "b = 2\n")
    for b in (used, alone):
        cp.put_bundle(b.digest, b.data)
    stays = _run(cp, w, bundle_digest=used.digest)
    goes = _run(cp, w, bundle_digest=alone.digest)
    plain = _run(cp, w)  # (a job with no bundle)
    with store.engine.begin() as conn:  # back to schema 10: no column, no index
        conn.exec_driver_sql("DROP INDEX ix_gl_jobs_bundle_digest")
        conn.exec_driver_sql("ALTER TABLE gl_jobs DROP COLUMN bundle_digest")
        conn.exec_driver_sql("UPDATE gl_schema SET version = 10")
    store.dispose()
    cp = ControlPlane(Store(store_url), heartbeat_timeout=10.0, clock=clock)
    try:
        assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
        with cp.store.read() as s:
            assert dict(s.execute(select(JobRow.id, JobRow.bundle_digest)).all()) == {  # type: ignore[call-overload]
                stays: used.digest, goes: alone.digest, plain: None}
        clock.now += 7200
        cp.heartbeat(w)
        assert cp.delete_jobs([goes]).deleted == [goes]
        assert cp.prune_jobs(older_than=3600, states=["failed"]).bundles == 0
        with cp.store.read() as s:
            assert [d for (d,) in s.execute(select(BundleRow.digest))] == [used.digest]
    finally:
        cp.store.dispose()


def test_a_database_at_schema_11_from_before_the_bundle_column_gets_it(store_url: str, tmp_path: Path) -> None:
    """Schema 11 came first without ``gl_jobs.bundle_digest`` (68c3ff8, jobs that run after
    others), which a later commit added to the same step: a database that GPUlayer of those
    commits made or migrated is at 11 without it, and the step to 12 left it so: every submit
    then failed on the missing column."""
    clock = Clock()
    store = Store(store_url)
    cp = ControlPlane(store, heartbeat_timeout=10.0, clock=clock)
    w = cp.register_worker(cuda_caps(1), cpu_slots=0).id
    used = _bundle(tmp_path, "a = 1\n")
    cp.put_bundle(used.digest, used.data)
    stays = _run(cp, w, bundle_digest=used.digest)
    with store.engine.begin() as conn:  # schema 11 as 68c3ff8 made it
        conn.exec_driver_sql("DROP INDEX ix_gl_jobs_bundle_digest")
        conn.exec_driver_sql("ALTER TABLE gl_jobs DROP COLUMN bundle_digest")
        conn.exec_driver_sql("ALTER TABLE gl_tasks DROP COLUMN log_chars")
        conn.exec_driver_sql("ALTER TABLE gl_job_after DROP COLUMN any_end")  # (nor that one)
        conn.exec_driver_sql("UPDATE gl_schema SET version = 11")
    store.dispose()
    cp = ControlPlane(Store(store_url), heartbeat_timeout=10.0, clock=clock)
    try:
        assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
        with cp.store.engine.connect() as conn:
            assert "any_end" in {c["name"] for c in inspect(conn).get_columns("gl_job_after")}
        later = _run(cp, w)
        with cp.store.read() as s:
            assert dict(s.execute(select(JobRow.id, JobRow.bundle_digest)).all()) == {  # type: ignore[call-overload]
                stays: used.digest, later: None}
        clock.now += 7200
        cp.heartbeat(w)
        assert cp.prune_jobs(older_than=3600, states=["failed"]).bundles == 0  # (still named)
    finally:
        cp.store.dispose()


@pytest.mark.parametrize(("first", "said_deleted"), [
    ("read error", True),  # (the request reached the server: its answer was lost)
    ("502", True),  # (a proxy's: its server may have carried the request out)
    ("connect error", False),  # (it never reached the server: nothing was deleted then)
    ("503 database_failed", False),  # (our server's: nothing of it was stored)
])
def test_a_delete_sent_again_reads_the_ids_it_finds_gone_as_deleted_when_a_try_may_have_run(
        first: str, said_deleted: bool) -> None:
    """Only where the first try may have been carried out: otherwise an id that names no job
    is still said so (the CLI's "no such job", exit 2)."""
    import httpx

    tries: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        tries.append(request.url.path)
        if len(tries) == 1:
            if first == "read error":
                raise httpx.ReadError("the connection broke", request=request)
            if first == "connect error":
                raise httpx.ConnectError("connection refused", request=request)
            if first == "502":
                return httpx.Response(502, text="bad gateway")
            return httpx.Response(503, json={"error": {"code": "database_failed", "message": "full"}})
        return httpx.Response(200, json={"deleted": [], "not_ended": {"job-000000000003": "running"}})

    api = connect_http("http://testserver", token="t", retry_for=5, transport=httpx.MockTransport(handle))
    answer = api.delete_jobs(["job-000000000001", "job-000000000002", "job-000000000003"])
    assert tries == ["/v1/jobs/delete"] * 2
    assert answer.deleted == (["job-000000000001", "job-000000000002"] if said_deleted else [])
    assert answer.not_ended == {"job-000000000003": JobState.RUNNING}
