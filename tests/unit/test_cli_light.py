"""The CLI's light path (gpulayer.cli.light, gpulayer.embedded_reads) prints exactly what the
full path prints, and leaves to it every case it cannot answer alike.

Each command runs twice in a fresh interpreter on the same real SQLite database: once
through ``gpulayer.cli.main`` (the light path when it can) and once through the Typer app
itself (always the full path: Typer, and the control plane on SQLAlchemy). The probe
reports which path ran by whether Typer, pydantic, SQLAlchemy, SQLModel or pluggy was imported.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gpulayer as gl
from gpulayer import embedded_reads
from gpulayer.records import JobState
from gpulayer.store import migrations
from tests.cli_support import Result, run_cli


def run(args: list[str], home: Path, *, entry: str = "main", env: dict[str, str] | None = None) -> Result:
    return run_cli(args, home, entry=entry, env=env, timeout=120)


def _created(home: Path, ages: dict[str, float]) -> None:
    """Set jobs' submission times ``ages`` seconds ago, in the middle of an ``AGE`` column
    step (so that the two runs, a moment apart, print the same age)."""
    now = time.time()
    with sqlite3.connect(home / "gpulayer.db") as db:
        for job_id, age in ages.items():
            db.execute("UPDATE gl_jobs SET created_at = ? WHERE id = ?", (now - age, job_id))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with a job in every state, of every kind, a function job's arguments
    apart, two jobs submitted at the same instant, a name, and a command with text that
    must be escaped on a terminal."""
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store

    home = tmp_path_factory.mktemp("light")
    store = Store(f"sqlite:///{home / 'gpulayer.db'}")
    cp = ControlPlane(store)
    wait = gl.Placement(on_unschedulable="wait")
    ids = [
        cp.submit(gl.CommandJob(command=["python", "train.py", "--lr", "0.1"], placement=wait)).id,
        cp.submit(gl.CommandJob(command=["echo", "héllo \x1b[2J wörld\u202e"], name="tricky", placement=wait)).id,
        cp.submit(gl.FunctionJob(function="pkg.mod:fn", args=[1, 2], kwargs={"k": "v"}, placement=wait)).id,
        cp.submit(gl.DistributedJob(entry="train.py", nodes=2, placement=wait)).id,
        cp.submit(gl.CommandJob(command=["sleep", "9"])).id,  # unschedulable: no worker
        cp.cancel(cp.submit(gl.CommandJob(command=["x" * 80], placement=wait)).id).id,
        cp.submit(gl.CommandJob(command=["python", "-c", "import sys\nsys.exit(0)", "one.py"], placement=wait)).id,
        cp.submit(gl.CommandJob(command=["false"], placement=wait)).id,
        cp.submit(gl.CommandJob(command=["tie", "a"], placement=wait)).id,
        cp.submit(gl.CommandJob(command=["tie", "b"], placement=wait)).id,
    ]
    store.dispose()
    with sqlite3.connect(home / "gpulayer.db") as db:  # states only a worker would reach
        for job_id, state, attempt in ((ids[0], "running", 1), (ids[1], "assigned", 1), (ids[6], "succeeded", 1),
                                       (ids[7], "failed", 2), (ids[3], "timed_out", 1)):
            db.execute("UPDATE gl_jobs SET state = ?, attempt = ? WHERE id = ?", (state, attempt, job_id))
    # ages at the middle of a step of the AGE column (10m is 9.5m to 10.5m, 2.5h is 2.45h to
    # 2.55h), not at a step's edge; set again before each test (aged): a minute's step leaves
    # 30 s either way
    AGES.clear()
    AGES.update({ids[0]: 10 * 60, ids[1]: 2 * 60, ids[2]: 30 * 60, ids[3]: 2.5 * 3600, ids[4]: 5 * 3600,
                 ids[5]: 45 * 60, ids[6]: 7.5 * 3600, ids[7]: 26 * 3600, ids[8]: 3 * 3600, ids[9]: 3 * 3600})
    TIE[:] = [ids[8], ids[9]]
    return home


#: the fixture's jobs' ages (seconds), and two jobs submitted at the same instant
AGES: dict[str, float] = {}
TIE: list[str] = []


@pytest.fixture(autouse=True)
def aged(request: pytest.FixtureRequest) -> None:
    """The fixture's ages, as of this test's start (a module of tests on a slow machine takes
    longer than the 30 s a minute's step leaves)."""
    if "home" not in request.fixturenames:
        return
    home = request.getfixturevalue("home")
    _created(home, AGES)
    with sqlite3.connect(home / "gpulayer.db") as db:  # a tie to the microsecond
        db.execute("UPDATE gl_jobs SET created_at = (SELECT created_at FROM gl_jobs WHERE id = ?) WHERE id = ?",
                   tuple(TIE))


@pytest.mark.parametrize("args", [
    [], ["--json"], ["--state", "queued"], ["--state=cancelled", "--json"], ["--limit", "3"],
    ["--limit=2", "--json"], ["--json", "--limit", "4", "--state", "running", "--state", "failed"],
    ["--state", "timed_out", "--json"], ["--state", "assigned"],
])
def test_jobs_list_prints_what_the_full_path_prints(home: Path, args: list[str]) -> None:
    light = run(["jobs", "list", *args], home)
    full = run(["jobs", "list", *args], home, entry="app")
    assert light[3] == "light", light
    assert full[3] == "full", full
    assert light[:3] == full[:3]
    assert light[0] == 0 and light[1]


def test_the_table_shows_every_state_and_escapes_what_a_terminal_would_obey(home: Path) -> None:
    code, out, _, path = run(["jobs", "list"], home)
    text = out.decode()
    assert (code, path) == (0, "light")
    assert {s.value for s in JobState} - {"queued", "cancelled", "unschedulable"} <= set(text.split())
    assert "\x1b" not in text and "\\x1b[2J" in text and "\\u202e" in text and "héllo" in text
    rows = json.loads(run(["jobs", "list", "--json"], home)[1])
    assert [r["created_at"] for r in rows] == sorted((r["created_at"] for r in rows), reverse=True)
    assert {r["kind"] for r in rows} == {"command", "function", "distributed"}
    # a program given inline on several lines: its first line (as the full path shows it too)
    assert "python -c import sys... one.py" in {r["what"] for r in rows}


def test_the_global_options_before_the_command_are_read(home: Path, tmp_path: Path) -> None:
    light = run(["--home", str(home), "jobs", "list", "--json"], tmp_path)
    full = run(["--home", str(home), "jobs", "list", "--json"], tmp_path, entry="app")
    assert (light[3], full[3]) == ("light", "full")
    assert light[:3] == full[:3] and json.loads(light[1])


@pytest.mark.parametrize("args", [
    ["jobs", "list", "--limit", "0"], ["jobs", "list", "--limit", "x"], ["jobs", "list", "--state", "done"],
    ["jobs", "list", "--state"], ["jobs", "list", "extra"], ["jobs", "list", "--help"], ["jobs", "list", "-h"],
    ["jobs", "list", "--json=1"], ["--version", "jobs", "list"], ["jobs", "show", "job-0"],
])
def test_what_the_light_path_does_not_know_goes_to_the_full_path(home: Path, args: list[str]) -> None:
    """Help, bad input (exit 2, worded by the full path) and other commands."""
    light = run(args, home)
    assert light[3] == "full", light
    assert light[:3] == run(args, home, entry="app")[:3] or light[0] == 2


def test_a_home_without_a_database_is_created_by_the_full_path(tmp_path: Path) -> None:
    assert run(["jobs", "list"], tmp_path)[1:] == (b"no jobs\n", "", "full")
    assert (tmp_path / "gpulayer.db").exists()
    assert run(["jobs", "list"], tmp_path)[1:] == (b"no jobs\n", "", "light")
    assert sorted(p.name for p in tmp_path.glob("gpulayer.db-*")) == []  # the WAL is checkpointed away


def test_a_database_the_light_reads_fail_on_is_left_to_the_full_path(tmp_path: Path) -> None:
    assert run(["jobs", "list"], tmp_path)[1:] == (b"no jobs\n", "", "full")  # creates it
    with sqlite3.connect(tmp_path / "gpulayer.db") as db:  # damaged: a column the reads name is gone
        db.execute("ALTER TABLE gl_jobs RENAME COLUMN created_at TO created_gone")
    _, out, err, path = run(["jobs", "list"], tmp_path)
    assert path == "full" and "embedded_reads" not in err and out == b""


def test_an_older_schema_is_migrated_by_the_full_path(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "gpulayer.db") as db:
        for statement in migrations.HISTORY[1]:
            db.execute(statement)
    assert run(["jobs", "list"], tmp_path)[1:] == (b"no jobs\n", "", "full")
    with sqlite3.connect(tmp_path / "gpulayer.db") as db:
        assert db.execute("SELECT version FROM gl_schema").fetchone() == (migrations.SCHEMA_VERSION,)
    assert run(["jobs", "list"], tmp_path)[3] == "light"


def test_a_newer_schema_is_refused_by_the_full_path(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "gpulayer.db") as db:
        db.execute("CREATE TABLE gl_schema (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)")
        db.execute("INSERT INTO gl_schema VALUES (1, ?)", (migrations.SCHEMA_VERSION + 1,))
    code, _, err, path = run(["jobs", "list"], tmp_path)
    assert (code, path) == (2, "full")
    assert "newer than this GPUlayer understands" in err
    assert f"the database in GPULAYER_HOME ({tmp_path / 'gpulayer.db'})" in err  # (which file: there may be several homes)


def test_a_worker_to_expire_first_sends_the_list_to_the_full_path(tmp_path: Path) -> None:
    """The full path's client marks a local worker whose process is gone offline (and its
    running job lost) before it lists: the light path must not show that job running."""
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store

    store = Store(f"sqlite:///{tmp_path / 'gpulayer.db'}")
    ControlPlane(store)
    store.dispose()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    caps = json.dumps({"host": {"os": "linux", "arch": "x86_64", "hostname": socket.gethostname(), "cpu_count": 1,
                                "memory_bytes": 1, "disk_free_bytes": 1, "python_version": "3.11",
                                "python_path": sys.executable, "address": "127.0.0.1"}})
    with sqlite3.connect(tmp_path / "gpulayer.db") as db:
        db.execute("INSERT INTO gl_workers (id, name, origin, capabilities, cpu_slots, online, draining, "
                   "last_heartbeat, registered_at, pid, hostname) VALUES ('wkr-gone', 'w', 'local', ?, 1, 1, 0, ?, 0, "
                   "?, ?)", (caps, time.time() + 3600, int(gone.stdout), socket.gethostname()))
    assert run(["jobs", "list"], tmp_path)[3] == "full"
    with sqlite3.connect(tmp_path / "gpulayer.db") as db:
        assert db.execute("SELECT online FROM gl_workers WHERE id = 'wkr-gone'").fetchone() == (0,)
    assert run(["jobs", "list"], tmp_path)[3] == "light"  # nothing left to expire


@pytest.mark.parametrize("env", [{"GPULAYER_DATABASE_URL": "sqlite:///{home}/gpulayer.db"},
                                 {"GPULAYER_URL": "http://127.0.0.1:1", "GPULAYER_HTTP_RETRY_SECONDS": "0"},
                                 {"GPULAYER_HEARTBEAT_TIMEOUT": "soon"}])
def test_a_server_another_database_or_a_bad_setting_is_left_to_the_full_path(home: Path, env: dict[str, str]) -> None:
    env = {k: v.format(home=home) for k, v in env.items()}
    light = run(["jobs", "list"], home, env=env)
    assert light[3] == "full"
    assert light[:3] == run(["jobs", "list"], home, env=env, entry="app")[:3] or light[0] in (2, 69)


@pytest.mark.parametrize("args", [["--token", "a b", "jobs", "list"], ["--ca", "sha256:zz", "jobs", "list", "--json"],
                                  ["--token", "a b", "jobs", "logs", "job-0"]])
def test_a_bad_global_option_is_refused_naming_the_flag(home: Path, args: list[str]) -> None:
    """The light path sets the variables the global options become, then leaves a value that
    does not parse to the full path: which must refuse it as the flag typed (``--token``),
    as when it runs alone, not as the variable the light path left set (``GPULAYER_TOKEN``)."""
    code, out, err, path = run(args, home)
    assert (code, out, path) == (2, b"", "full")
    assert err.startswith(f"error: {args[0]}") and "GPULAYER_" not in err, err


def test_the_url_option_is_left_to_the_full_path(home: Path) -> None:
    code, _, err, path = run(["--url", "http://127.0.0.1:1", "jobs", "list"], home,
                             env={"GPULAYER_HTTP_RETRY_SECONDS": "0"})
    assert (code, path) == (69, "full") and "127.0.0.1:1" in err


def test_the_light_reads_know_the_store_s_schema_and_states() -> None:
    """A new schema version or job state needs these reads checked, and these constants moved."""
    assert embedded_reads.SCHEMA_VERSION == migrations.SCHEMA_VERSION
    assert embedded_reads.JOB_STATES == tuple(s.value for s in JobState)


# --------------------------------------------------------------------------- jobs logs


@pytest.fixture(scope="module")
def logs_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A database with the output of a command job (streams interleaved, text stored quoted,
    more chunks than a page of embedded_reads.job_logs), of a distributed job of two nodes,
    and a job without output; its workers left offline (nothing to expire)."""
    from gpulayer.control import ControlPlane
    from gpulayer.records import TaskState
    from gpulayer.store import Store
    from tests.factories import make_capabilities

    home = tmp_path_factory.mktemp("light-logs")
    store = Store(f"sqlite:///{home / 'gpulayer.db'}")
    cp = ControlPlane(store)
    workers = [cp.register_worker(make_capabilities(), cpu_slots=1, origin="local").id for _ in range(2)]

    def run_job(spec: Any, chunks_of: Any) -> str:
        job = cp.submit(spec)
        for w in workers:
            for a in cp.poll_tasks(w):
                cp.start_task(a.task_id, worker_id=w)
                cp.append_logs(a.task_id, worker_id=w, chunks=chunks_of(a.node_rank))
                cp.finish_task(a.task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0)
        assert cp.get_job(job.id).state.value == "succeeded"
        return job.id

    many = [("stdout", f"line {i}\n") for i in range(embedded_reads.LOG_PAGE * 2 + 500)]
    mixed = [("stdout", "out 1\n"), ("stderr", "err 1\n"), ("system", "gpulayer: a note\n"), ("stdout", "a\x00b\n"),
             ("stderr", "\ue000looks quoted\n"), ("stdout", "héllo \x1b[2J, no newline at the end")]
    jobs = {
        "command": run_job(gl.CommandJob(command=["x"]), lambda rank: mixed + many + mixed),
        "distributed": run_job(gl.DistributedJob(entry="train.py", nodes=2),
                               lambda rank: [("stdout", f"rank {rank} a\nrank {rank} b\n"), ("stderr", f"warn {rank}\n"),
                                             ("stdout", f"rank {rank} end")]),
        "silent": run_job(gl.CommandJob(command=["true"]), lambda rank: []),
    }
    for w in workers:
        cp.deregister_worker(w)
    store.dispose()
    with sqlite3.connect(home / "gpulayer.db") as db:
        db.execute("UPDATE gl_workers SET online = 0")
    return home, jobs


@pytest.mark.parametrize(("job", "args"), [
    ("command", []), ("distributed", []), ("distributed", ["--node", "1"]), ("distributed", ["--node=0"]),
    ("silent", []), ("command", ["--node", "0"]),
    # the last lines, read from the end (a line split across chunks, stored quoted, no line feed at the end)
    ("command", ["--tail", "3"]), ("command", ["--tail=0"]), ("command", ["-n", "1"]),
    ("command", ["--tail", str(embedded_reads.LOG_PAGE + 3)]), ("command", ["--tail", "100000"]),
    ("distributed", ["--tail", "2"]), ("distributed", ["--node", "1", "--tail", "1"]), ("silent", ["--tail", "5"]),
])
@pytest.mark.parametrize("where", ["after", "before"])
def test_jobs_logs_prints_what_the_full_path_prints(logs_home: tuple[Path, dict[str, str]], job: str,
                                                     args: list[str], where: str) -> None:
    home, jobs = logs_home
    argv = ["jobs", "logs", jobs[job], *args] if where == "after" else ["jobs", "logs", *args, jobs[job]]
    light = run(argv, home)
    full = run(argv, home, entry="app")
    assert (light[3], full[3]) == ("light", "full"), light
    assert light[:3] == full[:3]
    assert light[0] == 0


@pytest.mark.parametrize(("job", "node", "says"), [
    ("distributed", "7", "nodes 0 to 1"), ("command", "1", "one node, 0"),
    # (past SQLite's 64-bit integers: it was an OverflowError traceback on the light path)
    ("command", "99999999999999999999999", "one node, 0"), ("distributed", str(2 ** 63), "nodes 0 to 1"),
])
def test_jobs_logs_of_a_node_the_job_does_not_have_is_refused_by_the_full_path(
        logs_home: tuple[Path, dict[str, str]], job: str, node: str, says: str) -> None:
    home, jobs = logs_home
    code, out, err, path = run(["jobs", "logs", jobs[job], "--node", node], home)
    assert (code, out, err, path) == (2, b"", f"error: --node {node}: the job has {says}\n", "full")


def test_jobs_logs_on_the_light_path_keeps_streams_apart_and_text_as_written(
        logs_home: tuple[Path, dict[str, str]]) -> None:
    home, jobs = logs_home
    code, out, err, path = run(["jobs", "logs", jobs["command"]], home)
    assert (code, path) == (0, "light")
    text = out.decode()
    assert text.startswith("out 1\ngpulayer: a note\na\x00b\nhéllo \x1b[2J, no newline at the endline 0\n")
    assert len(re.findall(r"line \d+\n", text)) == embedded_reads.LOG_PAGE * 2 + 500  # every page
    assert err == "err 1\n\ue000looks quoted\n" * 2
    out = run(["jobs", "logs", jobs["distributed"]], home)[1].decode()
    # (each node's last line has no line break: shown after the others, whole, each ended by one)
    assert out == "[node 0] rank 0 a\n[node 0] rank 0 b\n[node 1] rank 1 a\n[node 1] rank 1 b\n" \
                  "[node 0] rank 0 end\n[node 1] rank 1 end\n"


@pytest.mark.parametrize("args", [
    ["jobs", "logs", "{job}", "--follow"], ["jobs", "logs", "-f", "{job}"], ["jobs", "logs", "{job}", "--node", "x"],
    ["jobs", "logs", "{job}", "--node", "-1"], ["jobs", "logs"], ["jobs", "logs", "{job}", "extra"],
    ["jobs", "logs", "--help"], ["jobs", "logs", "job-000000000000"], ["--url", "http://127.0.0.1:1", "jobs", "logs", "{job}"],
    ["jobs", "logs", "{job}", "--tail", "-1"], ["jobs", "logs", "{job}", "--tail", "100001"],
    ["jobs", "logs", "{job}", "--tail", "x"], ["jobs", "logs", "{job}", "-n=2"], ["jobs", "logs", "{job}", "-n2"],
    ["jobs", "logs", "{job}", "--tail", "2", "-f"],
])
def test_jobs_logs_the_light_path_does_not_know_goes_to_the_full_path(
        logs_home: tuple[Path, dict[str, str]], args: list[str]) -> None:
    """Following (it waits and exits with the job's outcome), bad input, help, an unknown job
    (the full path words each error) and a server."""
    home, jobs = logs_home
    args = [a.format(job=jobs["silent"]) for a in args]
    env = {"GPULAYER_HTTP_RETRY_SECONDS": "0"}
    light = run(args, home, env=env)
    assert light[3] == "full", light
    assert light[:3] == run(args, home, entry="app", env=env)[:3] or light[0] in (2, 69)


def test_jobs_logs_tail_prints_the_last_lines_as_written_on_the_light_path(
        logs_home: tuple[Path, dict[str, str]]) -> None:
    """Lines counted in stdout and stderr together, as written; a line split across chunks
    whole; the job's unterminated last line one of them."""
    home, jobs = logs_home
    code, out, err, path = run(["jobs", "logs", jobs["command"], "--tail", "4"], home)
    assert (code, path) == (0, "light")
    assert (out.decode(), err) == ("gpulayer: a note\na\x00b\nhéllo \x1b[2J, no newline at the end",
                                   "\ue000looks quoted\n")
    code, out, err, path = run(["jobs", "logs", jobs["command"], "--tail", "1"], home)
    assert (code, out.decode(), err, path) == (0, "héllo \x1b[2J, no newline at the end", "", "light")
    assert run(["jobs", "logs", jobs["distributed"], "--node", "0", "-n", "3"], home)[1:] == (
        b"rank 0 b\nrank 0 end", "warn 0\n", "light")


@pytest.mark.parametrize(("value", "says"), [("-1", "out of range"), ("100001", "out of range"),
                                             ("ten", "not a whole number")])
def test_jobs_logs_tail_that_is_not_a_number_of_lines_is_refused_naming_it(
        logs_home: tuple[Path, dict[str, str]], value: str, says: str) -> None:
    home, jobs = logs_home
    code, out, err, _ = run(["jobs", "logs", jobs["command"], "--tail", value], home)
    assert (code, out) == (2, b"")
    assert err.endswith(f"Error: Invalid value for '--tail' / '-n': '{value}': {says}; "
                        "accepted: a whole number from 0 to 100000\n"), err


def test_an_age_ahead_of_the_clock_is_no_time_ago() -> None:
    """After the wall clock stepped back, a job submitted before the step is 'ahead' of now:
    its age is 0s, not -3600s (as the dashboard's is)."""
    from gpulayer.cli import light

    assert [light.age(s) for s in (-3600.0, -0.4, 0.0, 59.0, 61.0, 7200.0)] == ["0s", "0s", "0s", "59s", "1m", "2.0h"]
