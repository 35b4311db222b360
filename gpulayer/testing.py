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
    registers a :class:`~gpulayer.fakes.FakeAcceleratorPlugin`, replacing the plugin that
    detects that kind (so ``kind="cuda"`` stands in for the bundled detector).
``gpulayer_isolated``
    all of the above plus plugin environment variables cleared and the real hardware
    hidden from the bundled detectors (no NVML, an empty KFD tree).
``fake_tool``
    ``fake_tool("nvidia-smi", stdout="...", exit_code=0, sleep=0)`` writes an executable
    that prints ``stdout`` and puts it first on ``PATH``; its ``.calls`` file records the
    arguments of every run.

For subprocesses, :func:`~gpulayer.fakes.fake_devices_env` gives the environment that makes
another process see fake devices. This module stays cheap: no framework imports.
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
    parse_fake_devices,
    visible_devices_var,
)

__all__ = ["FAKE_DEVICES_ENV", "FakeAcceleratorPlugin", "FakeTool", "fake_devices_env",
           "parse_fake_devices", "visible_devices_var", "write_fake_tool"]


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
        owner = plugin_manager.owner("gpulayer_accelerator_detectors", kind)
        if owner is not None:
            plugin_manager.unregister(owner)
        plugin_manager.register(plugin, name=plugin.name)
        return plugin

    return make


@pytest.fixture
def gpulayer_isolated(gpulayer_home: Path, plugin_manager: plugins.PluginManager,
                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fresh home and plugin manager, plugin env vars cleared, and the real hardware
    hidden (no NVML, an empty KFD tree), so a test sees only what its fixtures fake,
    even on a GPU machine. ``nvidia-smi`` etc. on PATH are still found: shadow them with
    ``fake_tool`` or empty ``PATH``."""
    for name in ("GPULAYER_DISABLE_PLUGINS", "GPULAYER_PLUGINS", FAKE_DEVICES_ENV,
                 "GPULAYER_MPS_FORCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_CUDA_NO_NVML", "1")
    empty_kfd = tmp_path / "no-kfd"
    empty_kfd.mkdir(exist_ok=True)
    monkeypatch.setenv("GPULAYER_KFD_ROOT", str(empty_kfd))


@pytest.fixture
def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeTool]:
    bindir = tmp_path / "fake-bin"
    bindir.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")

    def make(name: str, stdout: str = "", exit_code: int = 0, sleep: float = 0,
             stderr: str = "") -> FakeTool:
        return write_fake_tool(bindir, name, stdout, exit_code=exit_code, sleep=sleep, stderr=stderr)

    return make
