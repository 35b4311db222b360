"""The device part of a task's environment (gpulayer.devices), as the worker agent builds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer import hookimpl, plugin, plugins
from gpulayer.control import TaskAssignment
from gpulayer.devices import task_environment
from gpulayer.specs import CommandJob
from gpulayer.testing import fake_devices_env
from gpulayer.worker.agent import Agent
from tests.factories import make_capabilities, make_cuda_devices, make_device

pytestmark = pytest.mark.usefixtures("gpulayer_isolated")

CUDA_HIDDEN = {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
ROCM_HIDDEN = {"ROCR_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}


class Spy:
    """Sees every call of the device environment hook first, and answers none."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    @hookimpl(tryfirst=True)
    def gpulayer_device_environment(self, kind, devices):
        self.calls.append((kind, [d.index for d in devices]))


@pytest.fixture
def spy(plugin_manager: plugins.PluginManager) -> Spy:
    s = Spy()
    plugin_manager.register(s, name="spy")
    return s


def task(accelerator: str | None, devices: list[int]) -> TaskAssignment:
    return TaskAssignment(task_id="tsk-1", job_id="job-1", attempt=1, node_rank=0,
                          accelerator=accelerator, devices=devices, spec=CommandJob(command=["true"]))


def agent_with(fake_accelerator, *kinds: str) -> Agent:
    """A worker whose capabilities came from fakes of ``kinds`` (standing in for the
    bundled detectors of those kinds)."""
    for kind in kinds:
        fake_accelerator(kind, count=2)
    found, _ = plugin.detect_devices(timeout=5)
    return Agent(object(), capabilities=make_capabilities(devices=found))  # type: ignore[arg-type]


def device_vars(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if "VISIBLE_DEVICES" in k or k == "CUDA_DEVICE_ORDER"}


def test_a_cuda_task_sees_its_gpu_and_no_rocm_device(fake_accelerator, spy, monkeypatch):
    for name in (*CUDA_HIDDEN, *ROCM_HIDDEN):
        monkeypatch.delenv(name, raising=False)
    agent = agent_with(fake_accelerator, "cuda", "rocm")
    env = agent.task_env(task("cuda", [1]), Path("."))
    assert device_vars(env) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **ROCM_HIDDEN}
    assert spy.calls == [("cuda", [1])]  # asked once, for the granted kind, never with []


def test_a_cpu_task_sees_no_device_and_the_hook_is_not_called(fake_accelerator, spy):
    agent = agent_with(fake_accelerator, "cuda", "rocm")
    env = agent.task_env(task(None, []), Path("."))
    assert device_vars(env) == {**CUDA_HIDDEN, **ROCM_HIDDEN}
    assert env["GPULAYER_ACCELERATOR"] == "cpu"
    assert spy.calls == []


def test_grant_order_is_kept(fake_accelerator, spy):
    agent = agent_with(fake_accelerator, "rocm")
    env = agent.task_env(task("rocm", [1, 0]), Path("."))
    assert device_vars(env) == {"ROCR_VISIBLE_DEVICES": "1,0", "HIP_VISIBLE_DEVICES": "0,1"}
    assert spy.calls == [("rocm", [1, 0])]


def test_a_kind_no_installed_plugin_knows_is_hidden_by_the_fakes_own_variable(fake_accelerator, spy):
    agent = agent_with(fake_accelerator, "cuda", "npu")
    env = agent.task_env(task("cuda", [0]), Path("."))
    assert device_vars(env)["NPU_VISIBLE_DEVICES"] == ""
    assert spy.calls == [("cuda", [0])]


def test_a_kind_without_a_detector_sets_nothing(spy):
    # devices of a kind whose plugin is gone since the worker detected them
    have = [*make_cuda_devices(1), make_device("tpu", 0)]
    assert task_environment(have, None, []) == CUDA_HIDDEN
    assert task_environment(have, "tpu", [0]) == CUDA_HIDDEN  # nobody answers for tpu
    assert spy.calls == [("tpu", [0])]


def test_the_hook_refuses_an_empty_device_list():
    with pytest.raises(ValueError, match="called only with granted devices; a task granted no cuda device "
                                         "gets the hide_env of the cuda detector instead"):
        plugins.device_environment("cuda", [])
    assert plugin.device_environment("cuda", []) == CUDA_HIDDEN


def test_a_fake_cuda_worker_in_another_process_gives_its_jobs_the_cuda_plugins_variables():
    code = ("import json\n"
            "from gpulayer import plugin\n"
            "from gpulayer.devices import task_environment\n"
            "found, _ = plugin.detect_devices(timeout=5)\n"
            "print(json.dumps([task_environment(found, 'cuda', [1]), task_environment(found, None, [])]))\n")
    env = {**os.environ, **fake_devices_env("cuda:2:80:9.0,npu:1")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    granted, cpu = json.loads(proc.stdout)
    assert granted == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NPU_VISIBLE_DEVICES": ""}
    assert cpu == {**CUDA_HIDDEN, "NPU_VISIBLE_DEVICES": ""}
