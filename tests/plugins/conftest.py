"""The bundled plugins' own tests run their real detection code against fixtures (a fake
``nvidia-smi`` on PATH, a fake KFD tree), so these tests know the plugins' private switches,
which the core does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.testing import no_real_devices_env


@pytest.fixture(autouse=True)
def _isolated(gpulayer_isolated: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The bundled detectors run, and nothing but what a test fakes can answer them, even on
    a real GPU machine: no NVML (nvidia-smi is faked per test), an empty KFD tree, and no
    forced Apple GPU. Other installed detectors stay hidden."""
    for name, value in no_real_devices_env(keep=["cuda", "rocm", "mps"]).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPULAYER_CUDA_NO_NVML", "1")
    empty_kfd = tmp_path / "no-kfd"
    empty_kfd.mkdir(exist_ok=True)
    monkeypatch.setenv("GPULAYER_KFD_ROOT", str(empty_kfd))
    monkeypatch.delenv("GPULAYER_MPS_FORCE", raising=False)
    # the detectors honour the devices their own process was given (a test run on a GPU
    # machine may have them set); a test that means to sets them
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
