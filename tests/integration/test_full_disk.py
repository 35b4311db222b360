"""A full disk under the embedded database: what only reads still answers, what must write
says so in one line (real processes on a real full file system: a small tmpfs, which needs
root to mount; skipped elsewhere)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import plugins
from tests.server_support import Api, ServerProc
from tests.support import cli, mount_small_tmpfs, seed_probe_cache, start_worker, stop_strays, wait_for


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` with a file in it, which is returned."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:  # (unbuffered: nothing is left to write at close)
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    return filler


@pytest.fixture
def small_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probed_frameworks: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    mount_small_tmpfs(mount, "4m")
    home = mount / "home"
    home.mkdir()
    seed_probe_cache(home, probed_frameworks)
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    for name in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_WARM_CLI", "0")
    plugins.reset_manager()
    try:
        yield home
    finally:
        stop_strays(home)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_leaves_jobs_list_working_and_a_submit_says_why(small_home: Path) -> None:
    """`jobs list` opened the database by marking a dead worker's tasks lost first, a write:
    on a full disk it ended in SQLAlchemy's traceback, and so did every command."""
    worker = start_worker("--cpu-slots", "1")
    try:
        job_id = cli("submit", "--detach", "--", "sleep", "60", check=True).stdout.strip()
        wait_for(lambda: '"running"' in cli("jobs", "list", "--json").stdout, 60, "the job to run")
    finally:
        worker.kill()  # its process gone: the next command to open the home marks it offline, a write
        worker.wait(30)
    with open(small_home.parent / "filler", "wb") as f:  # the disk, full
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    listed = cli("jobs", "list")
    assert listed.returncode == 0, listed.stderr
    assert job_id in listed.stdout
    submitted = cli("submit", "--detach", "--", "true")
    assert submitted.returncode == 1
    assert "Traceback" not in submitted.stderr
    # (which file: a user may have several homes, and must find the disk to clean)
    assert (f"error: the database in GPULAYER_HOME ({small_home / 'gpulayer.db'}): database or disk is full"
            in submitted.stderr), submitted.stderr
    os.unlink(small_home.parent / "filler")
    assert '"failed"' in cli("jobs", "list", "--json", check=True).stdout  # lost, once it can be written


def test_a_full_disk_under_the_sdk_and_a_server_is_an_error_that_names_the_database(small_home: Path) -> None:
    """A submit from a script raised SQLAlchemy's OperationalError (a traceback, no file
    named), and a server answered its clients HTTP 500 ``internal error: OperationalError``
    (the CLI exited 2, as for bad input). The script is told which file; a server's client is
    told what failed (503, which it retries), not the server's paths."""
    worker = start_worker("--cpu-slots", "1")  # (the database open, as a script's would be)
    try:
        wait_for(lambda: "online" in cli("worker", "list").stdout, 60, "the worker")
        filler = fill(small_home.parent)
        script = ("import gpulayer as gl\n"
                  "try:\n"
                  "    gl.submit(gl.CommandJob(command=['true']))\n"
                  "except gl.GpulayerError as exc:\n"
                  "    print(type(exc).__name__, exc)\n")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.stdout.strip() == (f"DatabaseFailed the database in GPULAYER_HOME ({small_home / 'gpulayer.db'}): "
                                       "database or disk is full"), (done.stdout, done.stderr[-2000:])
        filler.unlink()
    finally:
        worker.kill()
        worker.wait(30)
    srv = ServerProc(small_home / "server")
    srv.log_path = small_home.parent.parent / "server.log"  # (its output is not on the full disk)
    srv.start()
    try:
        url, token = srv.url, srv.admin_token
        Api(url, token)("GET", "/v1/jobs").raise_for_status()
        filler = fill(small_home.parent)
        env = {"GPULAYER_URL": url, "GPULAYER_TOKEN": token, "GPULAYER_HTTP_RETRY_SECONDS": "1"}
        submitted = cli("submit", "--detach", "--on-unschedulable", "wait", "--", "true", env=env)
        assert submitted.returncode == 1, submitted.stderr
        assert submitted.stderr.strip() == "error: the server's database failed: database or disk is full"
        answer = Api(url, token)("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"],
                                                                   "placement": {"on_unschedulable": "wait"}}})
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "database_failed", answer.text
        assert str(small_home) not in answer.text
        filler.unlink()
        submitted = cli("submit", "--detach", "--on-unschedulable", "wait", "--", "true", env=env)
        assert submitted.returncode == 0, submitted.stderr  # (the server serves on once it has room)
    finally:
        srv.stop()


def test_a_task_whose_start_could_not_be_stored_starts_once_the_disk_has_room(small_home: Path) -> None:
    """The worker's write that marks a task started failed on the full disk and the task was
    reported failed ('worker error: OperationalError ...'): a job that never ran failed (or
    spent a retry). The start is tried again, as through an outage of a server, and the job
    runs once, in its first attempt."""
    worker = start_worker("--cpu-slots", "1")
    try:
        wait_for(lambda: "online" in cli("worker", "list").stdout, 60, "the worker")
        os.kill(worker.pid, signal.SIGSTOP)  # (it hears of the job only once the disk is full)
        try:
            job_id = cli("submit", "--detach", "--", "sh", "-c", "echo ran $GPULAYER_ATTEMPT",
                         check=True).stdout.strip()
            filler = fill(small_home.parent)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        time.sleep(3.0)  # (the worker has the task and tries to mark it started meanwhile)
        filler.unlink()
        cli("jobs", "wait", job_id, "--timeout", "90")
        done = json.loads(cli("jobs", "show", job_id, "--json", check=True).stdout)
        shown = cli("jobs", "show", job_id).stdout
        assert done["state"] == "succeeded", shown
        assert len(done["tasks"]) == 1, shown
        assert cli("jobs", "logs", job_id).stdout == "ran 1\n"
    finally:
        worker.kill()
        worker.wait(30)


def test_a_full_disk_during_a_schema_upgrade_is_an_outage_and_leaves_the_database_as_it_was(small_home: Path) -> None:
    """A home of an older GPUlayer (schema 1) upgraded on a full disk: the command exited 2,
    'cannot open the database: database or disk is full', as if the home given were wrong.
    It is an outage (exit 1, the words of any other full disk); the upgrade, one
    transaction, left the database as it was, and runs once the disk has room."""
    import sqlite3

    from gpulayer.specs import CommandJob
    from gpulayer.store import migrations

    path = small_home / "gpulayer.db"
    db = sqlite3.connect(path)
    for statement in migrations.HISTORY[1]:
        db.execute(statement)
    # jobs with a bundle, each of which the upgrade rewrites (schema 11: gl_jobs.bundle_digest)
    spec = CommandJob(command=["echo", "x" * 2000], bundle_digest="0" * 64).model_dump_json()
    db.executemany("INSERT INTO gl_jobs (id, kind, spec, state, priority, created_at, updated_at, attempt,"
                   " max_attempts, cancel_requested) VALUES (?, 'command', ?, 'succeeded', 0, 1.0, 2.0, 1, 1, 0)",
                   [(f"job-{i:012x}", spec) for i in range(300)])
    db.commit()
    before = list(db.iterdump())
    db.close()
    filler = fill(small_home.parent)
    with open(filler, "r+b") as f:  # room for the database's shared memory and a few pages, not the upgrade
        f.truncate(os.path.getsize(filler) - 128 * 1024)
    listed = cli("jobs", "list", "--json")
    assert (listed.returncode, listed.stderr.strip()) == (
        1, f"error: the database in GPULAYER_HOME ({path}): database or disk is full"), listed.stderr
    db = sqlite3.connect(path)  # (in WAL mode now, as the open leaves it: its tables and rows as they were)
    assert list(db.iterdump()) == before and db.execute("SELECT version FROM gl_schema").fetchall() == [(1,)]
    db.close()
    filler.unlink()
    listed = cli("jobs", "list", "--json", "--limit", "1000", check=True)  # (upgraded, now it has room)
    assert len(json.loads(listed.stdout)) == 300


def test_a_new_database_on_a_full_disk_is_an_outage_not_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first command on a disk with no room for a new file (its inodes used up, as a full
    ext4 also refuses a new folder or file): the home's folder, the database's file or its
    write-ahead log could not be made, and the command exited 2 (bad input), one telling
    the user to choose "a folder this user may create or write in", as if the home given
    were wrong. Each is an outage, exit 1, as a full disk under an existing database is."""
    mount = tmp_path / "small"
    mount.mkdir()
    mount_small_tmpfs(mount, "4m", inodes=32)
    monkeypatch.setenv("GPULAYER_WARM_CLI", "0")
    for name in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    try:
        home = mount / "home"
        taken = []
        with contextlib.suppress(OSError):  # every inode used
            while True:
                (mount / f"f{len(taken)}").touch()
                taken.append(mount / f"f{len(taken)}")
        monkeypatch.setenv("GPULAYER_HOME", str(home))
        listed = cli("jobs", "list")
        assert (listed.returncode, listed.stderr.strip()) == (
            1, f"error: GPULAYER_HOME={str(home)!r}: cannot create the state directory: No space left on device"), \
            listed.stderr
        taken.pop(0).unlink()
        home.mkdir()  # (room for the folder, none for the database)
        db = home / "gpulayer.db"
        listed = cli("jobs", "list")
        assert (listed.returncode, listed.stderr.strip()) == (
            1, f"error: the database in GPULAYER_HOME ({db}): cannot create the database file {db}: "
               "No space left on device"), listed.stderr
        taken.pop(0).unlink()
        taken.pop(0).unlink()  # (room for the database and its lock file, none for its write-ahead log)
        listed = cli("jobs", "list")
        assert (listed.returncode, listed.stderr.strip()) == (
            1, f"error: the database in GPULAYER_HOME ({db}): unable to open database file "
               "(no space left on its file system)"), listed.stderr
        for f in taken:
            f.unlink()
        assert cli("jobs", "list").returncode == 0  # (room again: the database is made)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
