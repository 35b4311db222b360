"""Helpers for server tests: a real ``gpulayer server start`` process and remote workers."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gpulayer.testing import no_real_devices_env
from tests.support import first_detection, seed_probe_cache, wait_for

CLEAN_ENV = ("GPULAYER_URL", "GPULAYER_TOKEN", "GPULAYER_CA", "GPULAYER_DATABASE_URL",
             "GPULAYER_DISABLE_PLUGINS", "GPULAYER_PLUGINS", "GPULAYER_FAKE_DEVICES")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    env["GPULAYER_HOME"] = str(home)
    env.update(no_real_devices_env())
    env.update(extra)
    return env


class ServerProc:
    """``gpulayer server start`` as a subprocess; ``kill()`` and ``start()`` again to restart."""

    def __init__(self, home: Path, *, port: int | None = None, database: str | None = None,
                 env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                 open_files: int | None = None) -> None:
        self.home = home
        #: the server's soft limit of open files (None: this process's), set in its process
        #: only: a test process that lowered its own could not open a socket past it
        self.open_files = open_files
        home.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.database = database
        self.extra_env = env or {}
        self.args = args
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = home / f"server-{self.port}.log"
        self.scheme = "https" if any(a in ("--self-signed", "--tls-cert") for a in args) else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerProc:
        """Start it and wait until it answers ``/healthz`` (a provider server first checks its
        providers, which on a loaded machine can take most of a minute; one that exits fails at once)."""
        cmd = [sys.executable, "-m", "gpulayer.cli", "server", "start", "--port", str(self.port), *self.args]
        if self.database:
            cmd += ["--database", self.database]
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, env=base_env(self.home, **self.extra_env), stdout=log,
                                     stderr=subprocess.STDOUT, text=True, preexec_fn=self._limits())
        log.close()

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1, verify=False).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout, "the server to answer /healthz")
        return self

    def _limits(self) -> Callable[[], None] | None:
        if self.open_files is None:
            return None
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = (min(self.open_files, hard), hard)
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, wanted)

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    @property
    def admin_token(self) -> str:
        return self.admin_token_file.read_text().strip()

    @property
    def admin_token_file(self) -> Path:
        """Where its first admin token was written (``admin.token`` for the home's own
        database, a file named after any other)."""
        from gpulayer.cli.server import admin_token_file

        return admin_token_file(self.home, self.database or self.extra_env.get("GPULAYER_DATABASE_URL"))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


class Api:
    """A raw HTTP caller for one token (tests speak the wire protocol directly)."""

    def __init__(self, url: str, token: str | None) -> None:
        self.http = httpx.Client(base_url=url, timeout=60, verify=False)
        self.token = token

    def __call__(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", None) or {})
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token}"
        return self.http.request(method, path, headers=headers, **kw)

    def token_for(self, scope: str, **body: Any) -> dict[str, Any]:
        r = self("POST", "/v1/tokens", json={"scope": scope, **body})
        assert r.status_code == 201, r.text
        return dict(r.json())


def joined_worker(url: str, admin: Api, capabilities: dict[str, Any] | None = None) -> tuple[str, Api]:
    """A worker joined over the wire with a new join token (one CPU slot; the capabilities of
    tests.factories.make_capabilities unless given): its id, and an Api with its credential."""
    from tests.factories import make_capabilities

    caps = capabilities if capabilities is not None else make_capabilities().model_dump(mode="json")
    joined = Api(url, admin.token_for("join")["token"])(
        "POST", "/v1/workers/join", json={"capabilities": caps, "cpu_slots": 1})
    assert joined.status_code == 201, joined.text
    return joined.json()["worker_id"], Api(url, joined.json()["token"])


def start_remote_worker(url: str, join_token: str, home: Path, *, cpu_slots: int = 2,
                        env: dict[str, str] | None = None, name: str | None = None) -> subprocess.Popen[str]:
    """``gpulayer worker start`` joined to the server at ``url``, on ``home``: a fresh home but
    for the framework probes' cache of a first detection (tests.support.first_detection)."""
    home.mkdir(parents=True, exist_ok=True)
    seed_probe_cache(home, first_detection())
    cmd = [sys.executable, "-m", "gpulayer.cli", "--url", url, "worker", "start", "--token", join_token,
           "--cpu-slots", str(cpu_slots), "--grace", "2"]
    if name:
        cmd += ["--name", name]
    log = open(home / "worker.log", "a")
    proc = subprocess.Popen(cmd, env=base_env(home, **{"GPULAYER_HEARTBEAT_INTERVAL": "0.3", **(env or {})}),
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()
    return proc


def wait_workers(api: Api, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    def ready() -> list[dict[str, Any]] | None:
        ws = [w for w in api("GET", "/v1/workers").json() if w["online"] and not w["draining"]]
        return ws if len(ws) >= n else None

    return wait_for(ready, timeout, f"{n} online worker(s)")


def stop_proc(proc: subprocess.Popen[str] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def until(predicate: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            if not value:
                raise AssertionError(f"timed out waiting for {what}")
            return value
        time.sleep(0.1)


def provider_server(home: Path, providers_toml: str, *, env: dict[str, str] | None = None,
                    args: tuple[str, ...] = (), plugins: str = "gpulayer.testprovider") -> ServerProc:
    """A ``gpulayer server start --providers FILE`` (not started yet) whose providers file
    holds ``providers_toml``; ``plugins`` (``GPULAYER_PLUGINS``) loads the test provider
    (``type = "local-process"``, :mod:`gpulayer.testprovider`). Heartbeats time out after
    3 s so that a machine whose worker died is noticed quickly."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "providers.toml"
    path.write_text(providers_toml)
    extra = {"GPULAYER_HEARTBEAT_TIMEOUT": "3", **({"GPULAYER_PLUGINS": plugins} if plugins else {}), **(env or {})}
    return ServerProc(home, env=extra, args=("--providers", str(path), *args))


def wait_job(api: Api, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    """The job once it is terminal (long polls of the server, bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = api("GET", f"/v1/jobs/{job_id}/wait", params={"timeout": 5}).json()
        if job["state"] in ("succeeded", "failed", "cancelled", "timed_out", "unschedulable"):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job['state']} after {timeout:g} s")
