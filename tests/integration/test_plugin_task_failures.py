"""A plugin a task needs that fails (a launcher's ``build``, the granted devices'
environment) fails that task with an error naming the plugin and its hook, in the job's
error and its output: not a crash of the worker with a traceback in its log; and so does
one whose error names a path that is not UTF-8, through a server too."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import plugin, plugins
from gpulayer.client import Client, http_client
from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidInput
from gpulayer.hookrecords import DeviceEnvironment, DistributedLauncher
from gpulayer.http_client import connect_http
from gpulayer.records import JobRecord, JobState
from gpulayer.specs import CommandJob, DistributedJob, Requirements
from gpulayer.store import Store
from gpulayer.worker.agent import Agent
from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc

#: a path with a byte that is not UTF-8, as Python decodes it (``surrogateescape``)
NOT_UTF8 = b"/sys/class/npu/card\xff".decode("utf-8", "surrogateescape")


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

        def unreadable(job, rendezvous, node_rank, python):  # type: ignore[no-untyped-def]
            raise RuntimeError(f"cannot read {NOT_UTF8}")

        return [DistributedLauncher(name="raises", build=raises),
                DistributedLauncher(name="garbage", build=lambda *_: "torchrun train.py"),
                DistributedLauncher(name="picky", build=raises, check=picky),
                DistributedLauncher(name="unchecked", build=raises, check=broken_check),
                DistributedLauncher(name="unreadable", build=unreadable)]


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


@pytest.mark.parametrize("where", ["embedded", "server"])
def test_a_plugin_error_naming_a_path_that_is_not_utf8_reaches_the_jobs_output_and_error(
        home: Path, plugin_manager: plugins.PluginManager, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        where: str) -> None:
    """The worker's own line in a task's output (why the task did not run) held a lone
    surrogate: through a server its upload could not be encoded, and was tried again until the
    worker gave up on it (the output after it lost too); the job's error could not be built,
    and the task ended as "worker error: ValidationError ...". Now the line holds U+FFFD, as
    the task's own output would, and the error the escape, as for a function's exception."""
    plugin_manager.register(BadLaunchers(), name="bad-launchers")
    said = f"launcher 'unreadable' (plugin 'bad-launchers'): build() raised RuntimeError: cannot read {NOT_UTF8}"
    srv = ServerProc(tmp_path / "server").start() if where == "server" else None
    try:
        if srv is None:
            cp = ControlPlane(Store())
            client, api, registered = Client(cp, location="embedded", default_target="local", control=cp), cp, None
        else:
            client = http_client(srv.url, token=srv.admin_token, retry_for=10)
            api = connect_http(srv.url, retry_for=2)
            joined = api.join_worker(make_capabilities(), join_token=Api(srv.url, srv.admin_token).token_for("join")["token"],
                                     cpu_slots=1)
            api.token, registered = joined.token, joined.worker
        agent = Agent(api, capabilities=make_capabilities(), registered=registered, cpu_slots=1)
        agent.report_for = 10.0  # (how long a shipment that fails is tried again: 600 s)
        agent.start()
        try:
            with caplog.at_level(logging.WARNING, logger="gpulayer"):
                job = client.wait(client.submit(DistributedJob(entry="train.py", launcher="unreadable")).id, timeout=120)
        finally:
            agent.stop(grace=0)
        output = "".join(c.data for c in client.log_chunks(job.id))
    finally:
        if srv is not None:
            srv.stop()
    assert output == f"gpulayer: {said}\n".replace("\udcff", "\ufffd")
    assert job.state is JobState.FAILED and job.error is not None
    assert (job.error.type, job.error.message) == ("launcher", said.replace("\udcff", "\\udcff"))
    assert "crashed in the worker" not in caplog.text and "could not ship" not in caplog.text
