"""What a real ``gpulayer server start`` leaves in its log and on disk (issue 13 §5): the
admin token is never printed, the home and the database are private, and a SIGTERM ends
with a line that says the server stopped."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from tests.server_support import Api, ServerProc

pytestmark = pytest.mark.timeout(120)


def test_the_server_logs_no_secret_keeps_its_files_private_and_says_it_stopped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)  # a home made before, by hand or by an older version
    srv = ServerProc(home)
    srv.start()
    try:
        token = srv.admin_token
        assert Api(srv.url, token)("GET", "/v1/jobs").status_code == 200
        log = srv.log()
        assert token not in log
        assert f"admin token created in {home.resolve() / 'admin.token'} (mode 0600" in log
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for p in home.iterdir():
            if p.name.startswith("gpulayer.db") or p.name in ("admin.token", "server.json"):
                assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    finally:
        srv.kill(signal.SIGTERM)
    log = srv.log()
    assert log.rstrip().endswith("gpulayer server stopped"), log
    assert srv.admin_token not in log
