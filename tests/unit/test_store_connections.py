"""The connection a thread keeps between its transactions on SQLite (gpulayer.store._Kept):
one connection and session a thread, nothing carried from one transaction to the next, the
pool's bound kept, and the connection given back when the thread ends."""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlmodel import Session, select

from gpulayer.store import JobRow, Store, _Kept, plain


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'kept.db'}")
    yield s
    s.dispose()


def _job(job_id: str) -> plain.Job:
    return plain.Job(id=job_id, kind="command", spec="{}", state="queued", priority=0, created_at=1.0,
                     updated_at=1.0, attempt=0, max_attempts=1, exit_code=None, result=None, error=None,
                     decision=None, cancel_requested=False, idempotency_key=None, owner=None, args=None)


def _driver(s: Session) -> Any:
    return plain._driver(s).driver_connection


def _checked_out(store: Store) -> int:
    return store.engine.pool.checkedout()  # type: ignore[attr-defined,no-any-return]


def test_a_thread_runs_its_transactions_on_one_connection_and_one_session(store: Store) -> None:
    with store.write() as s:
        first, session = _driver(s), s
        plain.insert_job(s, _job("job_a"))
    with store.read() as s:
        assert _driver(s) is first and s is session
        assert plain.job_state(s, "job_a") == "queued"
    with store.write() as s:
        assert _driver(s) is first
    # kept, not given back: one connection out of the pool for this thread
    assert _checked_out(store) == 1


def test_a_kept_connection_begins_a_write_immediate_and_a_read_deferred(store: Store, tmp_path: Path) -> None:
    other = sqlite3.connect(tmp_path / "kept.db", timeout=0, isolation_level=None)
    try:
        for _ in range(2):  # (the connection goes from one kind to the other and back)
            with store.write():
                # the write holds SQLite's write lock from its BEGIN on, before any statement
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("BEGIN IMMEDIATE")
            with store.read() as s:
                plain.job_state(s, "job_a")
                other.execute("BEGIN IMMEDIATE")  # a read does not hold it
                other.execute("ROLLBACK")
    finally:
        other.close()


def test_a_kept_session_carries_nothing_into_the_next_transaction(store: Store) -> None:
    with store.write() as s:
        plain.insert_job(s, _job("job_a"))
        row = s.exec(select(JobRow).where(JobRow.id == "job_a")).one()
        assert row in s
    with store.read() as s:
        assert row not in s and not s.new and not s.dirty  # (closed at the end, as a new one is)
    # a transaction that ended a job and then failed says nothing of it to the next
    with pytest.raises(RuntimeError), store.write() as s:
        plain.note_ended(s, "job_a")
        raise RuntimeError("undone")
    with store.write() as s:
        pass
    assert store.take_ended() == frozenset()
    with store.write() as s:
        plain.note_ended(s, "job_a")
    assert store.take_ended() == {"job_a"}


def test_a_transaction_begun_inside_another_on_the_same_thread_gets_its_own_connection(store: Store) -> None:
    with store.read() as outer:
        with store.write() as inner:
            assert _driver(inner) is not _driver(outer)
            plain.insert_job(inner, _job("job_b"))
        assert _checked_out(store) == 1  # the inner one went back to the pool
    with store.read() as s:
        assert plain.job_state(s, "job_b") == "queued"


def test_only_so_many_threads_keep_one_and_the_others_use_the_pool(store: Store) -> None:
    threads = _Kept.KEPT + 4
    inside = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with store.write() as s:
                plain.insert_job(s, _job(f"job_{i}"))
            with store.read() as s:  # every thread is between transactions here at once
                inside.wait(timeout=30)
                assert plain.job_state(s, f"job_{i}") == "queued"
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not errors
    del workers, t
    gc.collect()
    # the threads ended: their kept connections went back to the pool
    assert _checked_out(store) == 0


def test_a_connection_sqlalchemy_invalidated_is_replaced(store: Store) -> None:
    with store.read() as s:
        first = _driver(s)
    kept = store._kept
    assert kept is not None
    lent = kept.lend(False)
    assert lent is not None
    lent.conn.invalidate()
    with store.read() as s:
        assert _driver(s) is not first
        assert plain.job_state(s, "job_x") is None


def test_dispose_closes_the_kept_connections(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'kept.db'}")
    closed: list[object] = []
    event.listen(store.engine.pool, "close", lambda dbapi, _record: closed.append(dbapi))
    with store.read() as s:
        conn = _driver(s)
    store.dispose()
    assert conn in closed
    with pytest.raises(Exception, match="closed"):
        conn.execute("SELECT 1")


@contextmanager
def writing_elsewhere(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection of its own inside a write transaction on ``path`` (as another process's
    would be), begun without waiting (it fails where another writer holds the lock)."""
    writer = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        writer.execute("BEGIN IMMEDIATE")
        yield writer
        writer.execute("ROLLBACK")
    finally:
        writer.close()


def test_a_store_opens_and_reads_while_another_process_is_inside_a_write(store: Store, tmp_path: Path) -> None:
    """Opening a database whose schema is current takes no write lock: a command opened
    while a process stopped inside a write (a suspended laptop's worker) held it waited for
    SQLite's busy timeout, then failed ("database is locked"), where it only had to read."""
    with store.write() as s:
        plain.insert_job(s, _job("job-a"))
    with writing_elsewhere(tmp_path / "kept.db") as writer:
        writer.execute("UPDATE gl_jobs SET priority = 5")
        opened = Store(f"sqlite:///{tmp_path / 'kept.db'}")
        try:
            with opened.read() as s:
                assert [(j.id, j.priority) for j in s.exec(select(JobRow))] == [("job-a", 0)]
        finally:
            opened.dispose()


@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
def test_a_ctrl_c_between_begin_and_its_transaction_leaves_the_kept_connection_usable(
        store: Store, tmp_path: Path, write: bool) -> None:
    """A KeyboardInterrupt raised just after the driver's BEGIN (a Ctrl-C at a foreground
    submit, once in CI) left SQLAlchemy without the transaction: the thread's kept connection
    stayed inside it, and the cancel the Ctrl-C asked for failed with "cannot start a
    transaction within a transaction" (the command exited 1, not 130)."""
    hits: list[int] = []

    def interrupted(_conn: Any) -> None:  # (after the store's own listener, which ran BEGIN)
        if not hits:
            hits.append(1)
            raise KeyboardInterrupt

    event.listen(store.engine, "begin", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with store.write() if write else store.read():
            pass
    event.remove(store.engine, "begin", interrupted)
    with store.write() as s:
        plain.insert_job(s, _job("job-a"))
    with writing_elsewhere(tmp_path / "kept.db"):  # (no lock was left behind: it begins at once)
        pass
    with store.read() as s:
        assert [j.id for j in s.exec(select(JobRow))] == ["job-a"]


def test_postgres_transactions_take_their_connection_from_the_pool(postgres_url: str) -> None:
    store = Store(postgres_url)
    try:
        assert store._kept is None  # (a kept connection would not be checked: pool_pre_ping)
        with store.read():
            assert _checked_out(store) == 1
        assert _checked_out(store) == 0
    finally:
        store.dispose()


def test_a_forked_child_uses_connections_of_its_own_and_the_parent_keeps_its(store: Store, tmp_path: Path) -> None:
    """multiprocessing forks on Linux: a child that uses the store opens its own connections
    (SQLite's must not cross a fork), and the parent's go on working."""
    with store.write() as s:
        plain.insert_job(s, _job("job_parent"))
        parent = _driver(s)
    with store.read() as s:  # (one given back to the pool too, to be inherited idle)
        with store.read() as inner:
            pooled = _driver(inner)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit handlers
        code = 1
        try:
            with store.write() as s:
                plain.insert_job(s, _job("job_child"))
                mine = _driver(s)
            with store.read() as s:
                with store.read() as inner:
                    again = _driver(inner)
                states = (plain.job_state(s, "job_parent"), plain.job_state(s, "job_child"))
            inherited = [c for c in (mine, again) if c is parent or c is pooled]
            ok = not inherited and states == ("queued", "queued")
            os.write(write, b"ok" if ok else repr((len(inherited), states)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    answer = os.read(read, 1000)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and answer == b"ok", answer
    with store.write() as s:
        assert _driver(s) is parent
        plain.insert_job(s, _job("job_after"))
        assert plain.job_state(s, "job_child") == "queued"
    with store.read() as s:
        assert plain.fetch(s, "PRAGMA integrity_check") == [("ok",)]
