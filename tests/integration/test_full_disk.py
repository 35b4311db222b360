"""A full disk under the embedded database: what only reads still answers, what must write
says so in one line (real processes on a real full file system: a small tmpfs, which needs
root to mount; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer import plugins
from tests.support import cli, mount_small_tmpfs, seed_probe_cache, start_worker, stop_strays, wait_for


@pytest.fixture
def small_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probed_frameworks: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    mount_small_tmpfs(mount, "4m")
    home = mount / "home"
    home.mkdir()
    seed_probe_cache(home, probed_frameworks)
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    for name in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_WARM_CLI", "0")
    plugins.reset_manager()
    try:
        yield home
    finally:
        stop_strays(home)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_leaves_jobs_list_working_and_a_submit_says_why(small_home: Path) -> None:
    """`jobs list` opened the database by marking a dead worker's tasks lost first, a write:
    on a full disk it ended in SQLAlchemy's traceback, and so did every command."""
    worker = start_worker("--cpu-slots", "1")
    try:
        job_id = cli("submit", "--detach", "--", "sleep", "60", check=True).stdout.strip()
        wait_for(lambda: '"running"' in cli("jobs", "list", "--json").stdout, 60, "the job to run")
    finally:
        worker.kill()  # its process gone: the next command to open the home marks it offline, a write
        worker.wait(30)
    with open(small_home.parent / "filler", "wb") as f:  # the disk, full
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    listed = cli("jobs", "list")
    assert listed.returncode == 0, listed.stderr
    assert job_id in listed.stdout
    submitted = cli("submit", "--detach", "--", "true")
    assert submitted.returncode == 1
    assert "Traceback" not in submitted.stderr
    assert "error: the control plane's database failed: database or disk is full" in submitted.stderr
    os.unlink(small_home.parent / "filler")
    assert '"failed"' in cli("jobs", "list", "--json", check=True).stdout  # lost, once it can be written
