"""Integration fixtures: a private ``$GPULAYER_HOME``, and the CLI as a real subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import plugins


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh GPULAYER_HOME for this test and every subprocess it starts; no real GPUs."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("GPULAYER_HOME", str(h))
    for name in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_DISABLE_PLUGINS", "GPULAYER_PLUGINS",
                 "GPULAYER_FAKE_DEVICES", "GPULAYER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_CUDA_NO_NVML", "1")
    kfd = tmp_path / "no-kfd"
    kfd.mkdir()
    monkeypatch.setenv("GPULAYER_KFD_ROOT", str(kfd))
    monkeypatch.setenv("GPULAYER_HEARTBEAT_INTERVAL", "0.2")
    plugins.reset_manager()
    yield h
    plugins.reset_manager()

