"""A real sshd on 127.0.0.1 for the ``ssh`` provider's tests (scripts/local-sshd.sh).

The ``local_sshd`` fixture (session-scoped) starts it in a state folder of the session's own
and stops it at the end; where ``GPULAYER_SSHD_DIR`` names the state folder of one already
started (``.ci/run`` does that, a developer may too) it uses that one and leaves it running.
Where sshd cannot start (no openssh-server installed) the tests that use it are skipped
with the reason, unless ``GPULAYER_REQUIRE_SSHD=1`` (set by ``.ci/run``), which makes that
a failure. Import the fixture into a test module with
``from tests.providers.ssh_support import local_sshd``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpulayer.testing import no_real_devices_env
from tests.providers.conftest import PILOT_PYTHONPATH
from tests.support import seed_probe_cache

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local-sshd.sh"


@dataclass(frozen=True)
class LocalSshd:
    host: str
    port: int
    user: str
    key_file: str
    known_hosts: str
    state: Path
    #: the probe cache the host's probe home starts with (tests/providers/conftest.py's pilot_probes)
    probes: Path | None = None

    def host_config(self, remote_state: Path, **extra: Any) -> dict[str, Any]:
        """One ``hosts`` entry of an ``ssh`` section for this sshd; the "host" runs workers
        with this test's Python and this checkout's code. Its probe home (where the provider
        detects what the host has) starts with :attr:`probes`; the homes of the machines it
        launches start empty, as on a real host."""
        if self.probes is not None:
            seed_probe_cache(remote_state / "probe-home", self.probes)
        env = {"PYTHONPATH": PILOT_PYTHONPATH,
               "GPULAYER_HEARTBEAT_INTERVAL": "0.3", **no_real_devices_env()}
        entry: dict[str, Any] = {"host": self.host, "port": self.port, "user": self.user, "key_file": self.key_file,
                                 "known_hosts": self.known_hosts, "python": sys.executable, "name": "local",
                                 "state_dir": str(remote_state), "environment": env}
        entry.update(extra)
        return entry


def _script(command: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPULAYER_SSHD_DIR": str(state)}
    return subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=60)


def start(state: Path) -> LocalSshd:
    """Start (or find) the sshd whose state is ``state``; ``RuntimeError`` says why not."""
    out = _script("start", state)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/local-sshd.sh start exited {out.returncode}: {out.stderr.strip() or out.stdout}")
    info = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return LocalSshd(host=info["GPULAYER_SSHD_HOST"], port=int(info["GPULAYER_SSHD_PORT"]),
                     user=info["GPULAYER_SSHD_USER"], key_file=info["GPULAYER_SSHD_KEY"],
                     known_hosts=info["GPULAYER_SSHD_KNOWN_HOSTS"], state=state)


def stop(state: Path) -> None:
    _script("stop", state)


@pytest.fixture(scope="session")
def local_sshd(tmp_path_factory: pytest.TempPathFactory, pilot_probes: Path) -> Iterator[LocalSshd]:
    given = os.environ.get("GPULAYER_SSHD_DIR")
    state = Path(given) if given else tmp_path_factory.mktemp("sshd")
    try:
        sshd = start(state)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        message = f"no local sshd for the ssh provider's tests: {exc}"
        if os.environ.get("GPULAYER_REQUIRE_SSHD") == "1":
            pytest.fail(f"{message} (GPULAYER_REQUIRE_SSHD=1)", pytrace=False)
        pytest.skip(message)
    try:
        yield dataclasses.replace(sshd, probes=pilot_probes)
    finally:
        if not given:
            stop(state)
