"""A pilot job of the slurm adapter joins a real ``gpulayer server start`` and runs a cloud job
inside its Slurm allocation (the adapter driven by hand here, with a bootstrap token the
test makes; the provisioning pass that drives it by itself: test_slurm_provisioning.py)."""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpulayer_slurm import SlurmConfig, SlurmProvider
from pydantic import SecretStr

from gpulayer import plugin
from gpulayer.specs import CommandJob, Placement, Requirements
from tests.providers.conftest import PILOT_PYTHONPATH, LocalSlurm, node_home
from tests.server_support import Api, ServerProc
from tests.support import cli, wait_for

#: the pilot's worker sees one fake CUDA GPU (this machine has none); Slurm grants the real GRES
FAKE_CUDA = {"GPULAYER_PLUGINS": "gpulayer.fakes", "GPULAYER_FAKE_DEVICES": "cuda:1:16",
             "GPULAYER_DETECTORS": "none"}
SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "('SLURM_JOB_ID', 'CUDA_VISIBLE_DEVICES', 'GPULAYER_TOKEN')}))")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "3"}).start()
    yield proc
    proc.stop()


def _pilots(slurm: LocalSlurm, tmp_path: Path) -> SlurmProvider:
    return SlurmProvider("slurm", SlurmConfig(
        slurm_conf=slurm.conf, python=sys.executable, memory_gb=0.25, log_dir=str(tmp_path),
        env={**FAKE_CUDA, "PYTHONPATH": PILOT_PYTHONPATH, "GPULAYER_HEARTBEAT_INTERVAL": "0.3",
             "GPULAYER_HOME": node_home(tmp_path)}))


def _launch(provider: SlurmProvider, api: Api, server: ServerProc, label: str) -> tuple[str, str]:
    offer = next(o for o in provider.offers(plugin.Requirements(accelerator="cuda")) if o.region == "gpu")
    machine = f"m-{secrets.token_hex(4)}"
    launched = provider.launch(plugin.LaunchRequest(
        machine_id=machine, label=label, offer=offer, control_url=server.url,
        bootstrap_token=SecretStr(api.token_for("bootstrap")["token"]), join_deadline=time.time() + 120))
    return machine, launched.provider_id


def _online(api: Api, name: str) -> dict[str, Any] | None:
    return next((w for w in api("GET", "/v1/workers").json() if w["name"] == name and w["online"]), None)


def test_a_pilot_joins_and_a_cloud_job_runs_inside_the_allocation(slurm: LocalSlurm, server: ServerProc,
                                                                 tmp_path: Path) -> None:
    api = Api(server.url, server.admin_token)
    provider = _pilots(slurm, tmp_path)
    label = f"srv-{secrets.token_hex(3)}"
    offer = next(o for o in provider.offers(plugin.Requirements(accelerator="cuda")) if o.region == "gpu")
    machine, token = f"m-{secrets.token_hex(4)}", api.token_for("bootstrap")["token"]
    launched = provider.launch(plugin.LaunchRequest(
        machine_id=machine, label=label, offer=offer, control_url=server.url,
        bootstrap_token=SecretStr(token), join_deadline=time.time() + 120))
    try:
        worker = wait_for(lambda: _online(api, machine), 90, f"the pilot's worker {machine} to join")
        assert worker["origin"] == "provider"
        client = api.token_for("client")["token"]
        env = {"GPULAYER_URL": server.url, "GPULAYER_TOKEN": client}
        proc = cli("submit", "--target", "cloud", "--accelerator", "cuda", "--gpus", "1", "--",
                   sys.executable, "-c", SHOW_ENV, env=env, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen["SLURM_JOB_ID"] == launched.provider_id      # inside the pilot's allocation
        assert seen["CUDA_VISIBLE_DEVICES"] == "0"               # the one GPU granted to the job
        assert seen["GPULAYER_TOKEN"] != token                   # the spent bootstrap token is not handed on
    finally:
        provider.terminate(machine, launched.provider_id)
    wait_for(lambda: provider.list(label) == [], 60, "the pilot job to end")
    wait_for(lambda: _online(api, machine) is None, 60, "the worker to leave when its allocation is cancelled")


def test_scancel_from_outside_loses_the_task_and_the_job_is_retried(slurm: LocalSlurm, server: ServerProc,
                                                                   tmp_path: Path) -> None:
    api = Api(server.url, server.admin_token)
    provider = _pilots(slurm, tmp_path)
    label = f"srv-{secrets.token_hex(3)}"
    first, first_job = _launch(provider, api, server, label)
    try:
        wait_for(lambda: _online(api, first), 90, f"{first} to join")
        client = Api(server.url, api.token_for("client")["token"])
        marks = tmp_path / "runs"
        spec = CommandJob(command=["sh", "-c", f'echo "$SLURM_JOB_ID" >> {marks}; sleep 600'], retries=1,
                          placement=Placement(target="cloud"),
                          requirements=Requirements(accelerator="cuda", gpus=1))
        r = client("POST", "/v1/jobs", json={"spec": spec.model_dump(mode="json")})
        assert r.status_code in (200, 201), r.text
        job_id = r.json()["id"]
        wait_for(lambda: marks.exists() and marks.read_text().split() == [first_job], 60,
                 "the job to start in the first allocation")
        # Someone cancels the allocation from outside GPUlayer; a second machine is up to take the retry.
        slurm.run("scancel", first_job)
        _, second_job = _launch(provider, api, server, label)
        wait_for(lambda: marks.read_text().split() == [first_job, second_job], 120,
                 "the job to be retried in the second allocation")
        tasks = api("GET", f"/v1/jobs/{job_id}").json()["tasks"]
        assert tasks[0]["state"] == "lost"
        client("POST", f"/v1/jobs/{job_id}/cancel")
    finally:
        for m in provider.list(label):
            provider.terminate(m.machine_id, m.provider_id)
