"""Integration fixtures: a private ``$GPULAYER_HOME``, and the CLI as a real subprocess."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer import plugins
from gpulayer.testing import no_real_devices_env
from tests.support import seed_probe_cache, start_worker, stop_strays, wait_for


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probed_frameworks: Path) -> Iterator[Path]:
    """A fresh GPULAYER_HOME for this test and every subprocess it starts; no real GPUs.
    Its framework probes' cache holds what this interpreter's probes found
    (tests/conftest.py: probed_frameworks); nothing else is in it."""
    h = tmp_path / "home"
    h.mkdir()
    seed_probe_cache(h, probed_frameworks)
    monkeypatch.setenv("GPULAYER_HOME", str(h))
    for name in ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_DISABLE_PLUGINS", "GPULAYER_PLUGINS",
                 "GPULAYER_FAKE_DEVICES", "GPULAYER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in no_real_devices_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPULAYER_HEARTBEAT_INTERVAL", "0.2")
    plugins.reset_manager()
    yield h
    plugins.reset_manager()
    stop_strays(h)  # (a detached job's background worker exits by itself only after 5 idle minutes)



class Plane:
    """One control plane the SDK and CLI tests run against, as a user would reach it.

    ``embedded``: SQLite in this test's ``$GPULAYER_HOME``; the SDK and CLI start a worker in
    their own process when a job needs one. ``server-sqlite`` / ``server-postgresql``: a real
    ``gpulayer server start`` process on loopback; the test process and every CLI subprocess
    reach it through ``GPULAYER_URL`` and a client token, and workers join it with a join
    token, exactly as on another machine.
    """

    def __init__(self, kind: str, home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                 database: str | None = None) -> None:
        self.kind = kind
        self.home = home
        self.tmp_path = tmp_path
        self.server: Any = None
        self.join_token: str | None = None
        self.workers: list[subprocess.Popen[str]] = []
        self._default_worker: subprocess.Popen[str] | None = None
        if kind != "embedded":
            from tests.server_support import Api, ServerProc

            self.server = ServerProc(tmp_path / "server", database=database,
                                     env={"GPULAYER_HEARTBEAT_TIMEOUT": "5"}).start()
            admin = Api(self.server.url, self.server.admin_token)
            self.join_token = admin.token_for("join")["token"]
            client_token = admin.token_for("client")["token"]
            monkeypatch.setenv("GPULAYER_URL", self.server.url)
            monkeypatch.setenv("GPULAYER_TOKEN", client_token)

    @property
    def embedded(self) -> bool:
        return self.kind == "embedded"

    def start_worker(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """``gpulayer worker start ARGS``: embedded here, or joining the server with a join token."""
        if self.embedded:
            proc = start_worker(*args, env=env)
        else:
            wenv = dict(env or {})
            wenv.pop("GPULAYER_TOKEN", None)
            proc = start_worker("--token", self.join_token or "", *args, env=wenv)
        self.workers.append(proc)
        return proc

    def ensure_worker(self) -> None:
        """A worker for tests that need "some worker": embedded jobs get one in their own
        process; a server needs a worker that joined it."""
        if not self.embedded and self._default_worker is None:
            self._default_worker = self.start_worker("--cpu-slots", "2")
            wait_for(lambda: len(self.online_workers()) >= 1, 60, "a worker to join the server")

    def online_workers(self) -> list[Any]:
        import gpulayer as gl

        return [w for w in gl.connect().api.list_workers() if w.online and not w.draining]

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if self.server is not None:
            self.server.stop()


@pytest.fixture(params=["embedded", "server-sqlite", "server-postgresql"])
def plane(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch,
          tmp_path: Path) -> Iterator[Plane]:
    database = request.getfixturevalue("postgres_url") if request.param == "server-postgresql" else None
    p = Plane(request.param, home, monkeypatch, tmp_path, database=database)
    try:
        yield p
    finally:
        p.close()
