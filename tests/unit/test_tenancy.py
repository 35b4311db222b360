"""Tenancy on a shared control plane (issue 13 §5), in-process over HTTP (Starlette's test
transport, a real SQLite database): who may read a bundle, what a worker acting on another
worker's task is told, and what the CLI prints of a job's text. The server process itself
(admin token, permissions, stop line) is tested in tests/integration/test_server_hygiene.py."""

from __future__ import annotations

import io
import os
import sqlite3
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpulayer import bundles, errors
from gpulayer.cli.display import cell, columns, printable
from gpulayer.control import ControlPlane
from gpulayer.http_client import RemoteAPI, connect_http
from gpulayer.records import TaskState
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, migrations
from tests.factories import make_capabilities


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient]]:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        yield control, tc


def remote(tc: TestClient, token: str | None) -> RemoteAPI:
    return connect_http("http://testserver", token=token, retry_for=0.5, transport=tc._transport)


def a_bundle(text: str) -> tuple[str, bytes]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("main.py", text)
    data = buf.getvalue()
    return bundles.compute_digest(data), data


def job_with(digest: str) -> CommandJob:
    return CommandJob(command=["python", "main.py"], bundle_digest=digest,
                      placement=Placement(target="remote", on_unschedulable="wait"))


def test_a_bundle_is_read_only_by_its_uploaders_their_workers_and_admins(
        served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    admin = remote(tc, control.create_token(scope="admin").token)
    alice = remote(tc, admin.create_token(scope="client").token)
    mallory = remote(tc, admin.create_token(scope="client").token)
    digest, data = a_bundle("SECRET = 'alice'\n")
    assert alice.put_bundle(digest, data).stored
    assert alice.has_bundle(digest) and alice.get_bundle(digest) == data
    # another client: the bundle does not exist for it, by any route
    assert mallory.has_bundle(digest) is False
    with pytest.raises(errors.NotFound, match="no such bundle"):
        mallory.get_bundle(digest)
    with pytest.raises(errors.InvalidInput, match="no bundle with that address was uploaded"):
        mallory.submit(job_with(digest))
    assert admin.get_bundle(digest) == data
    # two workers; only the one given a task of alice's job may read the bundle
    join = admin.create_token(scope="join", uses=2).token
    w1 = remote(tc, None).join_worker(make_capabilities(), join_token=join, cpu_slots=1)
    w2 = remote(tc, None).join_worker(make_capabilities(), join_token=join, cpu_slots=1)
    first, second = remote(tc, w1.token), remote(tc, w2.token)
    with pytest.raises(errors.NotFound):
        first.get_bundle(digest)
    job = alice.submit(job_with(digest))
    tasks = {w.worker_id: control.poll_tasks(w.worker_id) for w in (w1, w2)}
    holder, other = (first, second) if tasks[w1.worker_id] else (second, first)
    assert holder.get_bundle(digest) == data
    with pytest.raises(errors.NotFound):
        other.get_bundle(digest)
    # once the task ended, its worker reads it no more
    [task] = [t for ts in tasks.values() for t in ts]
    holder_id = w1.worker_id if holder is first else w2.worker_id
    control.start_task(task.task_id, worker_id=holder_id)
    control.finish_task(task.task_id, worker_id=holder_id, state=TaskState.SUCCEEDED, exit_code=0)
    with pytest.raises(errors.NotFound):
        holder.get_bundle(digest)
    assert alice.get_job(job.id).state.value == "succeeded"
    # uploading the same bytes proves having them: then mallory may read and use it too
    assert mallory.put_bundle(digest, data).stored is False
    assert mallory.get_bundle(digest) == data
    assert mallory.submit(job_with(digest)).spec.bundle_digest == digest


def test_embedded_callers_read_every_bundle(tmp_path: Path) -> None:
    cp = ControlPlane(Store(f"sqlite:///{tmp_path / 'e.db'}"))
    digest, data = a_bundle("x = 1\n")
    cp.put_bundle(digest, data)
    assert cp.has_bundle(digest) and cp.get_bundle(digest) == data


def test_migrating_to_schema_4_keeps_job_owners_readers_of_their_bundles(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    for statement in migrations.HISTORY[1]:
        db.execute(statement)
    db.execute("ALTER TABLE gl_jobs ADD COLUMN idempotency_key VARCHAR")
    db.execute("ALTER TABLE gl_jobs ADD COLUMN owner VARCHAR")
    db.execute("ALTER TABLE gl_jobs ADD COLUMN args TEXT")
    db.execute("CREATE TABLE gl_tokens (id VARCHAR PRIMARY KEY, hash VARCHAR, scope VARCHAR, created_at FLOAT,"
               " expires_at FLOAT, uses_left INTEGER, revoked BOOLEAN, worker_id VARCHAR, description VARCHAR)")
    db.execute("UPDATE gl_schema SET version = 3")
    digest, data = a_bundle("y = 2\n")
    db.execute("INSERT INTO gl_bundles VALUES (?, ?, ?, 1.0)", (digest, len(data), data))
    db.execute(
        "INSERT INTO gl_jobs (id, kind, spec, state, priority, created_at, updated_at, attempt, max_attempts,"
        " cancel_requested, owner) VALUES ('job-000000000001', 'command', ?, 'succeeded', 0, 1.0, 2.0, 1, 1, 0,"
        " 'tok-alice')", (job_with(digest).model_dump_json(),))
    db.commit()
    db.close()
    cp = ControlPlane(Store(f"sqlite:///{path}"))
    assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
    assert cp.get_bundle(digest, owner="tok-alice") == data
    assert cp.has_bundle(digest, owner="tok-bob") is False


def test_a_worker_acting_on_another_workers_task_is_forbidden_naming_nothing(
        served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    join = control.create_token(scope="join", uses=2).token
    a = remote(tc, None).join_worker(make_capabilities(), join_token=join, cpu_slots=1)
    b = remote(tc, None).join_worker(make_capabilities(), join_token=join, cpu_slots=1)
    job = control.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [task] = control.get_job(job.id).tasks
    owner, intruder = (a, b) if task.worker_id == a.worker_id else (b, a)
    headers = {"authorization": f"Bearer {intruder.token}"}
    for path, body in ((f"/v1/tasks/{task.id}/start", None), (f"/v1/tasks/{task.id}/logs", {"chunks": []}),
                       (f"/v1/tasks/{task.id}/finish", {"state": "succeeded", "exit_code": 0})):
        r = tc.post(path, headers=headers, json=body)
        assert r.status_code == 403, (path, r.status_code, r.text)
        assert r.json()["error"]["code"] == "forbidden"
        assert owner.worker_id not in r.text, r.text
    with pytest.raises(errors.Forbidden):
        remote(tc, intruder.token).finish_task(task.id, worker_id=intruder.worker_id, state=TaskState.SUCCEEDED)
    assert control.get_job(task.job_id).state.value == "assigned"


# ---------------------------------------------------------------------------------- terminal text


def test_printable_escapes_control_and_invisible_characters() -> None:
    assert printable("echo hi") == "echo hi"
    assert printable("a\x1b]0;pwned\x07b\x1b[2J") == "a\\x1b]0;pwned\\x07b\\x1b[2J"
    assert printable("x\ny\tz\x7f\x9b") == "x\\ny\\tz\\x7f\\x9b"
    assert printable("\u202eevil\u200b") == "\\u202eevil\\u200b"
    assert printable("é 日本 💥") == "é 日本 💥"


@pytest.mark.usefixtures("gpulayer_isolated")
def test_jobs_list_and_show_print_no_raw_escape_sequences(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cp = ControlPlane(Store(f"sqlite:///{home / 'gpulayer.db'}"))
    evil = ["printf", "\x1b]0;pwned\x07\x1b[2J", "\nFAKE-ROW succeeded"]
    job = cp.submit(CommandJob(command=evil, placement=Placement(target="remote", on_unschedulable="wait")))
    cp.store.dispose()
    env = {**os.environ, "GPULAYER_HOME": str(home)}
    env.pop("GPULAYER_URL", None)
    for args in (["jobs", "list"], ["jobs", "show", job.id]):
        out = subprocess.run([sys.executable, "-m", "gpulayer.cli", *args], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
        assert "\\x1b]0;pwned\\x07" in out.stdout
        assert not any(line.startswith("FAKE-ROW") for line in out.stdout.splitlines())


def test_home_and_database_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulayer import config

    home = tmp_path / "loose"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    assert config.home() == home.resolve()
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    old = os.umask(0o022)
    try:
        store = Store(f"sqlite:///{home / 'gpulayer.db'}")
        ControlPlane(store).submit(CommandJob(command=["true"], placement=Placement(on_unschedulable="wait")))
    finally:
        os.umask(old)
    for p in home.iterdir():
        if p.name.startswith("gpulayer.db"):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    store.dispose()


def test_migrating_to_schema_4_on_postgres(postgres_url: str) -> None:
    """The same upgrade on PostgreSQL: a schema 3 database (made by dropping what 4 added)."""
    import sqlalchemy as sa

    store = Store(postgres_url)
    digest, data = a_bundle("z = 3\n")
    cp = ControlPlane(store)
    cp.put_bundle(digest, data, owner="tok-carol")
    cp.submit(job_with(digest), owner="tok-carol")
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE gl_bundle_readers"))
        conn.execute(sa.text("UPDATE gl_schema SET version = 3"))
    store.dispose()
    cp = ControlPlane(Store(postgres_url))
    assert cp.store.schema_version() == migrations.SCHEMA_VERSION
    assert cp.get_bundle(digest, owner="tok-carol") == data
    assert cp.has_bundle(digest, owner="tok-dave") is False
    cp.store.dispose()


def test_a_table_cell_is_measured_in_terminal_columns() -> None:
    """A wide character takes two columns, a combining mark none: cells padded or cut by
    ``len`` put every later column of the row out of line (``worker list``'s NAME)."""
    assert [columns(t) for t in ("abc", "训练机-✓", "cafe\u0301", "😀")] == [3, 8, 4, 2]
    assert cell("训练机-✓", 10) == "训练机-✓  "
    assert cell("训练机训练机训练机", 15) == "训练机训练机训 "  # (a wide character never half shown)
    assert cell("cafe\u0301", 6) == "cafe\u0301  "
