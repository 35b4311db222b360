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

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm.sh"


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
