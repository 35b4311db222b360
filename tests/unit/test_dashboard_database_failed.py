"""The dashboard says a database that failed under a form as the API does: what failed, in
the database's words, and none of the server's paths (its log names them)."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpulayer.control import ControlPlane
from gpulayer.server.app import create_app
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store, _WriterLock


def test_a_form_the_database_could_not_store_says_so_without_the_servers_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "private-server-folder"
    control = ControlPlane(Store(f"sqlite:///{folder / 'gpulayer.db'}"), heartbeat_timeout=30)
    monkeypatch.setattr(_WriterLock, "WAIT", 0.2)
    try:
        with TestClient(create_app(control, background=False)) as tc:
            token = control.create_token(scope="client")
            assert tc.post("/login", data={"token": token.token}, follow_redirects=False).status_code == 303
            job = control.submit(CommandJob(command=["true"], placement=Placement(on_unschedulable="wait")),
                                 owner=token.id)
            page = tc.get(f"/jobs/{job.id}")
            assert page.status_code == 200, page.text
            found = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert found is not None
            fd = os.open(folder / "gpulayer.db.writers", os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # (another process, stopped while it writes)
                answer = tc.post(f"/jobs/{job.id}/cancel", data={"csrf": found.group(1)}, follow_redirects=False)
            finally:
                os.close(fd)
        assert answer.status_code == 503, answer.text
        assert "the server&#39;s database failed: the database is locked" in answer.text, answer.text
        assert "private-server-folder" not in answer.text
    finally:
        control.store.dispose()
