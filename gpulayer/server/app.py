"""The HTTP API: a Starlette app wrapping one :class:`~gpulayer.control.ControlPlane`.

Every route is listed once in :data:`ROUTES` with the token scopes it accepts; the Starlette
routes and the OpenAPI document (``GET /v1/openapi.json``) are both built from that table,
so the document always lists every route.

Authentication: ``Authorization: Bearer <token>`` on every route except ``GET /healthz``,
which answers ``{"ok": true}`` and nothing else (for load balancers and process managers).
A missing or unusable token is 401; a token whose scope may not use the route (or a worker
credential acting for another worker) is 403. A client token sees only the jobs it
submitted: another owner's job is 404, as if it did not exist.

Errors are JSON ``{"error": {"code": ..., "message": ...}}`` with the status of the
:class:`~gpulayer.errors.GpulayerError` raised; malformed JSON is 400, a body or parameter
of the wrong shape 422 with a message naming the field. Blocking control-plane calls run in
the thread pool; long polls (``/wait``, ``/tasks?wait=``) wait on an asyncio event woken by
the control plane, re-checking at least once a second (another server on the same database
cannot wake us), so they never block the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpulayer import bundles, config
from gpulayer.control import ControlPlane, HeartbeatReply, TaskAssignment, new_id
from gpulayer.errors import AuthError, BundleError, GpulayerError, InvalidInput, NotFound
from gpulayer.hookrecords import Capabilities
from gpulayer.records import TaskState
from gpulayer.specs import JobSpec
from gpulayer.store import Store
from gpulayer.tokens import TokenInfo, TokenStore

log = logging.getLogger("gpulayer.server")

API_PREFIX = "/v1"
MAX_LONG_POLL = 30.0
#: how often a waiting worker poll looks at the database without being woken
POLL_RECHECK = 5.0
MAX_JSON_BYTES = 16 * 1024 * 1024
ALL_SCOPES = ("admin", "client", "worker", "join", "bootstrap")


# ---------------------------------------------------------------------------------- bodies


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitBody(_Body):
    spec: JobSpec
    idempotency_key: str | None = Field(default=None, max_length=200)


class JoinBody(_Body):
    capabilities: Capabilities
    name: str | None = Field(default=None, max_length=200)
    cpu_slots: int = Field(default=1, ge=0, le=100_000)
    pid: int | None = Field(default=None, ge=0, le=2**31)


class HeartbeatBody(_Body):
    running: list[str] = Field(default_factory=list, max_length=100_000)


class LogsBody(_Body):
    chunks: list[tuple[Literal["stdout", "stderr", "system"], str]] = Field(max_length=100_000)


class FinishBody(_Body):
    state: TaskState
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31)
    result: Any = None
    error: dict[str, Any] | None = None


class TokenBody(_Body):
    scope: Literal["admin", "client", "join", "bootstrap"]
    ttl: float | None = Field(default=None, gt=0, le=10 * 365 * 86400, description="seconds")
    uses: int | None = Field(default=None, ge=1, le=10**9, description="join tokens only")
    description: str = Field(default="", max_length=500)

    @model_validator(mode="after")
    def _uses_for_join_only(self) -> TokenBody:
        if self.uses is not None and self.scope != "join":
            raise ValueError(f"uses: only join tokens have a number of uses (bootstrap tokens have one); "
                             f"a {self.scope} token is limited by ttl or revocation")
        return self


# ---------------------------------------------------------------------------------- metrics

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Metrics:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(_BUCKETS) + 1))
    count: int = 0
    total: float = 0.0
    requests: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def placement(self, seconds: float) -> None:
        with self.lock:
            self.count += 1
            self.total += seconds
            for i, b in enumerate(_BUCKETS):
                if seconds <= b:
                    self.buckets[i] += 1
                    break
            else:
                self.buckets[-1] += 1

    def request(self, status: int) -> None:
        with self.lock:
            self.requests[status] = self.requests.get(status, 0) + 1

    def render(self, counts: dict[str, Any]) -> str:
        from gpulayer.records import JobState

        out = ["# HELP gpulayer_jobs Jobs by state.", "# TYPE gpulayer_jobs gauge"]
        for st in JobState:
            out.append(f'gpulayer_jobs{{state="{st.value}"}} {counts["jobs"].get(st.value, 0)}')
        out += ["# HELP gpulayer_workers_online Workers online.", "# TYPE gpulayer_workers_online gauge",
                f"gpulayer_workers_online {counts['workers_online']}",
                "# HELP gpulayer_queue_depth Jobs waiting for placement.", "# TYPE gpulayer_queue_depth gauge",
                f"gpulayer_queue_depth {counts['queue_depth']}",
                "# HELP gpulayer_placement_seconds Duration of placement passes.",
                "# TYPE gpulayer_placement_seconds histogram"]
        with self.lock:
            acc = 0
            for b, n in zip(_BUCKETS, self.buckets[:-1], strict=True):  # the last bucket is +Inf
                acc += n
                out.append(f'gpulayer_placement_seconds_bucket{{le="{b}"}} {acc}')
            out.append(f'gpulayer_placement_seconds_bucket{{le="+Inf"}} {self.count}')
            out.append(f"gpulayer_placement_seconds_sum {self.total:.6f}")
            out.append(f"gpulayer_placement_seconds_count {self.count}")
            out += ["# HELP gpulayer_http_responses_total API responses by status code.",
                    "# TYPE gpulayer_http_responses_total counter"]
            for code, n in sorted(self.requests.items()):
                out.append(f'gpulayer_http_responses_total{{code="{code}"}} {n}')
        return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------- state


class Server:
    """What the routes share: the control plane, the tokens, metrics, the wake-up event."""

    def __init__(self, control: ControlPlane, *, tick: float | None = None) -> None:
        self.control = control
        self.tokens = TokenStore(control.store)
        self.metrics = Metrics()
        previous = control.on_placement

        def on_placement(seconds: float) -> None:
            self.metrics.placement(seconds)
            if previous is not None:
                previous(seconds)

        control.on_placement = on_placement
        self.tick = tick if tick is not None else max(0.5, min(5.0, control.heartbeat_timeout / 3))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        inner = control._notify

        def _notify() -> None:  # the control plane changed something: wake the long polls
            inner()
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._wake)

        control._notify = _notify  # type: ignore[method-assign]
        # long polls of workers wait on their own event, set only when they got a task:
        # waking a thousand polls on every change of anything would swamp the database
        self._worker_events: dict[str, asyncio.Event] = {}
        self.shutting_down = False
        self._heartbeats: list[tuple[str, list[str], asyncio.Future[HeartbeatReply]]] = []
        self._heartbeat_writer: asyncio.Task[None] | None = None

        def _assigned(worker_ids: set[str]) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._wake_workers, worker_ids)

        control.on_assigned = _assigned

    def _wake_workers(self, worker_ids: set[str]) -> None:
        for wid in worker_ids:
            event = self._worker_events.get(wid)
            if event is not None:
                event.set()

    async def heartbeat(self, worker_id: str, running: list[str]) -> HeartbeatReply:
        """Record a heartbeat; heartbeats that arrive while one batch is being written are
        written together in the next, in one transaction (see ``ControlPlane.heartbeats``)."""
        future: asyncio.Future[HeartbeatReply] = asyncio.get_running_loop().create_future()
        self._heartbeats.append((worker_id, running, future))
        if self._heartbeat_writer is None or self._heartbeat_writer.done():
            self._heartbeat_writer = asyncio.create_task(self._write_heartbeats())
        return await future

    async def _write_heartbeats(self) -> None:
        while self._heartbeats:
            batch, self._heartbeats = self._heartbeats, []
            reports = {wid: running for wid, running, _ in batch}
            try:
                replies = await run_in_threadpool(self.control.heartbeats, reports)
            except Exception as exc:  # each waiting request answers with the error
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for wid, _, future in batch:
                if not future.done():
                    future.set_result(replies[wid])

    def begin_shutdown(self) -> None:
        """Answer every waiting long poll now, so a stopping server need not wait for them
        (thread-safe: called from uvicorn's signal handling)."""
        self.shutting_down = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        self._wake()
        for event in self._worker_events.values():
            event.set()

    def arm(self, worker_id: str) -> asyncio.Event:
        """A fresh event set when this server next assigns ``worker_id`` a task. Arm it
        before looking at the database, so an assignment in between is not missed."""
        event = self._worker_events[worker_id] = asyncio.Event()
        return event

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout: float) -> None:
        """Wait until the control plane changes something, or ``timeout`` seconds."""
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def background(self) -> None:
        """Expire silent workers and run a placement pass every ``tick`` seconds."""
        while True:
            await asyncio.sleep(self.tick)
            try:
                await run_in_threadpool(self.control.expire_workers)
                await run_in_threadpool(self.control.schedule)
            except Exception:  # the database may be away for a moment; try again next tick
                log.exception("background pass failed")


# ---------------------------------------------------------------------------------- routing


@dataclass
class Op:
    method: str
    path: str
    scopes: tuple[str, ...]
    summary: str
    handler: Callable[..., Awaitable[Response]]
    body: type[BaseModel] | None = None
    query: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (type, description)
    raw_body: str | None = None  # media type of a non-JSON body
    auth: bool = True


ROUTES: list[Op] = []


def op(method: str, path: str, scopes: tuple[str, ...], summary: str, *, body: type[BaseModel] | None = None,
       query: dict[str, tuple[str, str]] | None = None, raw_body: str | None = None, auth: bool = True,
       ) -> Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]:
    def deco(fn: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        ROUTES.append(Op(method, path, scopes, summary, fn, body, query or {}, raw_body, auth))
        return fn
    return deco


def error_response(exc: GpulayerError, status: int | None = None) -> JSONResponse:
    return JSONResponse({"error": exc.to_dict()}, status_code=status or exc.status_code)


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _scope_error(tok: TokenInfo, o: Op) -> AuthError:
    return AuthError(f"token {tok.id} has scope {tok.scope!r}; {o.method} {o.path} needs "
                     f"{' or '.join(repr(s) for s in o.scopes)}", 403)


def _endpoint(server: Server, o: Op) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            tok: TokenInfo | None = None
            if o.auth:
                secret = _bearer(request)
                # join/bootstrap tokens are only checked here; the join route spends a use
                tok = await run_in_threadpool(server.tokens.verify, secret)
                if tok.scope not in o.scopes:
                    raise _scope_error(tok, o)
                wid = request.path_params.get("worker_id")
                if wid is not None and tok.scope == "worker" and tok.worker_id != wid:
                    raise AuthError(f"token {tok.id} is the credential of worker {tok.worker_id}; "
                                    f"it cannot act for worker {wid}", 403)
            args: list[Any] = [server, request, tok]
            if o.body is not None:
                args.append(await _parse_body(request, o.body))
            response = await o.handler(*args)
        except GpulayerError as exc:
            response = error_response(exc)
        except ValidationError as exc:
            response = error_response(InvalidInput(_validation_message(exc, "query")))
        except Exception as exc:  # a bug: say so without leaking internals
            log.exception("%s %s failed", request.method, request.url.path)
            response = JSONResponse({"error": {"code": "internal", "message": f"internal error: {type(exc).__name__}"}},
                                    status_code=500)
        server.metrics.request(response.status_code)
        return response
    return endpoint


def _validation_message(exc: ValidationError, where: str) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in ("function-after", "tagged-union")))
        parts.append(f"{where}.{loc}: {err['msg']}" if loc else f"{where}: {err['msg']}")
    more = f" (and {len(exc.errors()) - 5} more)" if len(exc.errors()) > 5 else ""
    return "; ".join(parts) + more


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(f"request body of {int(declared)} bytes is over the limit of {limit} bytes")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise _TooLarge(f"request body is over the limit of {limit} bytes")
    return bytes(buf)


class _TooLarge(GpulayerError):
    status_code = 413
    code = "too_large"


class _BadRequest(GpulayerError):
    status_code = 400
    code = "bad_request"


async def _parse_body(request: Request, model: type[BaseModel]) -> BaseModel:
    raw = await _read_limited(request, MAX_JSON_BYTES)
    try:
        data = json.loads(raw) if raw.strip() else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise _BadRequest("request body is not acceptable JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise _BadRequest(f"request body: expected a JSON object, got {type(data).__name__ if data is not None else 'nothing'}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(_validation_message(exc, "body")) from None


def _q_int(request: Request, name: str, default: int | None, *, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"query parameter {name!r}: {raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise InvalidInput(f"query parameter {name!r}: {value} is out of range {lo}..{hi}")
    return value


def _q_float(request: Request, name: str, default: float, *, lo: float, hi: float) -> float:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"query parameter {name!r}: {raw!r} is not a number") from None
    if not math.isfinite(value) or value < lo:
        raise InvalidInput(f"query parameter {name!r}: expected a number from {lo} to {hi}")
    return min(value, hi)


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


# ---------------------------------------------------------------------------------- jobs

READERS = ("admin", "client")


async def _own_job(server: Server, tok: TokenInfo, job_id: str) -> Any:
    job = await run_in_threadpool(server.control.get_job, job_id)
    if tok.scope != "admin":
        owner = await run_in_threadpool(_owner_of, server, job_id)
        if owner != tok.id:
            raise NotFound(f"job {job_id!r}: no such job")
    return job


def _owner_of(server: Server, job_id: str) -> str | None:
    from gpulayer.store import JobRow

    with server.control.store.read() as s:
        row = s.get(JobRow, job_id)
        return row.owner if row is not None else None


@op("POST", "/v1/jobs", READERS, "Submit a job (idempotent with idempotency_key)", body=SubmitBody)
async def submit_job(server: Server, request: Request, tok: TokenInfo, body: SubmitBody) -> Response:
    # keys are per token: one owner can never see another's job by guessing its key
    key = f"{tok.id}:{body.idempotency_key}" if body.idempotency_key else None
    job = await run_in_threadpool(lambda: server.control.submit(body.spec, idempotency_key=key, owner=tok.id))
    return _json(_dump(job), 201)


@op("GET", "/v1/jobs", READERS, "List jobs (a client token sees its own)",
    query={"state": ("string", "only jobs in this state"), "limit": ("integer", "at most this many (1..1000)")})
async def list_jobs(server: Server, request: Request, tok: TokenInfo) -> Response:
    limit = _q_int(request, "limit", 100, lo=1, hi=1000)
    state = request.query_params.get("state") or None
    owner = None if tok.scope == "admin" else tok.id
    jobs = await run_in_threadpool(lambda: server.control.list_jobs(state=state, limit=limit or 100, owner=owner))
    return _json([_dump(j) for j in jobs])


@op("GET", "/v1/jobs/{job_id}", READERS, "One job with its tasks")
async def get_job(server: Server, request: Request, tok: TokenInfo) -> Response:
    return _json(_dump(await _own_job(server, tok, request.path_params["job_id"])))


@op("POST", "/v1/jobs/{job_id}/cancel", READERS, "Cancel a job")
async def cancel_job(server: Server, request: Request, tok: TokenInfo) -> Response:
    job_id = request.path_params["job_id"]
    await _own_job(server, tok, job_id)
    return _json(_dump(await run_in_threadpool(server.control.cancel, job_id)))


@op("GET", "/v1/jobs/{job_id}/logs", READERS, "Log chunks after an id",
    query={"after": ("integer", "only chunks with a larger id"), "node": ("integer", "one node's logs")})
async def job_logs(server: Server, request: Request, tok: TokenInfo) -> Response:
    job_id = request.path_params["job_id"]
    after = _q_int(request, "after", 0, lo=0, hi=2**62) or 0
    node = _q_int(request, "node", None, lo=0, hi=100_000)
    await _own_job(server, tok, job_id)
    chunks = await run_in_threadpool(lambda: server.control.logs(job_id, after=after, node=node))
    return _json([_dump(c) for c in chunks])


@op("GET", "/v1/jobs/{job_id}/wait", READERS, f"Long-poll until the job is terminal (at most {MAX_LONG_POLL:.0f} s)",
    query={"timeout": ("number", f"seconds to wait, at most {MAX_LONG_POLL:.0f}")})
async def wait_job(server: Server, request: Request, tok: TokenInfo) -> Response:
    job_id = request.path_params["job_id"]
    timeout = _q_float(request, "timeout", MAX_LONG_POLL, lo=0, hi=MAX_LONG_POLL)
    deadline = time.monotonic() + timeout
    job = await _own_job(server, tok, job_id)
    while not job.state.terminal:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or server.shutting_down or await request.is_disconnected():
            break
        await server.changed(min(remaining, 1.0))
        job = await run_in_threadpool(server.control.get_job, job_id)
    return _json(_dump(job))


@op("GET", "/v1/jobs/{job_id}/events", READERS, "The job's event history")
async def job_events(server: Server, request: Request, tok: TokenInfo) -> Response:
    job_id = request.path_params["job_id"]
    await _own_job(server, tok, job_id)
    return _json(await run_in_threadpool(server.control.events, job_id))


# ---------------------------------------------------------------------------------- bundles

BUNDLE_READERS = ("admin", "client", "worker")


def _digest_param(request: Request) -> str:
    digest = str(request.path_params["digest"])
    if not bundles.is_digest(digest):
        raise InvalidInput(f"bundle digest {digest!r} is not a SHA-256 address: expected 64 lowercase hex characters")
    return digest


@op("HEAD", "/v1/bundles/{digest}", BUNDLE_READERS, "Whether a bundle is stored (200 or 404)")
async def head_bundle(server: Server, request: Request, tok: TokenInfo) -> Response:
    digest = _digest_param(request)
    found = await run_in_threadpool(server.control.has_bundle, digest)
    return Response(status_code=200 if found else 404)


@op("GET", "/v1/bundles/{digest}", BUNDLE_READERS, "Download a bundle (application/zip)")
async def get_bundle(server: Server, request: Request, tok: TokenInfo) -> Response:
    digest = _digest_param(request)
    data = await run_in_threadpool(server.control.get_bundle, digest)
    return Response(data, media_type="application/zip", headers={"x-gpulayer-digest": digest})


@op("PUT", "/v1/bundles/{digest}", ("admin", "client"),
    "Upload a bundle; the body must hash to the digest (422) and fit GPULAYER_MAX_BUNDLE_MB (413)",
    raw_body="application/zip")
async def put_bundle(server: Server, request: Request, tok: TokenInfo) -> Response:
    digest = _digest_param(request)
    limit = config.max_bundle_bytes()
    declared = request.headers.get("content-length")
    too_large = (f"bundle is over the server's limit of {limit} bytes "
                 f"({limit / 1024 / 1024:g} MB, GPULAYER_MAX_BUNDLE_MB)")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(f"{too_large}: {int(declared)} bytes declared")
    h = hashlib.sha256()
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        h.update(chunk)
        if len(buf) > limit:
            raise _TooLarge(too_large)
    if h.hexdigest() != digest:
        raise BundleError(
            f"bundle content does not match its address: expected sha256 {digest}, got {h.hexdigest()} "
            f"({len(buf)} bytes); nothing was stored")
    stored = await run_in_threadpool(server.control.put_bundle, digest, bytes(buf))
    return _json({"digest": digest, "size": len(buf), "stored": stored}, 201 if stored else 200)


# ---------------------------------------------------------------------------------- workers


@op("POST", "/v1/workers/join", ("join", "bootstrap"),
    "Exchange a join or bootstrap token for a worker credential; registers the worker", body=JoinBody)
async def join_worker(server: Server, request: Request, tok: TokenInfo, body: JoinBody) -> Response:
    secret = _bearer(request)
    joined = await run_in_threadpool(server.tokens.verify, secret, consume=True)  # spends one use
    wid = new_id("wkr")
    origin = "provider" if joined.scope == "bootstrap" else "existing"
    cred, cred_secret = await run_in_threadpool(
        lambda: server.tokens.create("worker", worker_id=wid, description=f"credential of {wid} (joined with {joined.id})"))
    record = await run_in_threadpool(lambda: server.control.register_worker(
        body.capabilities, origin=origin, name=body.name, cpu_slots=body.cpu_slots, pid=body.pid,
        worker_id=wid, token_id=cred.id))
    return _json({"worker_id": wid, "token": cred_secret, "token_id": cred.id, "worker": _dump(record)}, 201)


@op("POST", "/v1/workers/{worker_id}/register", ("worker",),
    "Register again (after the control plane forgot the worker)", body=JoinBody)
async def reregister_worker(server: Server, request: Request, tok: TokenInfo, body: JoinBody) -> Response:
    wid = request.path_params["worker_id"]
    try:
        origin = (await run_in_threadpool(server.control.get_worker, wid)).origin
    except NotFound:
        origin = "existing"
    record = await run_in_threadpool(lambda: server.control.register_worker(
        body.capabilities, origin=origin, name=body.name, cpu_slots=body.cpu_slots, pid=body.pid,
        worker_id=wid, token_id=tok.id))
    return _json(_dump(record))


@op("POST", "/v1/workers/{worker_id}/heartbeat", ("worker",), "Heartbeat; returns the tasks to end",
    body=HeartbeatBody)
async def heartbeat(server: Server, request: Request, tok: TokenInfo, body: HeartbeatBody) -> Response:
    wid = request.path_params["worker_id"]
    reply = await server.heartbeat(wid, body.running)
    return _json(_dump(reply))


@op("GET", "/v1/workers/{worker_id}/tasks", ("worker",),
    f"Long-poll for assigned tasks (wait at most {MAX_LONG_POLL:.0f} s)",
    query={"wait": ("number", f"seconds to wait for work, at most {MAX_LONG_POLL:.0f}")})
async def poll_tasks(server: Server, request: Request, tok: TokenInfo) -> Response:
    wid = request.path_params["worker_id"]
    wait = _q_float(request, "wait", 0.0, lo=0, hi=MAX_LONG_POLL)
    deadline = time.monotonic() + wait
    while True:
        assigned = server.arm(wid)
        out: list[TaskAssignment] = await run_in_threadpool(server.control.poll, wid, 0.0)
        remaining = deadline - time.monotonic()
        if out or remaining <= 0 or server.shutting_down or await request.is_disconnected():
            return _json([_dump(a) for a in out])
        # woken at once by this server's assignments; another server sharing the database
        # is noticed at the next look, at most POLL_RECHECK seconds later
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(assigned.wait(), min(remaining, POLL_RECHECK))


@op("POST", "/v1/workers/{worker_id}/drain", ("worker", "admin"), "Take no new work")
async def drain_worker(server: Server, request: Request, tok: TokenInfo) -> Response:
    wid = request.path_params["worker_id"]
    await run_in_threadpool(server.control.set_draining, wid)
    return _json({"worker_id": wid, "draining": True})


@op("DELETE", "/v1/workers/{worker_id}", ("worker", "admin"),
    "Deregister: the worker is offline, its unfinished tasks lost, its credential revoked")
async def delete_worker(server: Server, request: Request, tok: TokenInfo) -> Response:
    wid = request.path_params["worker_id"]
    await run_in_threadpool(server.control.get_worker, wid)  # 404 for an unknown id
    await run_in_threadpool(server.control.deregister_worker, wid)
    await run_in_threadpool(server.tokens.revoke_worker_tokens, wid)
    return _json({"worker_id": wid, "deregistered": True})


@op("GET", "/v1/workers", READERS, "Registered workers")
async def list_workers(server: Server, request: Request, tok: TokenInfo) -> Response:
    return _json([_dump(w) for w in await run_in_threadpool(server.control.list_workers)])


@op("GET", "/v1/workers/usage", READERS, "Busy devices and CPU slots per online worker")
async def worker_usage(server: Server, request: Request, tok: TokenInfo) -> Response:
    return _json(await run_in_threadpool(server.control.worker_usage))


# ---------------------------------------------------------------------------------- tasks


@op("POST", "/v1/tasks/{task_id}/start", ("worker",), "The worker started the task")
async def start_task(server: Server, request: Request, tok: TokenInfo) -> Response:
    tid = request.path_params["task_id"]
    await run_in_threadpool(server.control.start_task, tid, tok.worker_id or "")
    return _json({"task_id": tid, "state": "running"})


@op("POST", "/v1/tasks/{task_id}/logs", ("worker",), "Append log chunks", body=LogsBody)
async def task_logs(server: Server, request: Request, tok: TokenInfo, body: LogsBody) -> Response:
    tid = request.path_params["task_id"]
    chunks: list[tuple[str, str]] = [(s, d) for s, d in body.chunks]
    await run_in_threadpool(server.control.append_logs, tid, tok.worker_id or "", chunks)
    return _json({"task_id": tid, "appended": len(chunks)})


@op("POST", "/v1/tasks/{task_id}/finish", ("worker",), "The task's final report (409 if it already ended)",
    body=FinishBody)
async def finish_task(server: Server, request: Request, tok: TokenInfo, body: FinishBody) -> Response:
    tid = request.path_params["task_id"]
    await run_in_threadpool(lambda: server.control.finish_task(
        tid, tok.worker_id or "", body.state, exit_code=body.exit_code, result=body.result, error=body.error))
    return _json({"task_id": tid, "state": body.state.value})


# ---------------------------------------------------------------------------------- tokens


@op("POST", "/v1/tokens", ("admin",), "Create a token; the secret is in the reply only", body=TokenBody)
async def create_token(server: Server, request: Request, tok: TokenInfo, body: TokenBody) -> Response:
    info, secret = await run_in_threadpool(lambda: server.tokens.create(
        body.scope, ttl=body.ttl, uses=body.uses, description=body.description))
    return _json({**info.to_dict(), "token": secret}, 201)


@op("GET", "/v1/tokens", ("admin",), "List tokens (never their secrets)")
async def list_tokens(server: Server, request: Request, tok: TokenInfo) -> Response:
    return _json([t.to_dict() for t in await run_in_threadpool(server.tokens.list)])


@op("DELETE", "/v1/tokens/{token_id}", ("admin",), "Revoke a token")
async def revoke_token(server: Server, request: Request, tok: TokenInfo) -> Response:
    info = await run_in_threadpool(server.tokens.revoke, request.path_params["token_id"])
    return _json(info.to_dict())


# ---------------------------------------------------------------------------------- misc


@op("GET", "/metrics", ("admin",), "Prometheus metrics (text format)")
async def metrics(server: Server, request: Request, tok: TokenInfo) -> Response:
    counts = await run_in_threadpool(server.control.counts)
    return PlainTextResponse(server.metrics.render(counts), media_type="text/plain; version=0.0.4")


@op("GET", "/v1/openapi.json", ALL_SCOPES, "This document")
async def openapi(server: Server, request: Request, tok: TokenInfo) -> Response:
    return _json(openapi_document())


@op("GET", "/healthz", (), "Liveness: {\"ok\": true}; the only route without a token", auth=False)
async def healthz(server: Server, request: Request, tok: TokenInfo | None) -> Response:
    return _json({"ok": True})


# ---------------------------------------------------------------------------------- OpenAPI

_DOC: dict[str, Any] | None = None


def openapi_document() -> dict[str, Any]:
    global _DOC
    if _DOC is not None:
        return _DOC
    from gpulayer import __version__ as version

    components: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for o in ROUTES:
        item: dict[str, Any] = {
            "summary": o.summary,
            "operationId": o.handler.__name__,
            "x-scopes": list(o.scopes),
            "responses": {"200": {"description": "OK"}, "401": {"description": "missing or invalid token"},
                          "403": {"description": "token scope not allowed"},
                          "422": {"description": "invalid input"}},
        }
        if o.auth:
            item["security"] = [{"bearer": []}]
        else:
            item["security"] = []
        params = []
        for name in _path_params(o.path):
            params.append({"name": name, "in": "path", "required": True, "schema": {"type": "string"}})
        for name, (typ, desc) in o.query.items():
            params.append({"name": name, "in": "query", "required": False, "description": desc,
                           "schema": {"type": typ}})
        if params:
            item["parameters"] = params
        if o.body is not None:
            schema = o.body.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(schema.pop("$defs", {}))
            components[o.body.__name__] = schema
            item["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{o.body.__name__}"}}}}
        elif o.raw_body:
            item["requestBody"] = {"required": True, "content": {o.raw_body: {
                "schema": {"type": "string", "format": "binary"}}}}
        paths.setdefault(o.path, {})[o.method.lower()] = item
    _DOC = {
        "openapi": "3.0.3",
        "info": {"title": "GPUlayer control plane", "version": version},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
    return _DOC


def _path_params(path: str) -> list[str]:
    import re

    return re.findall(r"\{(\w+)\}", path)


# ---------------------------------------------------------------------------------- the app


def create_app(control: ControlPlane | None = None, *, database_url: str | None = None,
               background: bool = True, threads: int = 200) -> Starlette:
    """The ASGI app. ``control`` defaults to a control plane on ``database_url``."""
    if control is None:
        control = ControlPlane(Store(database_url))
    server = Server(control)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        server._loop = asyncio.get_running_loop()
        server._changed = asyncio.Event()
        task = asyncio.create_task(server.background()) if background else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            server._loop = None
            control.store.dispose()

    # A static segment ("/v1/workers/join", "/v1/workers/usage") must win over "{worker_id}".
    ordered = sorted(ROUTES, key=lambda o: "{" in o.path)
    routes: list[Route] = []
    by_path: dict[str, dict[str, Op]] = {}
    for o in ordered:
        by_path.setdefault(o.path, {})[o.method] = o
    for path, methods in by_path.items():
        handlers = {m: _endpoint(server, o) for m, o in methods.items()}

        async def dispatch(request: Request, handlers: dict[str, Any] = handlers) -> Response:
            h = handlers.get(request.method) or (handlers.get("GET") if request.method == "HEAD" else None)
            if h is None:
                return JSONResponse({"error": {"code": "method_not_allowed",
                                               "message": f"{request.method} is not allowed here; "
                                                          f"allowed: {', '.join(sorted(handlers))}"}},
                                    status_code=405, headers={"allow": ", ".join(sorted(handlers))})
            response: Response = await h(request)
            return response

        all_methods = sorted({*methods, "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
        routes.append(Route(path, dispatch, methods=all_methods))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"error": {"code": code, "message": f"{request.method} {request.url.path}: {exc.detail}"}},
                            status_code=exc.status_code)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.server = server
    return app


def default_threads() -> int:
    return int(os.environ.get("GPULAYER_SERVER_THREADS", "200"))


# a module-level TypeAdapter keeps pydantic's JobSpec schema cached for the OpenAPI document
_SPEC_ADAPTER = TypeAdapter(JobSpec)
