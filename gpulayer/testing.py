"""Test helpers for GPUlayer and its plugin authors; also a pytest plugin (``pytest11``).

Fixtures (available in any project that has gpulayer installed):

``gpulayer_home``
    a fresh ``$GPULAYER_HOME`` under ``tmp_path``; returns its path.
``plugin_manager``
    a fresh process-wide plugin manager, loaded on first use (so set
    ``GPULAYER_DISABLE_PLUGINS`` / ``GPULAYER_PLUGINS`` with ``monkeypatch`` first) and
    forgotten after the test.
``fake_accelerator``
    ``fake_accelerator(kind="fakegpu", count=2, memory_gb=80, compute_capability="9.0")``
    registers a :class:`~gpulayer.fakes.FakeAcceleratorPlugin`, which stands in for the
    detector of that kind (``kind="cuda"`` replaces what the bundled cuda detector would
    find; the job environment still comes from the cuda plugin).
``gpulayer_isolated``
    all of the above plus plugin environment variables cleared and no installed detector
    run (``GPULAYER_DETECTORS=none``): a test sees only the devices it fakes, even on a
    GPU machine.
``fake_tool``
    ``fake_tool("nvidia-smi", stdout="...", exit_code=0, sleep=0)`` writes an executable
    that prints ``stdout`` and puts it first on ``PATH``; its ``.calls`` file records the
    arguments of every run.

For subprocesses, :func:`~gpulayer.fakes.fake_devices_env` gives the environment that makes
another process see fake devices, and :func:`~gpulayer.fakes.no_real_devices_env` the one
that hides the machine's real ones. This module stays cheap: no framework imports.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer import plugins
from gpulayer.fakes import (
    FAKE_DEVICES_ENV,
    FakeAcceleratorPlugin,
    fake_devices_env,
    no_real_devices_env,
    parse_fake_devices,
)

__all__ = ["FAKE_DEVICES_ENV", "FakeAcceleratorPlugin", "FakeTool", "fake_devices_env",
           "no_real_devices_env", "parse_fake_devices", "write_fake_tool"]


class FakeTool:
    """A fake executable written by :func:`write_fake_tool`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls_file = path.with_name(path.name + ".calls")

    @property
    def calls(self) -> list[str]:
        """The argument line of each run so far."""
        if not self.calls_file.exists():
            return []
        return self.calls_file.read_text().splitlines()


def write_fake_tool(directory: Path, name: str, stdout: str = "", *, exit_code: int = 0,
                    sleep: float = 0, stderr: str = "") -> FakeTool:
    """Write ``directory/name``: a POSIX shell script that records its arguments, sleeps
    ``sleep`` seconds, prints ``stdout``/``stderr`` and exits with ``exit_code``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    out_file = directory / f".{name}.stdout"
    err_file = directory / f".{name}.stderr"
    out_file.write_text(stdout)
    err_file.write_text(stderr)
    tool = FakeTool(path)
    lines = ["#!/bin/sh", f"printf '%s\\n' \"$*\" >> '{tool.calls_file}'"]
    if sleep:
        lines.append(f"sleep {sleep}")
    lines += [f"cat '{out_file}'", f"cat '{err_file}' >&2", f"exit {int(exit_code)}"]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return tool


@pytest.fixture
def gpulayer_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gpulayer-home"
    home.mkdir()
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    # no CLI server is left behind for a home that is gone after the test (docs/cli.md)
    monkeypatch.setenv("GPULAYER_CLI_SERVER_IDLE", "0")
    return home


@pytest.fixture
def plugin_manager() -> Iterator[plugins.PluginManager]:
    manager = plugins.PluginManager()
    plugins.reset_manager(manager)
    try:
        yield manager
    finally:
        plugins.reset_manager(None)


@pytest.fixture
def fake_accelerator(plugin_manager: plugins.PluginManager) -> Callable[..., FakeAcceleratorPlugin]:
    def make(kind: str = "fakegpu", count: int = 2, memory_gb: float | None = 80,
             compute_capability: str | None = "9.0", **kwargs: Any) -> FakeAcceleratorPlugin:
        plugin = FakeAcceleratorPlugin(kind, count, memory_gb, compute_capability, **kwargs)
        current = plugins.detectors().get(kind)
        if current is not None and current.stand_in:  # an earlier fake of this kind: the new one wins
            owner = plugin_manager.owner(plugins.DETECTORS_HOOK, kind)
            if owner is not None:
                plugin_manager.unregister(owner)
        plugin_manager.register(plugin, name=plugin.name)
        return plugin

    return make


@pytest.fixture
def gpulayer_isolated(gpulayer_home: Path, plugin_manager: plugins.PluginManager,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh home and plugin manager, plugin env vars cleared, and no installed detector
    run, so a test sees only what its fixtures fake, even on a GPU machine. A test that
    means to run an installed detector (against a ``fake_tool``) names its kind:
    ``monkeypatch.setenv("GPULAYER_DETECTORS", "cuda")``."""
    for name in (plugins.DISABLE_ENV, plugins.EXTRA_ENV, FAKE_DEVICES_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in no_real_devices_env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeTool]:
    bindir = tmp_path / "fake-bin"
    bindir.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")

    def make(name: str, stdout: str = "", exit_code: int = 0, sleep: float = 0,
             stderr: str = "") -> FakeTool:
        return write_fake_tool(bindir, name, stdout, exit_code=exit_code, sleep=sleep, stderr=stderr)

    return make
