"""The HTTP side of the Client interface and of the worker's WorkerAPI (httpx).

:class:`HttpClient` is what :func:`gpulayer.client.connect` returns when ``GPULAYER_URL`` is
set; :class:`HttpWorkerAPI` is what ``gpulayer --url URL worker start --token JOIN`` runs on.

TLS: ``ca`` (``GPULAYER_CA`` / ``--ca``) is either a CA bundle / certificate file, or a
pinned certificate fingerprint ``sha256:AB:CD:...`` (what ``gpulayer server start
--self-signed`` prints): the server's certificate is fetched, must hash to the pin, and is
then the only certificate trusted. Without ``ca``, the system trust store is used, except
that a URL recorded in ``$GPULAYER_HOME/server.json`` by a local ``gpulayer server start``
uses the CA file and admin token recorded there (the admin token only goes to that URL).

Retries: connection errors and 502/503/504 are retried with exponential backoff for calls
that are safe to repeat (reads, heartbeats, cancel, bundle upload, and submit, which carries
an idempotency key so a retried submit never makes two jobs); a request that could not even
connect is retried for any call. When retries run out the call raises
:class:`~gpulayer.errors.ConnectionFailed`.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from gpulayer import config
from gpulayer.client import Client
from gpulayer.control import HeartbeatReply, LogChunk, TaskAssignment
from gpulayer.errors import (
    AuthError,
    BundleError,
    Conflict,
    ConnectionFailed,
    GpulayerError,
    InvalidArgument,
    InvalidInput,
    InvalidRequirement,
    NotFound,
    Unschedulable,
)
from gpulayer.hookrecords import Capabilities
from gpulayer.records import JobRecord, TaskState, WorkerRecord
from gpulayer.specs import JobSpec

__all__ = ["HttpClient", "HttpWorkerAPI", "fingerprint_of_pem", "server_info"]

RETRY_STATUSES = (502, 503, 504)
PROGRESS_MIN_BYTES = 8 * 1024 * 1024


def _norm_url(url: str) -> str:
    return url.rstrip("/")


def server_info(url: str) -> dict[str, Any] | None:
    """What a local ``gpulayer server start`` recorded for ``url``, if it was this URL."""
    path = config.home() / "server.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or _norm_url(str(info.get("url", ""))) != _norm_url(url):
        return None
    return info


def fingerprint_of_der(der: bytes) -> str:
    digest = hashlib.sha256(der).hexdigest().upper()
    return "sha256:" + ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def fingerprint_of_pem(pem: str) -> str:
    return fingerprint_of_der(ssl.PEM_cert_to_DER_cert(pem))


def _norm_pin(pin: str) -> str:
    return pin.split(":", 1)[1].replace(":", "").strip().upper()


def _pinned_context(url: str, pin: str) -> ssl.SSLContext:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 443
    probe = ssl.create_default_context()
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=10) as sock, \
                probe.wrap_socket(sock, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    except OSError as exc:
        raise ConnectionFailed(f"cannot reach {url} to check its certificate: {exc}") from None
    if der is None or hashlib.sha256(der).hexdigest().upper() != _norm_pin(pin):
        raise AuthError(
            f"{url} presented a certificate with fingerprint "
            f"{fingerprint_of_der(der or b'')}, not the pinned {pin}; refusing to talk to it")
    ctx = ssl.create_default_context(cadata=ssl.DER_cert_to_PEM_cert(der))
    ctx.check_hostname = False  # the pin names the exact certificate, which is stronger
    return ctx


def tls_verify(url: str, ca: str | None) -> ssl.SSLContext | bool:
    if not url.startswith("https://"):
        if ca:  # a pin or CA asks for TLS: never send tokens in clear text instead
            raise InvalidInput(
                f"--ca / GPULAYER_CA is set but {url} is not an https:// URL; use https:// "
                "(or unset GPULAYER_CA for a plain-HTTP server on loopback)")
        return True
    if ca and ca.lower().startswith("sha256:"):
        return _pinned_context(url, ca)
    if ca:
        if not Path(ca).is_file():
            raise InvalidInput(f"--ca / GPULAYER_CA {ca!r}: no such file (or give a pin 'sha256:...')")
        return ssl.create_default_context(cafile=ca)
    return True


_CODES: dict[str, type[GpulayerError]] = {
    "invalid_requirement": InvalidRequirement, "invalid_argument": InvalidArgument,
    "invalid_bundle": BundleError, "bundle_too_large": BundleError, "too_large": BundleError,
    "unschedulable": Unschedulable, "not_found": NotFound, "conflict": Conflict,
}


def error_from_response(resp: httpx.Response) -> GpulayerError:
    status = resp.status_code
    try:
        err = resp.json()["error"]
        code, message = str(err["code"]), str(err["message"])
    except Exception:
        code, message = "", (resp.text[:500] if resp.content else resp.reason_phrase) or f"HTTP {status}"
    if status in (401, 403):
        return AuthError(message, status)
    if status in RETRY_STATUSES:
        return ConnectionFailed(f"{resp.request.url}: HTTP {status}: {message}")
    cls = _CODES.get(code)
    if cls is not None:
        return cls(message)
    if status == 404:
        return NotFound(message)
    if status == 409:
        return Conflict(message)
    if status == 413:
        return BundleError(message)
    if status in (400, 405, 422):
        return InvalidInput(message)
    exc = GpulayerError(f"server error (HTTP {status}): {message}")
    return exc


class _Transport:
    """httpx plus auth, TLS, retries and error mapping."""

    def __init__(self, url: str, token: str | None, ca: str | None, *, retry_for: float) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidInput(f"url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        self.url = _norm_url(url)
        self.retry_for = retry_for
        self.token = token
        self.http = httpx.Client(base_url=self.url, verify=tls_verify(self.url, ca),
                                 timeout=httpx.Timeout(30.0, connect=5.0), follow_redirects=False,
                                 headers={"user-agent": "gpulayer"})

    def set_token(self, token: str | None) -> None:
        self.token = token

    def request(self, method: str, path: str, *, safe: bool, ok: tuple[int, ...] = (200, 201),
                retry_for: float | None = None, read_timeout: float | None = None, **kw: Any) -> httpx.Response:
        deadline = time.monotonic() + (self.retry_for if retry_for is None else retry_for)
        delay = 0.1
        headers = dict(kw.pop("headers", None) or {})
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        timeout = httpx.Timeout(max(30.0, (read_timeout or 0) + 10.0), connect=5.0)
        while True:
            try:
                resp = self.http.request(method, path, headers=headers, timeout=timeout, **kw)
            except httpx.TransportError as exc:
                retryable = safe or isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if not retryable or time.monotonic() + delay > deadline:
                    raise ConnectionFailed(f"cannot reach the control plane at {self.url}: "
                                           f"{type(exc).__name__}: {exc}") from None
            else:
                if resp.status_code in ok:
                    return resp
                if not (safe and resp.status_code in RETRY_STATUSES and time.monotonic() + delay <= deadline):
                    raise error_from_response(resp)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def json(self, method: str, path: str, *, safe: bool, **kw: Any) -> Any:
        return self.request(method, path, safe=safe, **kw).json()

    def close(self) -> None:
        self.http.close()


def _progress(data: bytes, label: str) -> Iterator[bytes]:
    step = 256 * 1024
    total = len(data)
    show = total >= PROGRESS_MIN_BYTES and sys.stderr.isatty()
    for i in range(0, total, step):
        yield data[i:i + step]
        if show:
            done = min(total, i + step)
            bar = "#" * int(30 * done / total)
            sys.stderr.write(f"\r{label} [{bar:<30}] {done / 1e6:.1f}/{total / 1e6:.1f} MB")
            sys.stderr.flush()
    if show:
        sys.stderr.write("\n")


class HttpClient(Client):
    """The :class:`~gpulayer.client.Client` interface over the server's HTTP API."""

    default_target = "remote"

    def __init__(self, url: str, *, token: str | None = None, ca: str | None = None,
                 retry_for: float | None = None) -> None:
        info = server_info(url)
        if token is None and info is not None:
            path = config.home() / "admin.token"
            if path.is_file():
                token = path.read_text().strip() or None
        if ca is None and info is not None:
            ca = info.get("ca") or info.get("fingerprint") or None
        if retry_for is None:
            retry_for = config.env_float("GPULAYER_HTTP_RETRY_SECONDS", 30.0)
        self.location = _norm_url(url)
        self._t = _Transport(url, token, ca, retry_for=retry_for)

    # -- jobs
    def _submit(self, spec: JobSpec, idempotency_key: str) -> JobRecord:
        body = {"spec": spec.model_dump(mode="json", exclude_none=False), "idempotency_key": idempotency_key}
        return JobRecord.model_validate(self._t.json("POST", "/v1/jobs", safe=True, json=body))

    def get_job(self, job_id: str) -> JobRecord:
        return JobRecord.model_validate(self._t.json("GET", f"/v1/jobs/{_seg(job_id)}", safe=True))

    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> list[JobRecord]:
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            params["state"] = state
        return [JobRecord.model_validate(j) for j in self._t.json("GET", "/v1/jobs", safe=True, params=params)]

    def cancel(self, job_id: str) -> JobRecord:
        return JobRecord.model_validate(self._t.json("POST", f"/v1/jobs/{_seg(job_id)}/cancel", safe=True))

    def logs(self, job_id: str, *, after: int = 0, node: int | None = None) -> list[LogChunk]:
        params: dict[str, Any] = {"after": after}
        if node is not None:
            params["node"] = node
        data = self._t.json("GET", f"/v1/jobs/{_seg(job_id)}/logs", safe=True, params=params)
        return [LogChunk.model_validate(c) for c in data]

    def wait_job(self, job_id: str, timeout: float | None = None) -> JobRecord:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
            job = JobRecord.model_validate(self._t.json(
                "GET", f"/v1/jobs/{_seg(job_id)}/wait", safe=True, params={"timeout": remaining},
                read_timeout=remaining))
            if job.state.terminal or (deadline is not None and time.monotonic() >= deadline):
                return job

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return list(self._t.json("GET", f"/v1/jobs/{_seg(job_id)}/events", safe=True))

    # -- bundles
    def has_bundle(self, digest: str) -> bool:
        resp = self._t.request("HEAD", f"/v1/bundles/{_seg(digest)}", safe=True, ok=(200, 404))
        return resp.status_code == 200

    def put_bundle(self, digest: str, data: bytes) -> bool:
        resp = self._t.request(
            "PUT", f"/v1/bundles/{_seg(digest)}", safe=True,
            content=_progress(data, f"uploading bundle {digest[:12]}") if len(data) >= PROGRESS_MIN_BYTES else data,
            headers={"content-type": "application/zip", "content-length": str(len(data))})
        return resp.status_code == 201

    def get_bundle(self, digest: str) -> bytes:
        return self._t.request("GET", f"/v1/bundles/{_seg(digest)}", safe=True).content

    # -- workers
    def list_workers(self) -> list[WorkerRecord]:
        return [WorkerRecord.model_validate(w) for w in self._t.json("GET", "/v1/workers", safe=True)]

    def worker_usage(self) -> dict[str, dict[str, Any]]:
        return dict(self._t.json("GET", "/v1/workers/usage", safe=True))

    # -- admin
    def create_token(self, scope: str, *, ttl: float | None = None, uses: int | None = None,
                     description: str = "") -> dict[str, Any]:
        body = {"scope": scope, "ttl": ttl, "uses": uses, "description": description}
        return dict(self._t.json("POST", "/v1/tokens", safe=False, json=body))

    def list_tokens(self) -> list[dict[str, Any]]:
        return list(self._t.json("GET", "/v1/tokens", safe=True))

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return dict(self._t.json("DELETE", f"/v1/tokens/{_seg(token_id)}", safe=True))

    def close(self) -> None:
        self._t.close()


def _seg(value: str) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


class HttpWorkerAPI:
    """The agent's :class:`~gpulayer.worker.agent.WorkerAPI` over HTTP.

    Made by :meth:`join` with a join (or bootstrap) token; the first
    :meth:`register_worker` exchanges it for this worker's own credential, which every
    later call uses.
    """

    #: seconds between heartbeats of a remote worker (GPULAYER_HEARTBEAT_INTERVAL overrides)
    heartbeat_interval = 1.0
    #: seconds one long poll for tasks may wait (the server answers at once when assigned)
    poll_wait = 20.0

    def __init__(self, url: str, *, join_token: str | None = None, worker_token: str | None = None,
                 ca: str | None = None, retry_for: float = 3.0) -> None:
        self.url = _norm_url(url)
        self.join_token = join_token
        self.worker_id: str | None = None
        self._t = _Transport(url, worker_token, ca, retry_for=retry_for)

    @classmethod
    def join(cls, url: str, token: str | None = None, ca: str | None = None) -> HttpWorkerAPI:
        if not token:
            raise AuthError("a worker joins a server with a join token: gpulayer --url URL worker start "
                            "--token TOKEN (create one with 'gpulayer token create --join')")
        info = server_info(url)
        if ca is None and info is not None:
            ca = info.get("ca") or info.get("fingerprint") or None
        return cls(url, join_token=token, ca=ca)

    def register_worker(self, capabilities: Capabilities, *, origin: str = "existing", name: str | None = None,
                        cpu_slots: int = 1, pid: int | None = None, worker_id: str | None = None) -> WorkerRecord:
        body = {"capabilities": capabilities.model_dump(mode="json"), "name": name,
                "cpu_slots": cpu_slots, "pid": pid}
        if self._t.token is None or self.worker_id is None:
            saved = self._t.token
            self._t.set_token(self.join_token)
            try:
                data = self._t.json("POST", "/v1/workers/join", safe=False, json=body, retry_for=30.0)
            finally:
                self._t.set_token(saved)
            self._t.set_token(data["token"])
            self.worker_id = data["worker_id"]
            return WorkerRecord.model_validate(data["worker"])
        wid = self.worker_id
        return WorkerRecord.model_validate(
            self._t.json("POST", f"/v1/workers/{_seg(wid)}/register", safe=True, json=body))

    def heartbeat(self, worker_id: str, running: list[str] | None = None) -> HeartbeatReply:
        data = self._t.json("POST", f"/v1/workers/{_seg(worker_id)}/heartbeat", safe=True,
                            json={"running": list(running or [])})
        return HeartbeatReply.model_validate(data)

    def poll(self, worker_id: str, wait: float = 0.0) -> list[TaskAssignment]:
        data = self._t.json("GET", f"/v1/workers/{_seg(worker_id)}/tasks", safe=True,
                            params={"wait": wait}, read_timeout=wait)
        return [TaskAssignment.model_validate(a) for a in data]

    def start_task(self, task_id: str, worker_id: str) -> None:
        # Starting matters (a failed start fails the task), so keep trying through an outage.
        # A retry after an answer was lost finds the task already running: that is success.
        deadline = time.monotonic() + 120.0
        tried = False
        while True:
            try:
                self._t.request("POST", f"/v1/tasks/{_seg(task_id)}/start", safe=False)
                return
            except ConnectionFailed:
                if time.monotonic() > deadline:
                    raise
                tried = True
                time.sleep(1.0)
            except Conflict as exc:
                if tried and " is running" in str(exc):
                    return
                raise

    def append_logs(self, task_id: str, worker_id: str, chunks: list[tuple[str, str]]) -> None:
        self._t.request("POST", f"/v1/tasks/{_seg(task_id)}/logs", safe=False,
                        json={"chunks": [[s, d] for s, d in chunks]})

    def finish_task(self, task_id: str, worker_id: str, state: TaskState | str, *, exit_code: int | None = None,
                    result: Any = None, error: dict[str, Any] | None = None) -> None:
        body = {"state": TaskState(state).value, "exit_code": exit_code, "result": result, "error": error}
        self._t.request("POST", f"/v1/tasks/{_seg(task_id)}/finish", safe=False, json=body)

    def get_bundle(self, digest: str) -> bytes:
        return self._t.request("GET", f"/v1/bundles/{_seg(digest)}", safe=True, retry_for=30.0).content

    def set_draining(self, worker_id: str) -> None:
        self._t.request("POST", f"/v1/workers/{_seg(worker_id)}/drain", safe=True)

    def deregister_worker(self, worker_id: str) -> None:
        self._t.request("DELETE", f"/v1/workers/{_seg(worker_id)}", safe=True)

    def close(self) -> None:
        self._t.close()


def env_ca() -> str | None:
    return os.environ.get("GPULAYER_CA") or None


# httpx logs every request at INFO; a worker makes several a second
import logging as _logging  # noqa: E402

_logging.getLogger("httpx").setLevel(_logging.WARNING)
