"""Jobs that wait for jobs they submitted, on workers with fewer CPU slots than such waits:
each waiting task lends its slot (gpulayer/lending.py, gpulayer/control/lending.py), so the
jobs it waits for run and nothing waits for ever; embedded (a real script and its worker) and
through a server (a remote worker, the task's own token)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_job, wait_workers

pytestmark = pytest.mark.timeout(300)

NESTED = """\
    import os

    import gpulayer as gl


    @gl.remote
    def inner(x):
        return x + 1


    @gl.remote(env={k: os.environ[k] for k in ("GPULAYER_URL", "GPULAYER_TOKEN") if k in os.environ})
    def outer(x):
        # a bounded wait: without the slot lent, the inner job queues behind this one and the
        # wait ends in TimeoutError (the job fails) instead of hanging the test
        return inner.remote(x).result(timeout=40) * 10
"""

RUN = """\
    import gpulayer as gl
    from nest import outer

    if __name__ == "__main__":
        print(sorted(h.result(timeout=120) for h in outer.map([1, 2, 3])))
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_waits_in_jobs_on_one_slot_lend_it_and_all_end(home: Path, tmp_path: Path) -> None:
    """Three jobs that each wait for a job of their own, on one CPU slot."""
    write(tmp_path / "nest.py", NESTED)
    script = write(tmp_path / "run.py", RUN)
    env = {**os.environ, "GPULAYER_CPU_SLOTS": "1", "GPULAYER_HEARTBEAT_INTERVAL": "0.2"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True, capture_output=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[20, 30, 40]", proc.stdout

    from gpulayer.control import ControlPlane
    from gpulayer.store import Store

    store = Store(f"sqlite:///{home / 'gpulayer.db'}")
    try:
        plane = ControlPlane(store)
        jobs = plane.list_jobs(limit=100)
        assert sorted(j.state.value for j in jobs) == ["succeeded"] * 6
        # (an outer task may end before its lender took the slot back: an ended task holds
        # nothing either way, tests/unit/test_lending.py)
    finally:
        store.dispose()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[dict[str, Any]]:
    srv = ServerProc(tmp_path / "server").start()
    admin = Api(srv.url, srv.admin_token)
    worker = start_remote_worker(srv.url, admin.token_for("join")["token"], tmp_path / "worker", cpu_slots=1)
    try:
        wait_workers(admin, 1)
        yield {"server": srv, "admin": admin}
    finally:
        stop_proc(worker, signal.SIGKILL)
        srv.stop()


def test_through_a_server_a_waiting_task_lends_its_slot_with_the_token_of_its_job(
        server: dict[str, Any], tmp_path: Path) -> None:
    srv, admin = server["server"], server["admin"]
    token = admin.token_for("client")["token"]
    write(tmp_path / "nest.py", NESTED)
    script = write(tmp_path / "run.py", RUN)
    env = {**os.environ, "GPULAYER_URL": srv.url, "GPULAYER_TOKEN": token, "GPULAYER_HOME": str(tmp_path / "client")}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True, capture_output=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[20, 30, 40]", proc.stdout

    # the route: another client's token cannot touch the task's slot (its job is not found)
    jobs = admin("GET", "/v1/jobs").json()
    outer_job = next(j for j in jobs if j["spec"].get("function") == "nest:outer")
    task_id = wait_job(admin, outer_job["id"])["tasks"][0]["id"]
    stranger = Api(srv.url, admin.token_for("client")["token"])
    r = stranger("POST", f"/v1/jobs/{outer_job['id']}/lend", json={"task_id": task_id, "lent": True})
    assert r.status_code == 404, r.text
    r = Api(srv.url, token)("POST", f"/v1/jobs/{outer_job['id']}/lend", json={"task_id": task_id, "lent": "yes"})
    assert r.status_code == 422 and "lent" in r.text, r.text
    # an ended task lends nothing
    r = Api(srv.url, token)("POST", f"/v1/jobs/{outer_job['id']}/lend", json={"task_id": task_id, "lent": True})
    assert r.status_code == 200 and r.json() == {"lent": False}, r.text
