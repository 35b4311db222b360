"""The cloud target through the local Slurm, end to end: a real ``gpulayer server start
--providers FILE`` whose providers are ``type = "slurm"`` sections, the provisioning pass
launching pilot jobs with ``sbatch``, their workers joining with bootstrap tokens, and
``scancel`` when a machine is idle, late or lost.

The pilot's worker is given one fake CUDA GPU (``gpulayer.fakes``: this machine has none);
Slurm grants the allocation one of its two fake GRES GPUs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.providers.conftest import PILOT_PYTHONPATH, LocalSlurm, node_home
from tests.server_support import Api, ServerProc, base_env, provider_server, until, wait_job
from tests.support import cli

pytestmark = pytest.mark.timeout(300)

SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "('SLURM_JOB_ID', 'CUDA_VISIBLE_DEVICES')}))")


def section(name: str, slurm: LocalSlurm, logs: Path, *, partition: str = "gpu", idle: str = "4s",
            join: str = "120s", extra: str = "") -> str:
    env = {"GPULAYER_PLUGINS": "gpulayer.fakes", "GPULAYER_FAKE_DEVICES": "cuda:1:16",
           "GPULAYER_DETECTORS": "none", "GPULAYER_HEARTBEAT_INTERVAL": "0.3", "PYTHONPATH": PILOT_PYTHONPATH,
           "GPULAYER_HOME": node_home(logs)}
    env_line = "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }"
    return "\n".join([
        f"[{name}]", 'type = "slurm"', f"partitions = [{json.dumps(partition)}]", "max_machines = 2",
        f'idle_timeout = "{idle}"', f'join_timeout = "{join}"', f"slurm_conf = {json.dumps(slurm.conf)}",
        f"python = {json.dumps(sys.executable)}", "memory_gb = 0.25", f"log_dir = {json.dumps(str(logs))}",
        env_line, extra, ""])


@pytest.fixture
def servers(slurm: LocalSlurm) -> Iterator[list[tuple[ServerProc, Api]]]:
    started: list[tuple[ServerProc, Api]] = []
    yield started
    # A stopped server terminates nothing (its machines rejoin a restarted one): end the
    # test's pilot jobs here, so that none outlives the test.
    for srv, api in started:
        ids = {m["id"] for m in machines(api)}
        srv.stop()
        for job in live_pilots(slurm, ids):
            slurm.run("scancel", job, check=False)
        until(lambda ids=ids: live_pilots(slurm, ids) == [], 60, "the test's pilot jobs to end")


def start(servers: list[tuple[ServerProc, Api]], home: Path, toml: str) -> tuple[ServerProc, Api]:
    srv = provider_server(home, toml, plugins="gpulayer_slurm").start()
    api = Api(srv.url, srv.admin_token)
    servers.append((srv, api))
    return srv, api


def submit(api: Api, spec: dict[str, Any]) -> str:
    r = api("POST", "/v1/jobs", json={"spec": spec})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def machines(api: Api) -> list[dict[str, Any]]:
    return list(api("GET", "/v1/machines").json())


def live_pilots(slurm: LocalSlurm, machine_ids: set[str]) -> list[str]:
    """Job ids of the live pilot jobs of these machines (squeue also shows recently ended jobs)."""
    jobs = json.loads(slurm.run("squeue", "--json").stdout)["jobs"]
    out = []
    for j in jobs:
        state = j["job_state"][0] if isinstance(j["job_state"], list) else j["job_state"]
        if j["name"].removeprefix("gpulayer-") in machine_ids and state in ("PENDING", "RUNNING", "COMPLETING"):
            out.append(str(j["job_id"]))
    return out


def cloud_line(srv: ServerProc, job_id: str) -> str:
    out = cli("--url", srv.url, "--token", srv.admin_token, "jobs", "show", job_id, env=base_env(srv.home))
    assert out.returncode == 0, out.stderr
    return next(x for x in out.stdout.splitlines() if x.startswith("cloud"))


def test_a_cloud_job_runs_inside_a_slurm_allocation_and_the_idle_machine_is_cancelled(
        slurm: LocalSlurm, servers: list[tuple[ServerProc, Api]], tmp_path: Path) -> None:
    srv, api = start(servers, tmp_path / "srv", section("slurm", slurm, tmp_path))
    job_id = submit(api, {"kind": "command", "command": [sys.executable, "-c", SHOW_ENV],
                          "requirements": {"accelerator": "cuda", "gpus": 1}, "placement": {"target": "cloud"}})
    job = wait_job(api, job_id, 180)
    assert job["state"] == "succeeded", job
    [m] = machines(api)
    seen = json.loads("".join(c["data"] for c in api("GET", f"/v1/jobs/{job_id}/logs").json()))
    assert seen == {"SLURM_JOB_ID": m["provider_id"], "CUDA_VISIBLE_DEVICES": "0"}
    assert (m["provider"], m["shape"], m["job_id"]) == ("slurm", "4cpu-4gb-1xfake", job_id)
    worker = next(w for w in api("GET", "/v1/workers").json() if w["id"] == m["worker_id"])
    assert (worker["origin"], worker["name"]) == ("provider", m["id"])
    assert f"slurm/gpu/4cpu-4gb-1xfake: launched {m['id']} (" in cloud_line(srv, job_id)
    # idle for 4 s: drained and cancelled; nothing of it is left in Slurm's queue
    ended = until(lambda: [x for x in machines(api) if x["state"] == "terminated"], 90, "the idle machine's end")[0]
    assert ended["reason"] == "idle for 4 s"
    until(lambda: live_pilots(slurm, {m["id"]}) == [], 60, "the pilot job to leave squeue")
    assert not any(w["online"] for w in api("GET", "/v1/workers").json())


def test_a_pending_allocation_past_its_join_deadline_fails_over(
        slurm: LocalSlurm, servers: list[tuple[ServerProc, Api]], tmp_path: Path) -> None:
    # Partition "short" allows 10 minutes; a pilot asking for an hour is accepted and stays
    # pending (PartitionTimeLimit) although sinfo shows the node idle: the offer looks good.
    toml = (section("held", slurm, tmp_path, partition="short", join="6s", extra='time_limit = "1:00:00"')
            + section("slurm", slurm, tmp_path))
    srv, api = start(servers, tmp_path / "srv", toml)
    job_id = submit(api, {"kind": "command", "command": [sys.executable, "-c", SHOW_ENV],
                          "requirements": {"accelerator": "cuda", "gpus": 1}, "placement": {"target": "cloud"}})
    job = wait_job(api, job_id, 180)
    assert job["state"] == "succeeded", job
    held = [m for m in machines(api) if m["provider"] == "held"]
    used = next(m for m in machines(api) if m["provider"] == "slurm")
    # Every shape of the held partition is its own scope: each was tried, waited for, cancelled.
    assert held and all((m["state"], m["reason"]) == ("failed", "did not join within 6 s") for m in held)
    assert live_pilots(slurm, {m["id"] for m in held}) == []  # their pending jobs were cancelled
    line = cloud_line(srv, job_id)
    assert line.startswith(f"cloud     held/short/4cpu-4gb-1xfake: launched {held[0]['id']} (")
    assert f"{held[-1]['id']} did not join within 6 s; terminated -> slurm/gpu/" in line
    assert line.endswith(f"joined as {used['worker_id']}")
    seen = json.loads("".join(c["data"] for c in api("GET", f"/v1/jobs/{job_id}/logs").json()))
    assert seen["SLURM_JOB_ID"] == used["provider_id"]


def test_scancel_of_the_pilot_from_outside_loses_the_task_and_the_job_is_retried(
        slurm: LocalSlurm, servers: list[tuple[ServerProc, Api]], tmp_path: Path) -> None:
    _, api = start(servers, tmp_path / "srv", section("slurm", slurm, tmp_path, idle="60s"))
    marks = tmp_path / "runs"
    job_id = submit(api, {"kind": "command", "retries": 1,
                          "command": ["sh", "-c", f'echo "$SLURM_JOB_ID" >> {marks}; sleep 600'],
                          "requirements": {"accelerator": "cuda", "gpus": 1}, "placement": {"target": "cloud"}})
    until(lambda: marks.exists() and len(marks.read_text().split()) == 1, 120, "the first attempt to start")
    first = marks.read_text().split()[0]
    slurm.run("scancel", first)  # someone cancels the allocation, not GPUlayer
    until(lambda: len(marks.read_text().split()) == 2, 180, "the job to be retried on a new machine")
    second = marks.read_text().split()[1]
    assert second != first
    job = api("GET", f"/v1/jobs/{job_id}").json()
    assert [t["state"] for t in job["tasks"]][:1] == ["lost"]
    assert job["state"] == "running"
    by_job = {m["provider_id"]: m for m in machines(api)}
    assert by_job[second]["state"] not in ("terminating", "terminated", "failed")
    assert job["tasks"][-1]["worker_id"] == by_job[second]["worker_id"]  # the retry runs on the new machine
    until(lambda: by_job[first]["id"] not in {m["id"] for m in machines(api)
                                              if m["state"] not in ("terminated", "failed")},
          60, "the cancelled machine to be written off")
    api("POST", f"/v1/jobs/{job_id}/cancel")
    api("POST", f"/v1/machines/{by_job[second]['id']}/terminate")
    until(lambda: live_pilots(slurm, {m["id"] for m in machines(api)}) == [], 90, "every pilot job to end")
