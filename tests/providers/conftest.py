"""The provider tests' engines, started for real on this machine.

``slurm``: the single-node Slurm of ``scripts/local-slurm.sh`` (Debian's slurmctld, slurmd,
munge; fake GRES GPUs), started once per session (the script is idempotent; under xdist
a file lock makes the workers start it one at a time) and left running, as a developer's
would be. Where it cannot be started the tests skip with the script's message, unless
``GPULAYER_REQUIRE_SLURM=1`` (set by ``.ci/run``) makes that a failure. Outside CI the
script does not install missing packages (``GPULAYER_SLURM_INSTALL=0``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import first_detection, seed_probe_cache

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm.sh"
#: the PYTHONPATH of the workers these tests' pilot jobs and SSH hosts start: this checkout
#: and its plugins (a login node's or host's own environment has none for it)
PILOT_PYTHONPATH = os.environ.get("PYTHONPATH") or os.pathsep.join([str(ROOT), str(ROOT / "plugins")])
#: the folder of a test's ``tmp_path`` that is GPULAYER_HOME for the workers its pilot jobs start
NODE_HOME = "node-home"


def node_home(tmp_path: Path) -> str:
    """GPULAYER_HOME for the workers a test's Slurm pilot jobs start. Without one they would
    use ``~/.gpulayer`` of whoever runs the tests (a real node's default), and share its
    caches from one test, and one run, to the next."""
    return str(tmp_path / NODE_HOME)


@pytest.fixture(scope="session")
def pilot_probes() -> Path:
    """The probe cache a first detection with :data:`PILOT_PYTHONPATH` leaves, once per test
    process (:func:`tests.support.first_detection`): the homes of these tests' pilots and SSH
    hosts start with it, so their workers do not import torch for the framework probes
    again (each entry is still checked as always)."""
    return first_detection(PYTHONPATH=PILOT_PYTHONPATH)


@pytest.fixture(autouse=True)
def _seeded_node_home(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """:func:`node_home` starts as a home that detected before (:func:`pilot_probes`), for
    the tests that start pilots."""
    if "slurm" in request.fixturenames:
        seed_probe_cache(tmp_path / NODE_HOME, request.getfixturevalue("pilot_probes"))


@dataclass(frozen=True)
class LocalSlurm:
    dir: Path
    conf: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=30, check=check)


def _need(message: str) -> None:
    if os.environ.get("GPULAYER_REQUIRE_SLURM") == "1":
        pytest.fail(f"{message} (GPULAYER_REQUIRE_SLURM=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm() -> LocalSlurm:
    directory = Path(os.environ.get("GPULAYER_SLURM_DIR", "/tmp/gpulayer-slurm"))
    env = dict(os.environ)
    if os.environ.get("GPULAYER_REQUIRE_SLURM") != "1":
        env.setdefault("GPULAYER_SLURM_INSTALL", "0")
    if os.geteuid() != 0 and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode != 0:
        _need("the local Slurm needs root (or password-less sudo) to run slurmd")
    lock = Path(f"/tmp/gpulayer-slurm-{os.getuid()}.lock")
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            proc = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=600)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    if proc.returncode != 0:
        _need(f"scripts/local-slurm.sh start failed (exit {proc.returncode}): "
              f"{(proc.stdout + proc.stderr).strip()[-800:]}")
    return LocalSlurm(dir=directory, conf=str(directory / "slurm.conf"))
