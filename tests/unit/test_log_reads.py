"""Reading one job's output from a database where most of the output is other jobs': every
read of a job's chunks (a page from anywhere, of one node, ``--tail``, a follower's look past
the last) reads that job's rows in the order of the index of ``(job_id, id)`` (schema 15),
never the primary key past other jobs' rows, on every database; and the step from schema 14
gives an older database that index (``bench/log_reads.py`` measures what it saves)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect, text

from gpulayer import embedded_reads
from gpulayer.control import ControlPlane
from gpulayer.records import TaskState
from gpulayer.specs import CommandJob
from gpulayer.store import Store, migrations
from tests.factories import make_capabilities

#: the index a job's chunks are read in (schema 15), and the one of schema 14 it replaced
INDEX, OLD_INDEX = "ix_gl_logs_job_id_id", "ix_gl_logs_job_id"


def interleaved(cp: ControlPlane, chunks: int = 30, between: int = 100) -> tuple[str, list[str]]:
    """A job whose task wrote ``chunks`` chunks, ``between`` chunks of another job's before
    each, and as many again after its last (its job went on): its id and its chunks' text. The
    statistics are brought up to date (ANALYZE), as they would be by the time anyone reads."""
    w = cp.register_worker(make_capabilities(), cpu_slots=2).id
    job, other = cp.submit(CommandJob(command=["x"])).id, cp.submit(CommandJob(command=["y"])).id
    tasks = {a.job_id: a.task_id for a in cp.poll_tasks(w)}
    for task in tasks.values():
        cp.start_task(task, worker_id=w)
    written = [f"step {k} loss 0.{k:04d}\n" for k in range(chunks)]
    for k, line in enumerate(written):
        cp.append_logs(tasks[other], worker_id=w, chunks=[("stdout", f"other {k}.{i}\n") for i in range(between)])
        cp.append_logs(tasks[job], worker_id=w, chunks=[("stdout", line)])
    cp.finish_task(tasks[job], worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
    cp.append_logs(tasks[other], worker_id=w, chunks=[("stdout", f"later {i}\n") for i in range(chunks * between)])
    with cp.store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    return job, written


def log_indexes(store: Store) -> dict[str, tuple[str, ...]]:
    return {ix["name"]: tuple(c or "" for c in ix["column_names"]) for ix in inspect(store.engine).get_indexes("gl_logs")
            if ix["name"] is not None}


def test_every_read_of_a_job_s_output_reads_its_own_rows_in_the_order_of_its_index(cp: ControlPlane) -> None:
    job, written = interleaved(cp)
    ran: list[tuple[str, Any, bool]] = []  # (statement, its parameters, whether a server-side cursor ran it)

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "FROM gl_logs" in statement:
            ran.append((statement, parameters, type(cursor).__name__ == "ServerCursor"))

    event.listen(cp.store.engine, "before_cursor_execute", seen)
    ids = [c.id for c in cp.logs(job)]
    # what each read gives is the job's own output, as written
    assert [c.data for c in cp.logs(job)] == written
    assert [c.data for c in cp.logs(job, after=ids[14])] == written[15:]
    assert [c.data for c in cp.logs(job, node=0)] == written
    assert "".join(c.data for c in cp.logs(job, tail=3)) == "".join(written[-3:])
    assert cp.logs(job, after=ids[-1]) == []
    event.remove(cp.store.engine, "before_cursor_execute", seen)
    assert len(ran) >= 6, ran
    if cp.store.is_sqlite:
        path = cp.store.engine.url.database
        assert path is not None
        db = sqlite3.connect(path)
        # (and the CLI's own read of an embedded home: the chunks from the start, then --tail 3)
        db.set_trace_callback(lambda statement: ran.append((statement, (), False)) if "FROM gl_logs" in statement else None)
        for tail in (None, 3):
            got = embedded_reads.job_logs(db, job, None, tail=tail)[1]
            assert "".join(text for _, _, text in got) == "".join(written[-3:] if tail else written)
        db.set_trace_callback(None)
        for statement, parameters, _ in ran:
            plan = " / ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {statement}", parameters))
            assert f"USING INDEX {INDEX} (job_id=? AND" in plan and "TEMP B-TREE" not in plan, (statement, plan)
        db.close()
        return
    # PostgreSQL plans a statement psycopg prepared (from its 6th run) once for any job, which
    # may read the primary key: each read is a server-side cursor (never prepared), and its
    # plan as one reads the job's rows alone
    for statement, parameters, server_side in ran:
        assert server_side, statement
        with cp.store.engine.begin() as conn:
            plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN DECLARE gl_plan CURSOR FOR {statement}",
                                                                 parameters))
        assert f"using {INDEX} on gl_logs" in plan and "gl_logs_pkey" not in plan, (statement, plan)


def test_schema_15_gives_a_database_of_schema_14_the_index_of_a_new_one(store_url: str, tmp_path: Path) -> None:
    """The index of (job_id, id) replaces that of job_id alone, which it begins with (a job's
    deletion finds its chunks with it), and the output stored before reads the same."""
    store = Store(store_url)
    cp = ControlPlane(store)
    job, written = interleaved(cp, chunks=5, between=3)
    new = log_indexes(store)
    assert new[INDEX] == ("job_id", "id") and OLD_INDEX not in new
    with store.engine.begin() as conn:  # the output's indexes as schema 14 had them
        for statement in (f"DROP INDEX {INDEX}", f"CREATE INDEX {OLD_INDEX} ON gl_logs (job_id)",
                          "UPDATE gl_schema SET version = 14"):
            conn.execute(text(statement))
    store.dispose()
    migrated = Store(store_url)
    assert migrated.schema_version() == migrations.SCHEMA_VERSION == 15 and log_indexes(migrated) == new
    cp = ControlPlane(migrated)
    assert [c.data for c in cp.logs(job)] == written
    assert "".join(c.data for c in cp.logs(job, tail=2)) == "".join(written[-2:])
    cp.prune_jobs(older_than=0)  # (the jobs and their output go, found by the new index)
    with migrated.engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT count(*) FROM gl_logs WHERE job_id = '{job}'").scalar() == 0
    migrated.dispose()
