"""A cancel reaches the worker through its long poll, not its next heartbeat.

The workers here heartbeat once an hour, so a cancelled task that ends (its process tree
gone) was ended by what the long poll answered. The tests assert the mechanism, not a time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import psutil

from gpulayer.records import JobState, TaskState
from gpulayer.specs import CommandJob
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, until, wait_workers

SLEEPER = [sys.executable, "-c", "import subprocess, sys, time; "
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"]


def _tree_gone(marker_pids: list[int]) -> bool:
    return not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in marker_pids)


def _task_pids(job_id: str) -> list[int]:
    """The processes of the job's task (each carries the job id in its environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("GPULAYER_JOB_ID") == job_id:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_an_embedded_worker_hears_a_cancel_through_its_poll(home: Path) -> None:
    from gpulayer.control import ControlPlane
    from gpulayer.store import Store
    from gpulayer.worker.agent import Agent
    from tests.factories import make_capabilities

    cp = ControlPlane(Store())
    beats: list[str] = []
    heartbeat = cp.heartbeat

    def counted(worker_id: str, **kw: object) -> object:
        beats.append(worker_id)
        return heartbeat(worker_id, **kw)  # type: ignore[arg-type]

    cp.heartbeat = counted  # type: ignore[method-assign]
    agent = Agent(cp, capabilities=make_capabilities(), cpu_slots=1, heartbeat_interval=3600, poll_wait=30)
    agent.start()
    try:
        job = cp.submit(CommandJob(command=SLEEPER))
        until(lambda: len(_task_pids(job.id)) == 2, 60, "the task and its child running")
        pids = _task_pids(job.id)
        cp.cancel(job.id)
        until(lambda: _tree_gone(pids), 30, "the cancelled task's process tree gone")
        done = until(lambda: cp.get_job(job.id) if cp.get_job(job.id).state.terminal else None, 30, "job ended")
        assert done.state is JobState.CANCELLED
        assert [t.state for t in done.tasks] == [TaskState.CANCELLED]
        assert beats == [], "the worker sent a heartbeat: the cancel was not heard through the poll"
    finally:
        agent.stop(grace=0)


def test_a_remote_worker_hears_a_cancel_through_its_poll(tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "600"}).start()
    worker = None
    try:
        api = Api(server.url, server.admin_token)
        join = api.token_for("join")["token"]
        worker = start_remote_worker(server.url, join, tmp_path / "worker", cpu_slots=1,
                                     env={"GPULAYER_HEARTBEAT_INTERVAL": "3600"})
        wait_workers(api, 1)
        r = api("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": SLEEPER,
                                                          "placement": {"target": "remote"}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        until(lambda: len(_task_pids(job_id)) == 2, 60, "the task and its child running")
        pids = _task_pids(job_id)
        assert api("POST", f"/v1/jobs/{job_id}/cancel", json={}).status_code == 200
        until(lambda: _tree_gone(pids), 30, "the cancelled task's process tree gone")
        until(lambda: api("GET", f"/v1/jobs/{job_id}").json()["state"] == "cancelled", 30, "job cancelled")
    finally:
        stop_proc(worker)
        server.stop()
