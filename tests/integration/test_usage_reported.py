"""What a task used, end to end: a forked FunctionJob's count from its fork server, and a
command's through ``gpulayer submit`` and ``gpulayer jobs show`` (docs/concepts.md, "Resource
usage"; the parts: tests/unit/test_task_usage.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.records import JobState
from gpulayer.specs import FunctionJob
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from gpulayer.worker.forking import FORKED
from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc, base_env, joined_worker
from tests.support import cli

MODULE = """
import time

def burn(seconds, size):
    block = bytearray(size)
    for i in range(0, len(block), 4096):
        block[i] = 1
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return len(block)
"""


@pytest.fixture
def plane(home: Path) -> Iterator[tuple[ControlPlane, Client]]:
    cp = ControlPlane(Store())
    agent = Agent(cp, capabilities=make_capabilities(), cpu_slots=1)
    agent.start()
    try:
        yield cp, Client(cp, location="embedded", default_target="local", control=cp)
    finally:
        agent.stop(grace=0)


def test_a_forked_function_has_what_it_used_counted_by_its_fork_server(
        plane: tuple[ControlPlane, Client], tmp_path: Path) -> None:
    cp, client = plane
    (tmp_path / "jobmod.py").write_text(MODULE)
    size = 64 * 2**20
    job = cp.submit(client.prepare(FunctionJob(function="jobmod:burn", args=[0.3, size], bundle=str(tmp_path))))
    done = cp.wait_job(job.id, timeout=120)
    assert done.state is JobState.SUCCEEDED, done.error
    assert [e.message for e in cp.events(job.id) if e.kind == "task_started"] == [FORKED]
    used = done.tasks[0].usage
    assert used is not None and used.cpu >= 0.3
    # (a forked task's count starts from its fork server's resident set, which it uses: no bound)
    assert used.max_rss is not None and used.max_rss >= size and used.max_rss_at_most is None


def test_jobs_show_says_what_a_command_used(home: Path, tmp_path: Path) -> None:
    (tmp_path / "burn.py").write_text(MODULE + "\nimport sys\nburn(0.3, 0)\n")
    submitted = cli("submit", "--json", "--bundle", str(tmp_path), "--", "python", "burn.py", check=True, timeout=120)
    job = json.loads(submitted.stdout)["id"]
    show = cli("jobs", "show", job, check=True).stdout.splitlines()
    task = next(i for i, line in enumerate(show) if line.startswith("task      "))
    used = re.fullmatch(r" {10}ran (\d+\.\d\d) s, CPU (\d+\.\d\d) s \(user \d+\.\d\d s, system \d+\.\d\d s\), "
                        r"peak memory (at most )?\d+\.\d [KMG]B( \(counted from its worker's peak\))?", show[task + 1])
    assert used is not None, show
    assert float(used.group(2)) >= 0.3
    [record] = json.loads(cli("jobs", "show", job, "--json", check=True).stdout)["tasks"]
    assert record["usage"]["cpu_user"] + record["usage"]["cpu_system"] >= 0.3


def test_a_server_on_postgresql_keeps_it_and_shows_it_to_those_who_read_it(
        tmp_path: Path, postgres_url: str) -> None:
    """A worker's report through a real server (PostgreSQL): the job's dashboard page and a
    client of this version show it; a request without ``Gpulayer-Reads`` (an older client's)
    gets the task's record without it."""
    server = ServerProc(tmp_path / "home", database=postgres_url).start()
    try:
        admin = Api(server.url, server.admin_token)
        worker_id, worker = joined_worker(server.url, admin)
        r = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"],
                                                      "placement": {"target": "remote"}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        [task] = worker("GET", f"/v1/workers/{worker_id}/tasks", params={"wait": 10}).json()
        assert worker("POST", f"/v1/tasks/{task['task_id']}/start").status_code == 204
        used = {"cpu_user": 12.5, "cpu_system": 0.75, "max_rss": 3 * 2**30}
        r = worker("POST", f"/v1/tasks/{task['task_id']}/finish",
                   json={"state": "succeeded", "exit_code": 0, "usage": used})
        assert r.status_code == 200, r.text
        [older] = admin("GET", f"/v1/jobs/{job_id}").json()["tasks"]
        assert "usage" not in older and older["state"] == "succeeded"
        [newer] = admin("GET", f"/v1/jobs/{job_id}", headers={"Gpulayer-Reads": "usage"}).json()["tasks"]
        assert newer["usage"] == used
        shown = cli("--url", server.url, "--token", server.admin_token, "jobs", "show", job_id, env=base_env(server.home),
                    check=True).stdout
        assert "CPU 13.25 s (user 12.50 s, system 0.75 s), peak memory 3.0 GB" in shown
        page = httpx.Client(base_url=server.url, timeout=30, verify=False)
        assert page.post("/login", data={"token": server.admin_token}).status_code == 303
        assert "CPU 13.25 s (user 12.50 s, system 0.75 s), peak memory 3.0 GB" in page.get(f"/jobs/{job_id}").text
    finally:
        server.stop()
