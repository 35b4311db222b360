"""The slurm adapter with ``ssh_host``: Slurm's commands on a "login node" reached through a
real sshd on 127.0.0.1 (scripts/local-sshd.sh, which comes with the ssh provider), against
the real local Slurm.

Without scripts/local-sshd.sh in the checkout, or where it cannot start an sshd, these
tests skip with the reason, unless ``GPULAYER_REQUIRE_SSHD=1`` (set by ``.ci/run``).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpulayer_slurm import SlurmConfig, SlurmProvider
from pydantic import SecretStr

from gpulayer import plugin
from tests.providers.conftest import PILOT_PYTHONPATH, ROOT, LocalSlurm, node_home
from tests.support import wait_for

SSHD_SCRIPT = ROOT / "scripts" / "local-sshd.sh"


def _need(message: str) -> None:
    if os.environ.get("GPULAYER_REQUIRE_SSHD") == "1":
        pytest.fail(f"{message} (GPULAYER_REQUIRE_SSHD=1)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if not SSHD_SCRIPT.exists():
        _need("scripts/local-sshd.sh is not in this checkout (it comes with the ssh provider)")
    state = tmp_path_factory.mktemp("sshd")
    env = {**os.environ, "GPULAYER_SSHD_DIR": str(state)}
    out = subprocess.run([str(SSHD_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        _need(f"scripts/local-sshd.sh start exited {out.returncode}: {(out.stderr or out.stdout).strip()[-500:]}")
    try:
        yield dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    finally:
        subprocess.run([str(SSHD_SCRIPT), "stop"], env=env, capture_output=True, timeout=60)


def test_commands_run_on_the_login_node(slurm: LocalSlurm, sshd: dict[str, str], tmp_path: Path) -> None:
    config = SlurmConfig(
        ssh_host=sshd["GPULAYER_SSHD_HOST"], ssh_port=int(sshd["GPULAYER_SSHD_PORT"]),
        ssh_user=sshd["GPULAYER_SSHD_USER"], ssh_key=sshd["GPULAYER_SSHD_KEY"],
        ssh_known_hosts=sshd["GPULAYER_SSHD_KNOWN_HOSTS"], slurm_conf=slurm.conf, python=sys.executable,
        memory_gb=0.25, log_dir=str(tmp_path),
        # The login node's own environment has no PYTHONPATH for this checkout: hand it over.
        env={"PYTHONPATH": PILOT_PYTHONPATH, "GPULAYER_HOME": node_home(tmp_path)})
    provider = SlurmProvider("login", config)
    provider.check()
    offer = next(o for o in provider.offers(plugin.Requirements(accelerator="cuda")) if o.region == "gpu")
    label, token = f"ssh-{secrets.token_hex(4)}", f"glb_{secrets.token_hex(16)}"
    request = plugin.LaunchRequest(machine_id=f"m-{secrets.token_hex(4)}", label=label, offer=offer,
                                   control_url="http://127.0.0.1:9", bootstrap_token=SecretStr(token),
                                   join_deadline=time.time() + 120)
    launched = provider.launch(request)
    try:
        assert [m.provider_id for m in provider.list(label)] == [launched.provider_id]

        def worker_env() -> dict[str, str] | None:
            for entry in Path("/proc").iterdir():
                try:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if b"worker" in argv and request.machine_id.encode() in argv:
                        raw = (entry / "environ").read_bytes().decode().split("\0")
                        return dict(i.split("=", 1) for i in raw if "=" in i)
                except OSError:
                    continue
            return None

        env = wait_for(worker_env, 60, "the pilot's worker, submitted through SSH")
        assert env["GPULAYER_TOKEN"] == token and env["SLURM_JOB_ID"] == launched.provider_id
        shown = slurm.run("scontrol", "show", "job", launched.provider_id).stdout
        assert token not in shown
    finally:
        provider.terminate(request.machine_id, launched.provider_id)
        provider.terminate(request.machine_id, launched.provider_id)
    wait_for(lambda: provider.list(label) == [], 30, "the pilot job to end")
    provider.runner.close()  # type: ignore[attr-defined]
