"""The HTTP API: a Starlette app that serves :data:`gpulayer.api.ROUTES` over one ControlPlane.

Every operation route is served by one generic endpoint: authenticate, check the token's
scope and ownership, parse the path, query and body into the route's records, call the
control-plane method of the same name (in the thread pool), and render its result as the
route's response type. Only what cannot be a plain call has a handler of its own here:
the long polls (``wait_job``; the workers' and their heartbeats in :mod:`.worker_polls`),
and streamed bundle uploads. A few routes belong to the server alone (:data:`SERVER_ROUTES`: ``/healthz``,
``/metrics``, the OpenAPI document). Both tables also give the OpenAPI document
(:mod:`gpulayer.server.openapi`), so it lists every route. The web dashboard's pages
(:mod:`gpulayer.server.dashboard`) are served beside them; they are not API operations and
take a session cookie instead of a token.

Authentication: ``Authorization: Bearer <token>`` on every route except ``GET /healthz``,
which answers ``{"ok": true}`` and nothing else. A missing or unusable token is 401; a token
whose scope may not use the route, or a worker credential acting for another worker, is
403. A client token sees only the jobs it submitted: another owner's job is 404, as if it
did not exist.

Errors are ``{"error": {"code", "message", "details"}}`` with the status of the
:class:`~gpulayer.errors.GpulayerError` raised (see :mod:`gpulayer.errors`): malformed
JSON is 400, a body over the limit 413, input of the wrong shape 422 naming the field.
Long polls wait on asyncio events woken by the control plane's observer callbacks,
re-checking the database now and then (another server on the same database cannot wake
us), so they never block the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from pydantic import BaseModel, TypeAdapter
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, request_response
from starlette.routing import Route as StarletteRoute

from gpulayer import api, artifacts, config
from gpulayer.api import TokenInfo
from gpulayer.control import ControlPlane
from gpulayer.control.artifacts import check_uploader
from gpulayer.control.jobs import job_ids_of, look_gap
from gpulayer.errors import (
    BadRequest,
    BundleError,
    DatabaseFailed,
    Forbidden,
    GpulayerError,
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    TooLarge,
)
from gpulayer.readers import READS_HEADER, reads_usage, without_usage
from gpulayer.records import JobState
from gpulayer.server import worker_polls
from gpulayer.server.collector import full_collections
from gpulayer.server.state import Server, wait_woken
from gpulayer.store import Store
from gpulayer.wire import ResultJSON, Splice, json_members
from gpulayer.wording import Spelling, build

if TYPE_CHECKING:
    from gpulayer.server.dashboard import DashboardOptions

log = logging.getLogger("gpulayer.server")

API_PREFIX = "/v1"
MAX_JSON_BYTES = 16 * 1024 * 1024
#: a request body up to this size is decoded on the event loop (a thread hop costs more)
INLINE_JSON_BYTES = 64 * 1024


async def _read_limited(request: Request, limit: int, what: str) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"{what} of {int(declared)} bytes is over the limit of {limit} bytes")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise TooLarge(f"{what} is over the limit of {limit} bytes")
    return bytes(buf)


def _body_limit(route: api.Route) -> int:
    """A submit carries a function's arguments: its body may be as large as they may be
    (GPULAYER_MAX_ARGS_MB) and a little more, so validating it takes bounded time."""
    if route.op == "submit":
        return int(config.settings().max_args_mb * 1024 * 1024) + 1024 * 1024
    if route.op == "submit_many":  # (so one job that a submit takes fits in a batch alone)
        return max(MAX_JSON_BYTES, int(config.settings().max_args_mb * 1024 * 1024) + 1024 * 1024)
    return MAX_JSON_BYTES


async def _parse_body(request: Request, route: api.Route) -> BaseModel:
    raw = await _read_limited(request, _body_limit(route), "request body")
    model = route.body
    if model is None:  # pragma: no cover - only called for routes with a body
        raise BadRequest("this route takes no body")
    # decoding and validating may take a while for a large body: not on the event loop
    if len(raw) <= INLINE_JSON_BYTES:
        return _decode(raw, model)
    return await run_in_threadpool(_decode, raw, model)


def _decode(raw: bytes, model: type[BaseModel]) -> BaseModel:
    keep: tuple[str, ...] = getattr(model, "json_text", ())
    try:
        if keep and raw.strip():  # (what it keeps as sent is passed on as it is: wire.ResultJSON)
            out_of_range: list[str] = []
            data, texts = json_members(raw, keep, parse_constant=_not_json,
                                       parse_float=functools.partial(_float, out_of_range))
            if isinstance(data, dict) and not out_of_range:
                data.update({name: ResultJSON(text) for name, text in texts.items() if _storable(text)})
            # (else the values go on, checked as before: a number out of range is not JSON)
        else:
            data = json.loads(raw, parse_constant=_not_json) if raw.strip() else None
    except BadRequest:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body is not acceptable JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest(f"request body: expected a JSON object, got {type(data).__name__ if data is not None else 'nothing'}")
    try:
        return build(model, data, Spelling(where="body"))
    except RecursionError:
        raise BadRequest("request body is not acceptable JSON: nested too deeply") from None


def _float(out_of_range: list[str], text: str) -> float:
    """A JSON number with a fraction or exponent, as ``json.loads`` reads it; one too large
    for a float (``1e400``, which Python reads as infinity) is noted in ``out_of_range``."""
    value = float(text)
    if math.isinf(value):
        out_of_range.append(text)
    return value


def _storable(text: str) -> bool:
    """Whether a member's text can be stored as it is: UTF-8 (a lone surrogate, which
    ``json.loads`` lets through from bytes, is not; its value is written again, escaped)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_json(name: str) -> Any:
    raise BadRequest(f"request body is not valid JSON: {name} is not a JSON number (NaN and infinities are not allowed)")


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def _authenticate(server: Server, request: Request, method: str, path: str,
                        scopes: tuple[str, ...]) -> TokenInfo:
    bearer = _bearer(request)
    # a token verified a moment ago is answered here, on the event loop; else a thread looks
    tok = server.tokens.cached(bearer)
    if tok is None:
        tok = await server._verifies.submit(bearer or "", None)
    if tok.scope not in scopes:
        raise Forbidden(f"token {tok.id} has scope {tok.scope!r}; {method} {path} needs "
                        f"{' or '.join(repr(s) for s in scopes)}")
    return tok


async def _arguments(server: Server, request: Request, route: api.Route, tok: TokenInfo) -> dict[str, Any]:
    """The control-plane call's keyword arguments, from the request and the caller's token."""
    values: dict[str, Any] = {}
    for name in route.path_params:
        value = str(request.path_params[name])
        pattern = route.path_patterns.get(name)
        if pattern and not re.match(pattern, value):
            raise InvalidInput(f"path.{name}: {value!r} does not match {pattern}")
        values[name] = value
    if route.own_worker and tok.scope == "worker" and tok.worker_id != values["worker_id"]:
        raise Forbidden(f"token {tok.id} is the credential of worker {tok.worker_id}; "
                        f"it cannot act for worker {values['worker_id']}")
    if route.own_job and tok.scope != "admin":
        owner = await run_in_threadpool(server.control.job_owner, values["job_id"])
        if owner != tok.id:
            raise NotFound(f"job {values['job_id']!r}: no such job")
    if route.query is not None:
        query = build(route.query, dict(request.query_params), Spelling(where="query"))
        values.update({name: getattr(query, name) for name in route.query.model_fields})
    if route.body is not None:
        body = await _parse_body(request, route)
        values.update({name: getattr(body, name) for name in route.body.model_fields})
    for name, provider in route.context.items():
        values[name] = {"owner": None if tok.scope == "admin" else tok.id, "worker": tok.worker_id,
                        "bearer": _bearer(request), "remote_origin": "existing"}[provider]
    return values


def error_response(exc: GpulayerError) -> JSONResponse:
    if isinstance(exc, DatabaseFailed):  # (its log names the database; a client is told no path of ours)
        log.warning("%s", exc)
        exc = exc.for_clients()
    return JSONResponse({"error": exc.to_dict()}, status_code=exc.status_code)


# ---------------------------------------------------------------------------------- special handlers

Handler = Callable[[Server, Request, dict[str, Any]], Awaitable[Any]]


async def _wait_job(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    """:meth:`~gpulayer.control.ControlPlane.wait_job` on the event loop: the job's state
    alone at each look (a record holds a function's arguments, up to a megabyte, parsed at
    every look of every waiting request), its record once, at the end."""
    deadline = time.monotonic() + kw["timeout"]
    control, job_id = server.control, kw["job_id"]
    changed = server.change_event()  # (before each read: a change while it reads is not missed)
    state = await run_in_threadpool(control.state_of, job_id)
    while state is not None and not JobState(state).terminal:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or server.shutting_down or await request.is_disconnected():
            break
        await server.changed(changed, min(remaining, 1.0))
        changed = server.change_event()
        state = await run_in_threadpool(control.state_of, job_id)
    # (NotFound for no such job)
    return await run_in_threadpool(functools.partial(control.get_job, job_id, arguments=kw.get("arguments")))


async def _logs(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    """:meth:`~gpulayer.control.ControlPlane.logs`; with ``wait``, its long poll on the event
    loop, holding no thread: woken by the job's output or a change (:meth:`Server.follow`),
    and looking again at least every second (output appended through another server on
    the same database)."""
    wait, tail = kw.pop("wait", None), kw.pop("tail", None)
    control = server.control
    if tail is not None:  # (answered at once: the last lines so far)
        return await run_in_threadpool(functools.partial(control.logs, tail=tail, **kw))
    look = functools.partial(control.log_look, **kw)
    if not wait:
        chunks, _ = await run_in_threadpool(look)
        return chunks
    job_id = kw["job_id"]
    deadline = time.monotonic() + wait
    first: str | None = None
    while True:
        woken = server.follow(job_id)
        try:
            chunks, state = await run_in_threadpool(look)
            again, first = first is not None, first or state
            remaining = deadline - time.monotonic()
            if chunks or state != first or JobState(state).terminal or remaining <= 0 or server.shutting_down \
                    or (again and await request.is_disconnected()):
                return chunks
            await wait_woken(woken, min(remaining, 1.0))
        finally:
            server.unfollow(job_id, woken)


async def _wait_jobs(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    """:meth:`~gpulayer.control.ControlPlane.wait_jobs` as a long poll that holds no thread:
    the same looks (``first_look``, which starts from the last wait's where it can; then the
    news of the changes where it says which jobs ended, ``jobs_ended`` where it cannot,
    spaced by ``look_gap``), the waits between them on the event loop, and the records read
    once, at the end."""
    control = server.control
    ids = job_ids_of(kw["job_ids"])
    waited = frozenset(ids)
    need = min(kw["count"], len(ids))
    deadline = time.monotonic() + kw["timeout"]
    owner = kw.get("owner")
    changed = server.change_event()  # (before each look: a change while it looks is not missed)
    generation, ended, looked_at = await run_in_threadpool(control.first_look, ids, owner)
    while len(ended) < need:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or server.shutting_down or await request.is_disconnected():
            break
        looked = time.monotonic()
        await server.changed(changed, min(remaining, 1.0))
        changed = server.change_event()
        gap = min(looked + look_gap(ids, ended), deadline) - time.monotonic()
        if gap > 0:
            await asyncio.sleep(gap)
        seen, generation = generation, control.changes()
        news = control.ended_news(waited, seen, looked_at)
        if news is None:
            ended = await run_in_threadpool(control.jobs_ended, ids, ended)
            looked_at = time.monotonic()
        else:
            ended |= news
    control.remember_look(waited, owner, generation, ended, looked_at)
    return await run_in_threadpool(functools.partial(control.records_of, [j for j in ids if j in ended],
                                                     brief=bool(kw.get("brief"))))


async def _put_bundle(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    digest = kw["digest"]
    limit = config.max_bundle_bytes()
    too_large = (f"bundle is over the server's limit of {limit} bytes "
                 f"({limit / 1024 / 1024:g} MB, GPULAYER_MAX_BUNDLE_MB)")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"{too_large}: {int(declared)} bytes declared")
    h = hashlib.sha256()
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        h.update(chunk)
        if len(buf) > limit:
            raise TooLarge(too_large)
    if h.hexdigest() != digest:
        raise BundleError(
            f"bundle content does not match its address: expected sha256 {digest}, got {h.hexdigest()} "
            f"({len(buf)} bytes); nothing was stored")
    stored = await run_in_threadpool(functools.partial(server.control.put_bundle, digest, bytes(buf),
                                                         owner=kw["owner"]))
    return JSONResponse(stored.model_dump(mode="json"), status_code=201 if stored.stored else 200)


async def _put_artifacts(server: Server, request: Request, kw: dict[str, Any]) -> Any:
    # (another worker's, or no task: refused before its body is read, up to the limit, into memory)
    await run_in_threadpool(check_uploader, server.control, kw["task_id"], kw["worker_id"])
    limit = config.max_artifacts_bytes()
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(artifacts.too_large(int(declared)))
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise TooLarge(artifacts.too_large())
    stored = await run_in_threadpool(functools.partial(server.control.put_artifacts, kw["task_id"], kw["digest"],
                                                         bytes(buf), worker_id=kw["worker_id"]))
    return JSONResponse(stored.model_dump(mode="json"), status_code=201)


#: operations the generic endpoint cannot serve as a plain call
SPECIAL: dict[str, Handler] = {
    "logs": _logs, "wait_job": _wait_job, "wait_jobs": _wait_jobs, "poll_tasks": worker_polls.poll_tasks,
    "poll_work": worker_polls.poll_work, "heartbeat": worker_polls.heartbeat, "put_bundle": _put_bundle,
    "put_artifacts": _put_artifacts,
}


# ---------------------------------------------------------------------------------- routes of the server alone


@dataclass(frozen=True)
class ServerRoute:
    """A route that is not a control-plane operation (not in :data:`gpulayer.api.ROUTES`)."""

    name: str
    method: str
    path: str
    scopes: tuple[str, ...]
    summary: str
    handler: Callable[[Server, Request], Awaitable[Response]]
    auth: bool = True
    media: str = "application/json"


async def _metrics(server: Server, request: Request) -> Response:
    counts = await run_in_threadpool(server.control.counts)
    return PlainTextResponse(server.metrics.render(counts), media_type="text/plain; version=0.0.4")


async def _openapi(server: Server, request: Request) -> Response:
    from gpulayer.server.openapi import openapi_document

    return JSONResponse(openapi_document())


async def _healthz(server: Server, request: Request) -> Response:
    return JSONResponse({"ok": True})


SERVER_ROUTES: tuple[ServerRoute, ...] = (
    ServerRoute("metrics", "GET", "/metrics", ("admin",), "Prometheus metrics (text format)", _metrics,
                media="text/plain"),
    ServerRoute("openapi", "GET", "/v1/openapi.json", api.SCOPES, "This document", _openapi),
    ServerRoute("healthz", "GET", "/healthz", (), 'Liveness: {"ok": true}; the only route without a token',
                _healthz, auth=False),
)


# ---------------------------------------------------------------------------------- endpoints


def _renderer(route: api.Route) -> Callable[[Any], Response]:
    if route.exists:
        return lambda found: Response(status_code=200 if found else 404)
    if route.raw_response:
        media = route.raw_response
        return lambda data: Response(data, media_type=media)
    if route.response is None:
        return lambda _: Response(status_code=route.status)
    adapter: TypeAdapter[Any] = TypeAdapter(route.response)
    status = route.status

    def render(result: Any) -> Response:
        splice = Splice()  # (a result given as its stored text is written as it is: results_as_text)
        body = splice.splice(adapter.dump_json(result, fallback=splice.mark))
        return Response(body, status_code=status, media_type="application/json")

    return render


def _endpoint(server: Server, route: api.Route) -> Callable[[Request], Awaitable[Response]]:
    render = _renderer(route)
    special = SPECIAL.get(route.op)
    method = getattr(server.control, route.op)

    async def endpoint(request: Request) -> Response:
        try:
            tok = await _authenticate(server, request, route.method, route.path, route.scopes)
            if tok.worker_id is not None and route.op != "heartbeat":
                server.saw(tok.worker_id)
            kwargs = await _arguments(server, request, route, tok)
            if special is not None:
                result = await special(server, request, kwargs)
            else:
                result = await run_in_threadpool(functools.partial(method, **kwargs))
                if route.op in ("join_worker", "register_worker"):  # its row exists: heartbeats go quick
                    server._known.add(result.worker_id if route.op == "join_worker" else result.id)
                elif route.op == "deregister_worker":  # (nor a worker that left: it is forgotten)
                    server.forget_worker(kwargs["worker_id"])
            if not isinstance(result, Response) and not reads_usage(request.headers.get(READS_HEADER, "")):
                result = without_usage(result)  # (a client that would refuse the field)
            response = result if isinstance(result, Response) else render(result)
        except GpulayerError as exc:
            response = error_response(exc)
        except Exception as exc:  # a bug: say so without leaking internals
            log.exception("%s %s failed", request.method, request.url.path)
            response = JSONResponse({"error": {"code": "internal", "message": f"internal error: {type(exc).__name__}"}},
                                    status_code=500)
        server.metrics.request(response.status_code)
        return response

    return endpoint


def _server_endpoint(server: Server, route: ServerRoute) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            if route.auth:
                await _authenticate(server, request, route.method, route.path, route.scopes)
            response = await route.handler(server, request)
        except GpulayerError as exc:
            response = error_response(exc)
        server.metrics.request(response.status_code)
        return response

    return endpoint


# ---------------------------------------------------------------------------------- the app


def create_app(control: ControlPlane | None = None, *, database_url: str | None = None,
               background: bool = True, threads: int = 200,
               dashboard: DashboardOptions | None = None) -> Starlette:
    """The ASGI app. ``control`` defaults to a control plane on ``database_url``. The web
    dashboard (:mod:`gpulayer.server.dashboard`) is served beside the API, with ``dashboard``'s
    options (default: the server's own: token logins, changes noticed as they happen)."""
    from gpulayer.server import dashboard as _dashboard

    if control is None:
        control = ControlPlane(Store(database_url), results_as_text=True)
    control.serving = True  # machines and remote workers can reach it
    server = Server(control)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        server._loop = asyncio.get_running_loop()
        server._changed = asyncio.Event()
        control.begin_grace()
        confirming = threading.Event()
        confirmer = threading.Thread(target=server.confirm_tokens, args=(confirming,), name="gpulayer-tokens",
                                     daemon=True)
        confirmer.start()
        tasks = [asyncio.create_task(server.watch_polls()), asyncio.create_task(server.write_heartbeats()),
                 asyncio.create_task(full_collections())]
        if background:
            tasks.append(asyncio.create_task(server.background()))
        if background and control.providers is not None:
            # offers known before the first request, so a cloud job submitted at once waits
            # for its machine instead of being found unschedulable
            await run_in_threadpool(control.providers.check)
            await run_in_threadpool(control.providers.refresh_offers)
            tasks.append(asyncio.create_task(server.provisioning()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):  # what was answered is written before we go
                await server.flush_heartbeats()
            confirming.set()
            await run_in_threadpool(confirmer.join, 10)
            if control.providers is not None:
                control.providers.close()
            server._loop = None
            control.unobserve(server)
            control.store.dispose()

    by_path: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
    for r in api.ROUTES:
        by_path.setdefault(r.path, {})[r.method] = _endpoint(server, r)
    for sr in SERVER_ROUTES:
        by_path.setdefault(sr.path, {})[sr.method] = _server_endpoint(server, sr)
    routes: list[BaseRoute] = []
    # a static segment ("/v1/workers/join", "/v1/workers/usage") must win over "{worker_id}"
    for path in sorted(by_path, key=lambda p: "{" in p):
        handlers = by_path[path]
        allowed = ", ".join(sorted({*handlers, *(["HEAD"] if "GET" in handlers else [])}))

        async def dispatch(request: Request, handlers: dict[str, Any] = handlers, allowed: str = allowed) -> Response:
            h = handlers.get(request.method) or (handlers.get("GET") if request.method == "HEAD" else None)
            if h is None:
                server.metrics.request(405)
                refused = MethodNotAllowed(f"{request.method} is not allowed here; allowed: {allowed}")
                return JSONResponse({"error": refused.to_dict()}, status_code=refused.status_code,
                                    headers={"allow": allowed})
            response: Response = await h(request)
            return response

        # every method reaches dispatch (an ASGI endpoint takes them all), so any other one
        # (TRACE, a made-up one) gets this 405 with the path's Allow header
        routes.append(StarletteRoute(path, _AnyMethod(dispatch)))

    # the dashboard's pages are not API operations: they are not in ROUTES or the OpenAPI
    # document, and they take a session cookie where the API takes a bearer token
    routes.extend(_dashboard.routes(server, dashboard or _dashboard.DashboardOptions()))

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        headers = exc.headers if isinstance(exc, HTTPException) else None
        where = f"{request.method} {request.url.path}"
        error = NotFound(f"{where}: no such route") if status == 404 else \
            MethodNotAllowed(f"{where}: not allowed here; allowed: {_allow(headers)}") \
            if status == 405 else GpulayerError(f"{where}: HTTP {status}")
        return JSONResponse({"error": error.to_dict()}, status_code=status, headers=headers)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.server = server
    return app


def _allow(headers: Mapping[str, str] | None) -> str:
    """The methods a 405's ``Allow`` header lists (Starlette spells it ``Allow``)."""
    return next((v for k, v in (headers or {}).items() if k.lower() == "allow"), "none")


class _AnyMethod:
    """An ASGI endpoint over ``fn(request)`` for every method (Starlette routes a plain
    function endpoint for GET alone unless given its methods)."""

    def __init__(self, fn: Callable[[Request], Awaitable[Response]]) -> None:
        self.app = request_response(fn)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def default_threads() -> int:
    return config.settings().server_threads
