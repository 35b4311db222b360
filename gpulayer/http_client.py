"""The control plane's operations over HTTP (httpx), generated from :data:`gpulayer.api.ROUTES`.

:func:`connect_http` returns an object with every operation of
:class:`~gpulayer.api.ControlAPI`: each one binds its arguments with the Protocol's
signature, puts them where its :class:`~gpulayer.api.Route` says (path, query, JSON body,
raw body), sends the request and parses the answer into the route's response type. An error
answer comes back as the :class:`~gpulayer.errors.GpulayerError` subclass its code names.
Nothing here repeats a path or a body of its own, and this module imports no database.

TLS: ``ca`` (``GPULAYER_CA`` / ``--ca``) is either a CA bundle / certificate file, or a
pinned certificate fingerprint ``sha256:AB:CD:...`` (what ``gpulayer server start
--self-signed`` prints): the server's certificate is fetched, must hash to the pin, and is
then the only certificate trusted. Without ``ca``, the system trust store is used, except
that a URL recorded in ``$GPULAYER_HOME/server.json`` by a local ``gpulayer server start``
uses the CA file and admin token recorded there (the admin token only goes to that URL).

Retries: connection errors and 502/503/504 are retried with exponential backoff for routes
that are safe to repeat (``Route.safe``: reads, heartbeats, reports, cancel, uploads, and
submit, which carries an idempotency key); a request that could not even connect is retried
for any route. When retries run out the call raises :class:`~gpulayer.errors.ConnectionFailed`.
A request sent again after a try that may have been carried out (its connection broke after
it was sent, or a proxy answered 502, 503 or 504) has its answer read by its route's
``again``, where it has one: a delete sent again finds gone the jobs the first try deleted,
and says them deleted (:func:`gpulayer.wire.deleted_again`); a prune's counts are then a
lower bound, and say so (:func:`gpulayer.wire.pruned_again`).

Transport: ``transport=`` takes any :class:`httpx.BaseTransport`, so the same client runs
in-process against the Starlette app in tests.

Uploads: a raw body of :data:`PROGRESS_BYTES` or more (a source bundle) is streamed in
chunks with a progress bar (bytes sent, rate, time left) on stderr when stderr is a
terminal (:mod:`gpulayer.progress`); otherwise it is sent as it is.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import quote, urlsplit

import httpx
from pydantic import TypeAdapter, ValidationError

from gpulayer import api, config, progress
from gpulayer.api import ResultJSON
from gpulayer.errors import (
    AuthError,
    ConnectionFailed,
    DatabaseFailed,
    GpulayerError,
    InvalidInput,
    NotFound,
    error_from_wire,
)
from gpulayer.readers import READS, READS_HEADER
from gpulayer.server_records import fingerprint_of_der, fingerprint_of_pem, norm_url, server_info
from gpulayer.specs import CHECKED
from gpulayer.wire import Splice

__all__ = ["HttpAPI", "RemoteAPI", "connect_http", "fingerprint_of_pem", "server_info", "tls_verify"]

RETRY_STATUSES = (502, 503, 504)
#: a response's extension: whether its request was sent again after a try that may have
#: been carried out (its answer lost), which a route's ``again`` reads
RESENT = "gpulayer.resent"
#: raw bodies a client sends (a bundle) at least this large get a progress bar on a terminal
#: (a worker's, its tasks' artifacts, none: its stderr is its log); smaller ones are sent
#: before a bar could be read
PROGRESS_BYTES = 4 * 1024 * 1024

# httpx logs every request at INFO; a worker makes several a second
logging.getLogger("httpx").setLevel(logging.WARNING)


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
    # the pinned certificate is the trust anchor even where the server presents it with the
    # chain of a CA this client does not trust (a server certificate of --tls-cert): OpenSSL
    # would otherwise look past it for a self-signed root and refuse
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


def tls_verify(url: str, ca: str | None) -> ssl.SSLContext | bool:
    if not url.startswith("https://"):
        if ca:  # a pin or CA asks for TLS: never send tokens in clear text instead
            raise InvalidInput(
                f"--ca / GPULAYER_CA is set but {url} is not an https:// URL; use https:// "
                "(or unset GPULAYER_CA for a plain-HTTP server on loopback)")
        # no TLS is spoken: no CA bundle is read (httpx's default context loads certifi's, 50
        # ms a client); a context that trusts nothing, should TLS ever come up (no redirects)
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca and ca.lower().startswith("sha256:"):
        return _pinned_context(url, ca)
    if ca:
        if not Path(ca).is_file():
            raise InvalidInput(f"--ca / GPULAYER_CA {ca!r}: no such file (or give a pin 'sha256:...')")
        try:
            return ssl.create_default_context(cafile=ca)
        except OSError as exc:  # (ssl.SSLError too: a file that holds no certificate)
            why = getattr(exc, "reason", None) or exc.strerror or exc
            raise InvalidInput(
                f"--ca / GPULAYER_CA {ca!r}: not a CA bundle or certificate ({why}); accepted: a PEM file of "
                "certificates, such as the server.crt of --self-signed, or a pin 'sha256:...'") from None
    return True


def _tls_refused(exc: BaseException) -> str:
    """Why a TLS handshake that no retry can mend failed (a hint for the user), or '': a
    certificate this client does not trust, or TLS spoken to a server that speaks plain HTTP.
    A server that restarts refuses connections instead, and those are retried."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return " (the server's certificate is not one this client trusts: give its CA with --ca / GPULAYER_CA)"
        if isinstance(cause, ssl.SSLError) and cause.reason == "WRONG_VERSION_NUMBER":
            return " (the server does not speak TLS there: an http:// URL?)"
        cause = cause.__cause__ or cause.__context__
    return ""


def _database_failed(resp: httpx.Response) -> bool:
    try:
        return bool(resp.json()["error"]["code"] == DatabaseFailed.code)
    except (ValueError, KeyError, TypeError):
        return False


def error_from_response(resp: httpx.Response) -> GpulayerError:
    status = resp.status_code
    try:
        data = resp.json()["error"]
    except (ValueError, KeyError, TypeError):
        data = None
    # a server of ours that says why it cannot answer now (its database failed: a full disk)
    # is heard; a proxy's 502/503/504 is a control plane out of reach
    if status in RETRY_STATUSES and not _database_failed(resp):
        return ConnectionFailed(f"{resp.request.url}: HTTP {status}")
    return error_from_wire(data, status=status)


class RemoteAPI(api.ControlAPI, Protocol):
    """:class:`~gpulayer.api.ControlAPI` over HTTP, plus what only a connection has."""

    url: str
    token: str | None
    #: seconds between heartbeats of a worker on this connection
    heartbeat_interval: float
    #: seconds one long poll for tasks waits (the server answers at once when assigned)
    poll_wait: float

    def close(self) -> None: ...


class HttpAPI:
    """The generic implementation behind :func:`connect_http`; its operations are added
    below from :data:`~gpulayer.api.ROUTES`."""

    heartbeat_interval = 1.0
    poll_wait = 20.0

    def __init__(self, url: str, *, token: str | None = None, ca: str | None = None,
                 retry_for: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidInput(f"url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
        self.url = norm_url(url)
        self.token = token
        #: the file the token was read from, where it came from none of the settings
        self.token_from: str | None = None
        #: how the program named the server and its token, where it did (``gl.connect``): a
        #: refused token's hint names that, not the settings
        self.given_in: str | None = None
        #: whether the token was named there too (not read from GPULAYER_TOKEN)
        self.token_given = False
        self.retry_for = retry_for
        verify = True if transport is not None else tls_verify(self.url, ca)
        self.http = httpx.Client(base_url=self.url, verify=verify, transport=transport,
                                 timeout=httpx.Timeout(30.0, connect=5.0), follow_redirects=False,
                                 headers={"user-agent": "gpulayer", READS_HEADER: READS})

    def close(self) -> None:
        self.http.close()

    def request(self, route: api.Route, *, path: str, token: str | None, params: dict[str, Any] | None = None,
                json_body: Any = None, content: bytes | None = None, read_timeout: float | None = None,
                ok: tuple[int, ...]) -> httpx.Response:
        """Send one request with retries (see the module docstring)."""
        deadline = time.monotonic() + self.retry_for
        delay = 0.1
        headers = {"authorization": f"Bearer {token}"} if token else {}
        if content is not None:  # (a raw body, or JSON encoded here: see _operation)
            headers["content-type"] = route.raw_body or "application/json"
        timeout = httpx.Timeout(max(30.0, (read_timeout or 0) + 10.0), connect=5.0)
        # (a user's upload, a bundle: a worker's, its tasks' artifacts, would draw into its log)
        shown = route.raw_body is not None and "client" in route.scopes and content is not None \
            and len(content) >= PROGRESS_BYTES and progress.is_terminal(sys.stderr)
        if shown:
            headers["content-length"] = str(len(content or b""))  # streamed, yet the server may refuse early
        resent = False  # (an earlier try may have been carried out: its answer was lost)
        while True:
            body: bytes | Iterator[bytes] | None = content
            if shown:  # a fresh stream, and bar, for each attempt: a retry sends the whole body again
                body = progress.upload(content or b"", f"upload {path.rsplit('/', 1)[-1][:12]}")
            try:
                resp = self.http.request(route.method, path, params=params, json=json_body, content=body,
                                         headers=headers, timeout=timeout)
            except httpx.TransportError as exc:
                retryable = route.safe or isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                refused = _tls_refused(exc)
                if refused or not retryable or time.monotonic() + delay > deadline:
                    raise ConnectionFailed(f"cannot reach the control plane at {self.url}: "
                                           f"{type(exc).__name__}: {exc}{refused}") from None
                resent = resent or not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            else:
                if resp.status_code in ok:
                    resp.extensions[RESENT] = resent
                    return resp
                # (a proxy's 502, 503 or 504 may come after its server carried the request
                # out; our own server's database_failed stored nothing of it)
                resent = resent or (resp.status_code in RETRY_STATUSES and not _database_failed(resp))
                if not (route.safe and resp.status_code in RETRY_STATUSES and time.monotonic() + delay <= deadline):
                    error = error_from_response(resp)
                    if route.method == "HEAD" and resp.status_code not in RETRY_STATUSES:
                        error = self._why_head_failed(path, headers, timeout) or error
                    if isinstance(error, AuthError) and self.token_from is not None and token == self.token:
                        # (the hint names the settings; this token came from neither)
                        error.args = (str(error).replace("check GPULAYER_TOKEN / --token",
                                                         f"the admin token read from {self.token_from}"),)
                    elif isinstance(error, AuthError) and token and token == self.token and self.token_given:
                        # (the program gave it: the settings are not where it is wrong)
                        error.args = (str(error).replace("check GPULAYER_TOKEN / --token",
                                                         f"check the token given to {self.given_in}(token=...)"),)
                    elif isinstance(error, AuthError) and not token and str(error).startswith("missing token"):
                        # (the server's words are for HTTP: a user of this client gave no setting)
                        give = f"give it as {self.given_in}(token=...)" if self.given_in else "give --token TOKEN"
                        error.args = (f"missing token: {self.url} needs one; {give} or set "
                                      "GPULAYER_TOKEN (what gpulayer token create printed)",)
                    raise error
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


    def _why_head_failed(self, path: str, headers: dict[str, str], timeout: httpx.Timeout) -> GpulayerError | None:
        """The error a HEAD was answered with, in the server's words: a HEAD's answer has no
        body, so a bad token said only "HTTP 401" at a submit's first request (the bundle's
        ``has_bundle``). The same path asked with GET, whose checks are the HEAD's, says why;
        an answer that is no error is not read."""
        try:
            with self.http.stream("GET", path, headers=headers, timeout=timeout) as resp:
                if resp.status_code < 400 or resp.status_code in RETRY_STATUSES:
                    return None
                resp.read()
                return error_from_response(resp)
        except httpx.TransportError:
            return None


def _fields(model: type[api.Wire] | None) -> list[str]:
    return list(model.model_fields) if model is not None else []


def _operation(route: api.Route) -> Callable[..., Any]:
    """The method of :class:`HttpAPI` for ``route``, with its Protocol's signature."""
    proto = getattr(api.ControlAPI, route.op)
    sig = inspect.signature(proto)
    query, body = _fields(route.query), _fields(route.body)
    unsent_when_none = [k for k, f in (route.body.model_fields.items() if route.body else ()) if f.default is None]
    adapter: list[TypeAdapter[Any]] = []  # built on first use: model schemas cost import time
    ok = (route.status, 404) if route.exists else (route.status, *route.also_ok)

    def call(self: HttpAPI, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        values.pop("self")
        token = self.token
        for name, provider in route.context.items():
            value = values.pop(name, None)
            if provider == "bearer":  # this call authenticates with an argument (join)
                token = value
        path = route.path
        for name in route.path_params:
            value = values.pop(name)
            if value is None:
                raise InvalidInput(f"{name}: required for {route.op} over HTTP")
            if str(value) in ("", ".", "..") or "/" in str(value):
                # (the server decodes the path before routing: it would reach another route)
                what = name.removesuffix("_id") if name != "digest" else "bundle"
                raise NotFound(f"{what} {str(value)!r}: no such {what}")
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        # a body field given as its JSON text goes into the body as it is, not parsed and
        # written again (a worker's report of a function's result: api.ResultJSON)
        splice = Splice()
        values.update({k: splice.mark(values[k]) for k in body if isinstance(values.get(k), ResultJSON)})
        try:
            params = route.query(**{k: values.pop(k) for k in query}).model_dump(
                mode="json", exclude_none=True) if route.query else None
            json_body = route.body(**{k: values.pop(k) for k in body}).model_dump(
                mode="json") if route.body else None
            if json_body is not None and route.body is not None:
                # (a field of the body left None, its default, is not sent: one added for a new
                # use and left unused does not make a server from before it refuse the request)
                for k in unsent_when_none:
                    if json_body.get(k, ...) is None:
                        del json_body[k]
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InvalidInput(f"{route.op}: {where + ': ' if where else ''}{first['msg']}") from None
        content = values.pop("data") if route.raw_body else None
        if splice:
            content, json_body = splice.splice(json.dumps(json_body).encode()), None
        if values:  # the route and the Protocol disagree: a bug, caught by tests/unit/test_api.py
            raise TypeError(f"{route.op}: arguments {sorted(values)} have no place in {route.method} {route.path}")
        held = params.get(route.long_poll) if route.long_poll and params else None
        read_timeout = None if held is None else float(held)
        resp = self.request(route, path=path, token=token, params=params, json_body=json_body,
                            content=content, read_timeout=read_timeout, ok=ok)
        if route.exists:
            return resp.status_code == 200
        if route.raw_response:
            return resp.content
        if route.response is None:
            return None
        if not adapter:
            adapter.append(TypeAdapter(route.response))
        # (a control plane's answer: the specs in it were checked when their jobs were submitted,
        # and a field this client does not know, which a newer server sends, is left out: a
        # client reads what it knows of a record, as Ray's and Kubernetes' clients do; what a
        # user writes, and a request a server reads, still refuse an unknown field)
        answer = adapter[0].validate_json(resp.content, context=CHECKED, extra="ignore")
        if route.again is not None and resp.extensions.get(RESENT):
            return route.again(json_body, answer)
        return answer

    call.__name__ = call.__qualname__ = route.op
    call.__doc__ = proto.__doc__
    call.__signature__ = sig  # type: ignore[attr-defined]
    return call


for _route in api.ROUTES:
    setattr(HttpAPI, _route.op, _operation(_route))


def connect_http(url: str, *, token: str | None = None, ca: str | None = None, retry_for: float | None = None,
                 transport: httpx.BaseTransport | None = None) -> RemoteAPI:
    """Every control-plane operation against the server at ``url``.

    With neither ``token`` nor ``ca`` given, a URL that a local ``gpulayer server start``
    recorded in ``$GPULAYER_HOME/server.json`` uses the admin token and CA recorded there.
    """
    info = server_info(url)
    token_from = None
    if token is None and info is not None:
        path = Path(info.get("admin_token") or config.home() / "admin.token")
        if not path.is_file():  # (recorded by an older server: the home's one file)
            path = config.home() / "admin.token"
        if path.is_file():
            token = path.read_text().strip() or None
            token_from = str(path) if token else None
    if ca is None and info is not None:
        ca = info.get("ca") or info.get("fingerprint") or None
    if retry_for is None:
        retry_for = config.settings().http_retry_seconds
    api = HttpAPI(url, token=token, ca=ca, retry_for=retry_for, transport=transport)
    api.token_from = token_from
    return cast(RemoteAPI, api)

