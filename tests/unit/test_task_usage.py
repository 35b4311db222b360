"""What a task's processes used (docs/concepts.md, "Resource usage"): the kernel's count as its
worker or fork server reaps it, stored with the task's end and read back."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from sqlalchemy import text
from starlette.testclient import TestClient

from gpulayer import api
from gpulayer.control import ControlPlane
from gpulayer.http_client import connect_http
from gpulayer.readers import READS_HEADER
from gpulayer.records import JobError, JobState, TaskState, TaskUsage
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, migrations
from gpulayer.wire import Wire
from gpulayer.worker import usage
from gpulayer.worker.outcome import TaskOutcome, finish
from gpulayer.worker.process import run_process
from tests.factories import make_capabilities, running_task

#: burns ``sys.argv[1]`` seconds of its own CPU (user and system: ``time.process_time``),
#: after touching every page of ``sys.argv[2]`` bytes
BURN = """
import sys, time
block = bytearray(int(sys.argv[2]))
for i in range(0, len(block), 4096):
    block[i] = 1
start = time.process_time()
while time.process_time() - start < float(sys.argv[1]):
    pass
"""


def _run(argv: list[str], cwd: Path) -> Any:
    out: list[bytes] = []
    return run_process(argv, env={"PATH": "/usr/bin:/bin"}, cwd=str(cwd), on_output=lambda _s, b: out.append(b))


def test_the_kernels_count_is_read_in_bytes_and_one_within_its_floor_is_a_bound() -> None:
    ru = SimpleNamespace(ru_utime=1.5, ru_stime=0.25, ru_maxrss=2048)
    unit = 1 if sys.platform == "darwin" else 1024
    assert usage.usage_of(ru) == TaskUsage(cpu_user=1.5, cpu_system=0.25, max_rss=2048 * unit)
    assert usage.usage_of(ru, floor=2048 * unit - 1).max_rss == 2048 * unit
    within = usage.usage_of(ru, floor=2048 * unit)  # (a spawned process's count starts at its spawner's peak)
    assert (within.max_rss, within.max_rss_at_most) == (None, 2048 * unit)
    assert within.describe() == ("CPU 1.75 s (user 1.50 s, system 0.25 s), peak memory at most 2.0 MB "
                                 "(counted from its worker's peak)")
    assert usage.usage_of(ru).describe() == "CPU 1.75 s (user 1.50 s, system 0.25 s), peak memory 2.0 MB"
    assert "max_rss_at_most" not in usage.usage_of(ru).model_dump()


def test_a_spawned_task_counts_the_cpu_of_the_processes_it_waited_for(tmp_path: Path) -> None:
    (tmp_path / "burn.py").write_text(BURN)
    py = sys.executable
    done = _run(["sh", "-c", f"{py} burn.py 0.2 0 && {py} burn.py 0.2 0"], tmp_path)
    assert done.state == "succeeded" and done.usage is not None
    assert done.usage.cpu >= 0.4  # (each of the shell's two children burnt 0.2 s of its own)


def test_a_spawned_task_that_used_more_than_its_worker_has_its_peak_counted(tmp_path: Path) -> None:
    (tmp_path / "burn.py").write_text(BURN)
    size = usage.own_peak() + 64 * 2**20  # (more than its worker: see the next test)
    done = _run([sys.executable, "burn.py", "0", str(size)], tmp_path)
    assert done.state == "succeeded" and done.usage is not None
    assert done.usage.max_rss is not None and done.usage.max_rss >= size
    assert done.usage.max_rss_at_most is None


def test_a_spawned_task_that_used_less_is_said_to_have_stayed_within_its_workers_peak(tmp_path: Path) -> None:
    """Linux carries a process's peak across exec: ``true`` spawned from a worker of 100 MB
    counts 100 MB, which is not what it used."""
    done = _run(["true"], tmp_path)
    assert done.usage is not None and done.usage.max_rss is None
    assert done.usage.max_rss_at_most is not None and done.usage.max_rss_at_most <= usage.own_peak()
    assert "peak memory at most" in done.usage.describe()


def test_a_killed_task_has_what_it_used_until_then(tmp_path: Path) -> None:
    (tmp_path / "burn.py").write_text(BURN)
    done = run_process([sys.executable, "burn.py", "60", "0"], env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path),
                       on_output=lambda _s, _b: None, timeout=1.0, grace=0.1)
    assert done.state == "timed_out" and done.usage is not None and done.usage.cpu > 0


def test_a_task_that_never_started_used_nothing_measured(tmp_path: Path) -> None:
    assert _run(["/no/such/program"], tmp_path).usage is None


def test_without_waitid_a_spawned_task_is_counted_all_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS's Python has no ``os.waitid``: there the exit was found by ``Popen.poll``, which
    reaped the process, so that no spawned task of a Mac's worker had a count."""
    monkeypatch.delattr(os, "waitid")
    (tmp_path / "burn.py").write_text(BURN)
    done = _run([sys.executable, "burn.py", "0.2", "0"], tmp_path)
    assert done.state == "succeeded" and done.usage is not None and done.usage.cpu >= 0.2
    failed = _run(["sh", "-c", "exit 3"], tmp_path)
    assert (failed.state, failed.exit_code) == ("failed", 3) and failed.usage is not None
    killed = _run(["sh", "-c", "kill -9 $$"], tmp_path)
    assert (killed.state, killed.exit_code, killed.error) == ("failed", -9, "killed by signal SIGKILL")
    assert killed.usage is not None


def test_a_workers_peak_that_rises_as_a_task_is_spawned_is_not_taken_for_the_tasks(tmp_path: Path) -> None:
    """The peak a spawned task is counted from is its worker's as the task's command is
    exec'd: where the worker's grew meanwhile (another of its threads reading a bundle),
    the task was said to have used the worker's new peak. (The environment is encoded
    just before the exec: a name whose encoding makes this process's peak grow stands
    for that other thread.)"""
    held: list[bytearray] = []
    size = usage.own_peak() + 32 * 2**20  # (more than this process ever held: its peak rises)

    class Growing(str):
        def encode(self, *args: Any, **kwargs: Any) -> bytes:
            block = bytearray(size)
            for i in range(0, len(block), 4096):
                block[i] = 1
            held.append(block)
            return str(self).encode(*args, **kwargs)

    done = run_process(["true"], env={"PATH": "/usr/bin:/bin", Growing("GROWN"): "1"}, cwd=str(tmp_path),
                       on_output=lambda _s, _b: None)
    assert held, "the environment was not encoded as the task was spawned"
    assert done.state == "succeeded" and done.usage is not None
    assert done.usage.max_rss is None, done.usage  # (true used a megabyte or two, not the worker's peak)
    assert done.usage.max_rss_at_most is not None and done.usage.max_rss_at_most >= size


USED = TaskUsage(cpu_user=12.5, cpu_system=0.75, max_rss=3 * 2**30)


def test_the_report_stores_it_with_the_tasks_end(cp: ControlPlane) -> None:
    w = cp.register_worker(make_capabilities(), cpu_slots=1).id
    bounded = TaskUsage(cpu_user=0.0, cpu_system=0.0, max_rss_at_most=80 * 2**20)
    for state, used in [(TaskState.SUCCEEDED, USED), (TaskState.FAILED, bounded), (TaskState.SUCCEEDED, None)]:
        job = cp.submit(CommandJob(command=["true"]))
        [a] = cp.poll_tasks(w)
        cp.start_task(a.task_id, worker_id=w)
        cp.finish_task(a.task_id, worker_id=w, state=state, exit_code=0 if state is TaskState.SUCCEEDED else 1,
                       usage=used)  # (None: a worker that measured nothing, an older one)
        assert cp.get_job(job.id).tasks[0].usage == used


def test_the_migration_from_schema_13(store_url: str) -> None:
    store = Store(store_url)
    cp = ControlPlane(store)
    job_id, task_id, w = running_task(cp)
    with store.engine.begin() as conn:  # back to schema 13: no column
        conn.execute(text("ALTER TABLE gl_tasks DROP COLUMN usage"))
        conn.execute(text("UPDATE gl_schema SET version = 13"))
    store.dispose()
    cp = ControlPlane(Store(store_url))
    try:
        assert cp.store.schema_version() == migrations.SCHEMA_VERSION == 15
        assert cp.get_job(job_id).tasks[0].usage is None
        cp.finish_task(task_id, worker_id=w, state=TaskState.SUCCEEDED, exit_code=0, usage=USED)
        assert cp.get_job(job_id).tasks[0].usage == USED
    finally:
        cp.store.dispose()


def _remote_task(control: ControlPlane, tc: TestClient) -> tuple[Any, str, str, str]:
    """A worker joined through ``tc``'s server, running a job's task: (its API, job, task, worker)."""
    worker = connect_http("http://testserver", retry_for=0.5, transport=tc._transport)
    reply = worker.join_worker(make_capabilities(), join_token=control.create_token(scope="join", uses=1).token,
                               name="w", cpu_slots=1, pid=1)
    worker.token = reply.token
    job = control.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [a] = worker.poll_tasks(reply.worker_id, wait=0)
    worker.start_task(a.task_id, worker_id=reply.worker_id)
    return worker, job.id, a.task_id, reply.worker_id


def test_through_a_server_it_goes_to_the_clients_that_read_it(served: tuple[ControlPlane, TestClient]) -> None:
    """A worker's report carries it; a client of this version reads it, and one that does not
    say it reads it (an older one, which refuses a field it does not know) is not sent it."""
    control, tc = served
    worker, job_id, task_id, w = _remote_task(control, tc)
    finish(worker, task_id, w, TaskOutcome(TaskState.SUCCEEDED, exit_code=0, usage=USED))
    assert control.get_job(job_id).tasks[0].usage == USED
    token = control.create_token(scope="admin").token
    client = connect_http("http://testserver", token=token, retry_for=0.5, transport=tc._transport)
    assert client.get_job(job_id).tasks[0].usage == USED
    assert client.wait_job(job_id, timeout=1).tasks[0].usage == USED
    headers = {"Authorization": f"Bearer {token}"}
    [older] = tc.get(f"/v1/jobs/{job_id}", headers=headers).json()["tasks"]
    assert "usage" not in older and older["state"] == "succeeded"
    [waited] = tc.get(f"/v1/jobs/{job_id}/wait?timeout=1", headers=headers).json()["tasks"]
    assert "usage" not in waited
    [newer] = tc.get(f"/v1/jobs/{job_id}", headers={**headers, READS_HEADER: "usage"}).json()["tasks"]
    assert newer["usage"] == USED.model_dump(mode="json")


class _FinishBodyOfSchema13(Wire):
    json_text: ClassVar[tuple[str, ...]] = ("result",)

    state: TaskState
    exit_code: int | None = None
    result: Any = None
    error: JobError | None = None


def test_a_worker_reports_without_it_to_a_server_from_before_it(
        served: tuple[ControlPlane, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """A server of schema 13 refuses the field (``body.usage: no such field``): the report is
    sent again without it, and the next ones are sent without it at once."""
    control = served[0]
    monkeypatch.setattr(api, "ROUTES", tuple(dataclasses.replace(r, body=_FinishBodyOfSchema13)
                                             if r.op == "finish_task" else r for r in api.ROUTES))
    with TestClient(create_app(control, background=False)) as older:
        refused: list[str] = []
        worker, job_id, task_id, w = _remote_task(control, older)
        finish_task = worker.finish_task

        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return finish_task(*args, **kwargs)
            except Exception as exc:
                refused.append(str(exc))
                raise

        worker.finish_task = counted
        finish(worker, task_id, w, TaskOutcome(TaskState.SUCCEEDED, exit_code=0, usage=USED))
        assert control.get_job(job_id).state is JobState.SUCCEEDED
        assert control.get_job(job_id).tasks[0].usage is None
        assert len(refused) == 1 and "usage" in refused[0] and "no such field" in refused[0]
        job = control.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
        [a] = worker.poll_tasks(w, wait=0)
        worker.start_task(a.task_id, worker_id=w)
        finish(worker, a.task_id, w, TaskOutcome(TaskState.SUCCEEDED, exit_code=0, usage=USED))
        assert control.get_job(job.id).state is JobState.SUCCEEDED and len(refused) == 1


def test_the_openapi_document_names_the_header_of_the_answers_that_hold_it() -> None:
    """The answers with task records (a job's, a list of them) send ``usage`` only to a
    request that names it in ``Gpulayer-Reads``: a client written from the document alone
    found the field in the schema and never got it."""
    from gpulayer.server.openapi import openapi_document

    named = {}
    for methods in openapi_document()["paths"].values():
        for op in methods.values():
            for p in op.get("parameters", []):
                if p["in"] == "header":
                    named[op["operationId"]] = p
    assert set(named) == {"submit", "submit_many", "list_jobs", "get_job", "cancel", "cancel_many", "wait_job",
                          "wait_jobs"}
    for p in named.values():
        assert (p["name"].lower(), p["required"], p["schema"]["type"]) == (READS_HEADER, False, "string")
        assert "usage" in p["description"]
