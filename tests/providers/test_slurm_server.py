"""A pilot job of the slurm adapter joins a real ``gpulayer server start`` and runs a cloud job
inside its Slurm allocation (the adapter driven by hand here, with a bootstrap token the
test makes; the provisioning pass that drives it by itself: test_slurm_provisioning.py)."""

from __future__ import annotations

import json
import os
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
from tests.providers.conftest import ROOT, LocalSlurm
from tests.server_support import Api, ServerProc
from tests.support import cli, wait_for

#: the pilot's worker sees one fake CUDA GPU (this machine has none); Slurm grants the real GRES
FAKE_CUDA = {"GPULAYER_PLUGINS": "gpulayer.fakes", "GPULAYER_FAKE_DEVICES": "cuda:1:16",
             "GPULAYER_DETECTORS": "none"}
SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            "('SLURM_JOB_ID', 'CUDA_VISIBLE_DEVICES', 'GPULAYER_TOKEN')}))")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    proc = ServerProc(tmp_path / "server").start()
    yield proc
    proc.stop()


def _pythonpath() -> str:
    return os.environ.get("PYTHONPATH") or os.pathsep.join([str(ROOT), str(ROOT / "plugins")])


def test_a_pilot_joins_and_a_cloud_job_runs_inside_the_allocation(slurm: LocalSlurm, server: ServerProc,
                                                                 tmp_path: Path) -> None:
    api = Api(server.url, server.admin_token)
    provider = SlurmProvider("slurm", SlurmConfig(
        slurm_conf=slurm.conf, python=sys.executable, memory_gb=0.25, log_dir=str(tmp_path),
        env={**FAKE_CUDA, "PYTHONPATH": _pythonpath()}))
    offer = next(o for o in provider.offers(plugin.Requirements(accelerator="cuda")) if o.region == "gpu")
    label, machine = f"srv-{secrets.token_hex(3)}", f"m-{secrets.token_hex(4)}"
    token = api.token_for("bootstrap")["token"]
    launched = provider.launch(plugin.LaunchRequest(
        machine_id=machine, label=label, offer=offer, control_url=server.url,
        bootstrap_token=SecretStr(token), join_deadline=time.time() + 120))
    try:
        def joined() -> dict[str, Any] | None:
            return next((w for w in api("GET", "/v1/workers").json() if w["name"] == machine and w["online"]), None)

        worker = wait_for(joined, 90, f"the pilot's worker {machine} to join")
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
    wait_for(lambda: not any(w["name"] == machine and w["online"] for w in api("GET", "/v1/workers").json()),
             60, "the worker to leave when its allocation is cancelled")
