"""``gpulayer dashboard`` as a real process over an embedded home: loopback only, its own
login token, changes made by other processes arriving on the live stream, a clean stop."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from gpulayer.control import ControlPlane
from gpulayer.specs import CommandJob, Placement
from gpulayer.store import Store
from tests.server_support import base_env, free_port
from tests.support import cli, wait_for

pytestmark = pytest.mark.timeout(180)


class Dashboard:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.log_path = home / "dashboard.log"
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "gpulayer.cli", "dashboard", "--port", str(self.port)],
                                     env=base_env(home), stdout=log, stderr=subprocess.STDOUT, text=True)
        log.close()
        self.url = f"http://127.0.0.1:{self.port}"

        def token() -> str | None:
            assert self.proc.poll() is None, self.log_path.read_text()
            m = re.search(r"^\s+(gld_\S+)$", self.log_path.read_text(), re.M)
            return m.group(1) if m else None

        self.token: str = wait_for(token, 60, "gpulayer dashboard to print its login token")
        wait_for(self._up, 30, "gpulayer dashboard to answer")

    def _up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/login", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture
def dashboard(home: Path) -> Iterator[Dashboard]:
    d = Dashboard(home)
    yield d
    d.stop()


def submit_embedded(name: str) -> str:
    """A job in the home's embedded control plane, as another process (the SDK, the CLI) adds it."""
    control = ControlPlane(Store())
    try:
        spec = CommandJob(command=["true"], name=name, placement=Placement(on_unschedulable="wait"))
        return control.submit(spec).id
    finally:
        control.store.dispose()


def test_gpulayer_dashboard_serves_the_embedded_home_with_its_own_login_token(home: Path,
                                                                             dashboard: Dashboard) -> None:
    log = dashboard.log_path.read_text()
    assert f"gpulayer dashboard on http://127.0.0.1:{dashboard.port}/" in log and str(home) in log
    job_id = submit_embedded("before")
    c = httpx.Client(base_url=dashboard.url, timeout=30, follow_redirects=False)
    assert c.get("/jobs").status_code == 303
    refused = c.post("/login", data={"token": "gld_" + "x" * 43})
    assert refused.status_code == 401 and "each start of" in refused.text
    r = c.post("/login", data={"token": dashboard.token})
    assert r.status_code == 303 and "samesite=strict" in r.headers["set-cookie"].lower()
    page = c.get("/jobs")
    assert page.status_code == 200 and job_id in page.text
    assert "this dashboard&#39;s login token" in page.text
    # the login token is not an API token: the API of this process has no tokens to take
    assert httpx.get(f"{dashboard.url}/v1/jobs", headers={"authorization": f"Bearer {dashboard.token}"}).status_code == 401
    # a job another process adds reaches an open live stream (no wake-up crosses processes:
    # the stream looks again by itself)
    seen = []
    deadline = time.monotonic() + 60
    with c.stream("GET", "/live/jobs") as stream:
        assert stream.status_code == 200
        later = None
        for line in stream.iter_lines():  # a line at least every 15 s (keepalives)
            if time.monotonic() > deadline:
                break
            if line.startswith("data: ") and "live_jobs_rows" in line:
                rows = json.loads(line[6:])["live_jobs_rows"]
                seen.append(rows)
                if later is None:
                    later = submit_embedded("after")
                elif later in rows:
                    break
    assert later is not None and later in seen[-1]
    listening = [c.laddr for c in psutil.Process(dashboard.proc.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
    # SIGTERM stops it with a live stream open (uvicorn ends by raising the signal again)
    with c.stream("GET", "/live/overview") as stream:
        assert stream.status_code == 200
        assert dashboard.stop() == -signal.SIGTERM
    assert "Traceback" not in dashboard.log_path.read_text()


def test_the_login_token_is_new_at_every_start(home: Path) -> None:
    first = Dashboard(home)
    token = first.token
    first.stop()
    second = Dashboard(home)
    try:
        assert second.token != token
        r = httpx.post(f"{second.url}/login", data={"token": token})
        assert r.status_code == 401
        assert not (home / "gpulayer.db").read_bytes().count(token.encode())  # never stored
    finally:
        second.stop()


def test_gpulayer_dashboard_refuses_a_server_url(home: Path) -> None:
    r = cli("--url", "http://127.0.0.1:9", "dashboard", env={"GPULAYER_HOME": str(home)})
    assert r.returncode == 2
    assert "serves its own dashboard at http://127.0.0.1:9/" in r.stderr


def test_gpulayer_dashboard_says_when_its_port_is_taken(home: Path, dashboard: Dashboard) -> None:
    r = cli("dashboard", "--port", str(dashboard.port), env={"GPULAYER_HOME": str(home)})
    assert r.returncode == 2
    assert f"cannot listen on 127.0.0.1:{dashboard.port}" in r.stderr and "--port" in r.stderr


def test_gpulayer_dashboard_refuses_a_bad_log_level_before_it_listens(home: Path) -> None:
    """It was uvicorn's KeyError traceback, exit 1, after the URL and the login token were printed."""
    r = cli("dashboard", "--port", "0", "--log-level", "bogus", env={"GPULAYER_HOME": str(home)})
    assert (r.returncode, "Traceback" in r.stderr) == (2, False), r.stderr
    assert "Invalid value for --log-level: 'bogus': accepted: critical, error, warning, info, debug, trace" in r.stderr
    assert "log in with this token" not in r.stderr
