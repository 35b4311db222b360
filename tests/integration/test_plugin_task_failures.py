"""A plugin a task needs that fails (a launcher's ``build``, the granted devices'
environment) fails that task with an error naming the plugin and its hook, in the job's
error and its output: not a crash of the worker with a traceback in its log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import plugin, plugins
from gpulayer.client import Client
from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidInput
from gpulayer.hookrecords import DeviceEnvironment, DistributedLauncher
from gpulayer.records import JobRecord, JobState
from gpulayer.specs import CommandJob, DistributedJob, Requirements
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from tests.factories import make_capabilities


class BadLaunchers:
    @plugin.hookimpl
    def gpulayer_distributed_launchers(self) -> list[DistributedLauncher]:
        def raises(job, rendezvous, node_rank, python):  # type: ignore[no-untyped-def]
            raise RuntimeError("launcher exploded")

        def picky(job):  # type: ignore[no-untyped-def]
            if job.args:
                raise ValueError(f"args {job.args!r}: this launcher takes none")

        def broken_check(job):  # type: ignore[no-untyped-def]
            raise TypeError("check exploded")

        return [DistributedLauncher(name="raises", build=raises),
                DistributedLauncher(name="garbage", build=lambda *_: "torchrun train.py"),
                DistributedLauncher(name="picky", build=raises, check=picky),
                DistributedLauncher(name="unchecked", build=raises, check=broken_check)]


class BadEnvironment:
    @plugin.hookimpl
    def gpulayer_device_environment(self, kind: str, devices: list[plugin.Device]) -> DeviceEnvironment | None:
        raise KeyError("no such table")


@pytest.fixture
def plane(home: Path, plugin_manager: plugins.PluginManager) -> Iterator[tuple[ControlPlane, Client]]:
    plugin_manager.register(BadLaunchers(), name="bad-launchers")
    plugin_manager.register(BadEnvironment(), name="bad-env")
    cp = ControlPlane(Store())
    client = Client(cp, location="embedded", default_target="local", control=cp)
    npu = plugin.Device(kind="npu", index=0, name="NPU 0")
    agent = Agent(cp, capabilities=make_capabilities(devices=[npu]), cpu_slots=1)
    agent.start()
    try:
        yield cp, client
    finally:
        agent.stop(grace=0)


def _run(cp: ControlPlane, client: Client, spec: CommandJob | DistributedJob) -> tuple[JobRecord, str]:
    job = cp.wait_job(cp.submit(client.prepare(spec)).id, timeout=120)
    return job, "".join(c.data for c in cp.logs(job.id))


@pytest.mark.parametrize(("launcher", "says"), [
    ("raises", "build() raised RuntimeError: launcher exploded"),
    ("garbage", "build() returned str; accepted: a LaunchCommand (gpulayer.plugin.LaunchCommand("),
])
def test_a_launcher_that_fails_is_named_in_the_jobs_error(plane, caplog, launcher, says) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    with caplog.at_level(logging.ERROR, logger="gpulayer"):
        job, output = _run(cp, client, DistributedJob(entry="train.py", launcher=launcher))
    assert job.state is JobState.FAILED and job.error is not None and job.error.type == "launcher"
    assert job.error.message.startswith(f"launcher {launcher!r} (plugin 'bad-launchers'): {says}")
    assert f"gpulayer: launcher {launcher!r} (plugin 'bad-launchers'): {says}" in output
    assert "crashed in the worker" not in caplog.text


def test_a_launcher_not_installed_says_which_are(plane) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    job, _ = _run(cp, client, DistributedJob(entry="train.py", launcher="nosuch"))
    assert job.error is not None and job.error.message.startswith(
        "launcher 'nosuch' is not installed on this worker (installed: garbage, picky, raises, torchrun")


def test_a_device_environment_that_fails_fails_the_task_naming_the_plugin(plane, caplog) -> None:  # type: ignore[no-untyped-def]
    """Without the environment the task would see every device of its kind: it fails instead."""
    cp, client = plane
    with caplog.at_level(logging.ERROR, logger="gpulayer"), pytest.warns(plugins.PluginWarning, match="'bad-env'"):
        job, output = _run(cp, client, CommandJob(command=["true"], requirements=Requirements(accelerator="npu")))
    assert job.state is JobState.FAILED and job.error is not None and job.error.type == "plugin"
    assert "no environment for the granted npu device(s)" in job.error.message and "'bad-env'" in job.error.message
    assert f"gpulayer: {job.error.message}" in output
    assert "crashed in the worker" not in caplog.text


def test_a_launchers_check_refuses_at_submit_and_a_check_that_fails_is_the_plugins_fault(plane) -> None:  # type: ignore[no-untyped-def]
    cp, client = plane
    with pytest.raises(InvalidInput, match=r"^launcher 'picky' cannot run this job: args \['x'\]: this launcher takes none$"):
        cp.submit(client.prepare(DistributedJob(entry="train.py", args=["x"], launcher="picky")))
    with pytest.warns(plugins.PluginWarning, match=r"launcher 'unchecked' \(plugin 'bad-launchers'\): check\(\) raised "
                                                  r"TypeError: check exploded; the job was not checked"):
        job, _ = _run(cp, client, DistributedJob(entry="train.py", launcher="unchecked"))
    assert job.error is not None and "build() raised RuntimeError: launcher exploded" in job.error.message


def test_a_check_that_fails_is_reported_once_though_a_submit_checks_twice(plane) -> None:  # type: ignore[no-untyped-def]
    """``client.prepare`` and the control plane both run the launcher's ``check``: one warning
    (docs/plugins.md: each failure is reported once per plugin and hook)."""
    cp, client = plane
    with pytest.warns(plugins.PluginWarning) as caught:
        for _ in range(2):
            _run(cp, client, DistributedJob(entry="train.py", launcher="unchecked"))
    assert [str(w.message) for w in caught if "check()" in str(w.message)] == [
        "launcher 'unchecked' (plugin 'bad-launchers'): check() raised TypeError: check exploded; the job was not checked"]
