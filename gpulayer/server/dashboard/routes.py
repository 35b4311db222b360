"""The dashboard's routes: login and logout, the pages, cancel and run again, and their live streams.

Every route in :data:`ROUTES` but the login form needs a session: a page without one
redirects to the login (303, remembering where it was going), a form is refused the same
way without doing anything, and a live stream answers 401. Forms are checked for the
session's CSRF token and, where the browser says where the form came from (``Origin``), for
coming from this site. Pages are HTML that reads without JavaScript; ``dashboard.js`` only
adds the live stream. Every control-plane call and every rendering runs in the thread pool.
"""

from __future__ import annotations

import functools
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gpulayer.api import ListJobsQuery
from gpulayer.errors import AuthError, BadRequest, DatabaseFailed, GpulayerError, InvalidInput, NotFound, TooLarge
from gpulayer.server.dashboard import live, views
from gpulayer.server.dashboard.sessions import COOKIE, RECHECK_TOKEN, Login, Session, Sessions, safe_next
from gpulayer.wording import Spelling, build

if TYPE_CHECKING:
    from gpulayer.server.dashboard import DashboardOptions
    from gpulayer.server.state import Server

log = logging.getLogger("gpulayer.server.dashboard")

#: the largest form body accepted (a token, a CSRF token, a path)
MAX_FORM_BYTES = 16 * 1024
STATIC = "/static"
#: no inline script or style, nothing from elsewhere: an injected tag would do nothing
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "referrer-policy": "same-origin",
           "x-frame-options": "DENY", "cache-control": "no-store"}

Access = Literal["open", "page", "form", "live"]

#: the jobs page's ``limit``: its default, and the most it takes (the API's)
DEFAULT_LIMIT: int = ListJobsQuery.model_fields["limit"].default
MAX_LIMIT: int = next(m.le for m in ListJobsQuery.model_fields["limit"].metadata if hasattr(m, "le"))
_LIMITS = {"default_limit": DEFAULT_LIMIT, "max_limit": MAX_LIMIT}


@dataclass(frozen=True)
class DashboardRoute:
    """One route of the dashboard. ``access``: ``open`` (the login, no session needed),
    ``page`` (HTML; no session: a redirect to the login), ``form`` (a POST that changes
    something; needs the session's CSRF token), ``live`` (a server-sent event stream; no
    session: 401)."""

    name: str
    method: str
    path: str
    access: Access


ROUTES: tuple[DashboardRoute, ...] = (
    DashboardRoute("login_form", "GET", "/login", "open"),
    DashboardRoute("login", "POST", "/login", "open"),
    DashboardRoute("logout", "POST", "/logout", "form"),
    DashboardRoute("overview", "GET", "/", "page"),
    DashboardRoute("jobs", "GET", "/jobs", "page"),
    DashboardRoute("job", "GET", "/jobs/{job_id}", "page"),
    DashboardRoute("cancel", "POST", "/jobs/{job_id}/cancel", "form"),
    DashboardRoute("rerun", "POST", "/jobs/{job_id}/rerun", "form"),
    DashboardRoute("artifacts", "GET", "/jobs/{job_id}/artifacts/{task_id}", "page"),
    DashboardRoute("workers", "GET", "/workers", "page"),
    DashboardRoute("machines", "GET", "/machines", "page"),
    DashboardRoute("live_overview", "GET", "/live/overview", "live"),
    DashboardRoute("live_jobs", "GET", "/live/jobs", "live"),
    DashboardRoute("live_job", "GET", "/live/jobs/{job_id}", "live"),
    DashboardRoute("live_workers", "GET", "/live/workers", "live"),
)

Endpoint = Callable[[Request, Session], Awaitable[Response]]


def html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def root(request: Request) -> str:
    """The path the dashboard is served under (``server start --root-path``, a proxy's
    prefix), without its last ``/``: every link, redirect and cookie starts with it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def route_path(request: Request) -> str:
    """The request's path within the dashboard, without the root path (a proxy may pass
    the prefix on or strip it; a server may be reached directly too)."""
    path, prefix = request.url.path, root(request)
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        return path[len(prefix):] or "/"
    return path


def _same_origin(request: Request) -> bool:
    """A form post names the page it came from in ``Origin`` (every current browser does);
    only the host is compared, since a proxy in front may terminate TLS."""
    origin = request.headers.get("origin")
    if origin is None:
        return True  # an older browser: the CSRF token still guards the form
    return urllib.parse.urlsplit(origin).netloc == request.headers.get("host", "")


async def _read_form(request: Request) -> dict[str, str]:
    """A urlencoded form, read with a size limit (stdlib parsing: the dashboard's forms have
    three fields, not worth a multipart parser as a dependency)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise TooLarge(f"form is over the limit of {MAX_FORM_BYTES} bytes")
    if not body:
        return {}  # an empty form: refused for what it lacks (a token, a CSRF token)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise BadRequest(f"a form is sent as application/x-www-form-urlencoded, not {ctype or 'nothing'}")
    try:
        parsed = urllib.parse.parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"form is not readable: {exc}") from None
    return {k: v[0] for k, v in parsed.items()}


class Dashboard:
    """The dashboard of one :class:`Server`: its sessions, its login, its handlers."""

    def __init__(self, server: Server, options: DashboardOptions) -> None:
        self.server = server
        self.control = server.control
        self.options = options
        self.sessions = Sessions()
        self.login = Login(server.tokens, options.run_token)

    # ------------------------------------------------------------------ sessions

    async def session(self, request: Request) -> Session | None:
        """The request's live session, if it has one."""
        session = self.sessions.get(request.cookies.get(COOKIE))
        return session if session is not None and await self._still_valid(session) else None

    async def _still_valid(self, session: Session) -> bool:
        """Whether the session goes on: not logged out or expired, and its token (looked at
        again every few seconds) neither revoked nor expired."""
        if self.sessions.get(session.id) is not session:
            return False
        now = time.time()
        if now - session.checked_at >= RECHECK_TOKEN:
            if not await run_in_threadpool(self.login.still_valid, session.identity):
                self.sessions.drop(session.id)
                return False
            session.checked_at = now
        return True

    def _guarded(self, route: DashboardRoute, endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            session: Session | None = None
            try:
                session = await self.session(request)
                if session is None:
                    return self._no_session(request, route)
                if route.access == "form":
                    form = await _read_form(request)
                    if not _same_origin(request) or not session.csrf_ok(form.get("csrf")):
                        return self._error(request, session, 403, "This form's CSRF token is missing or out of "
                                           "date, or the form came from another site: nothing was done. Go back, "
                                           "reload the page and try again.")
                return await endpoint(request, session)
            except GpulayerError as exc:
                if isinstance(exc, DatabaseFailed):  # (as the API says it: its log names the database)
                    log.warning("%s", exc)
                    exc = exc.for_clients()
                return self._error(request, session, exc.status_code, str(exc))
            except Exception:  # a bug: say so without leaking internals
                log.exception("%s %s failed", request.method, request.url.path)
                return self._error(request, session, 500, "internal error (see the server's log)")

        return guarded

    def _no_session(self, request: Request, route: DashboardRoute) -> Response:
        if route.access == "live":
            response: Response = PlainTextResponse("not logged in (or the session ended): log in again",
                                                   status_code=401, headers=HEADERS)
        else:
            home = root(request) + "/"
            target = root(request) + route_path(request) + (f"?{request.url.query}" if request.url.query else "")
            if route.access == "form":
                target = home  # never replay a form after the login
            query = urllib.parse.urlencode({"next": target}) if target != home else ""
            response = RedirectResponse(f"{root(request)}/login" + (f"?{query}" if query else ""), status_code=303,
                                        headers=HEADERS)
        if COOKIE in request.cookies:
            response.delete_cookie(COOKIE, path=root(request) + "/")
        return response

    def _base(self, request: Request, session: Session | None, current: str, *,
              stream: bool = False) -> dict[str, Any]:
        """What every template is given (``root``: what every link starts with). A page
        shows the session's notice once; a stream leaves it for the page."""
        notice = session.take_notice() if session is not None and not stream else None
        return {"who": session.identity if session else None, "csrf": session.csrf if session else "",
                "notice": notice, "current": current, "root": root(request),
                "static": root(request) + STATIC, "live": None, "machines_nav": self.control.providers is not None}

    def _error(self, request: Request, session: Session | None, status: int, message: str) -> Response:
        if route_path(request).startswith("/live/"):
            return PlainTextResponse(message, status_code=status, headers=HEADERS)
        context = {**self._base(request, session, ""), "status": status, "message": message}
        return html(views.render("error.html", context), status)

    async def _page(self, template: str, context: dict[str, Any], load: Callable[[], dict[str, Any]]) -> Response:
        def run() -> str:
            return views.render(template, {**context, **load()})

        return html(await run_in_threadpool(run))

    # ------------------------------------------------------------------ login

    async def login_form(self, request: Request) -> Response:
        session = await self.session(request)
        target = safe_next(request.query_params.get("next"), root(request))
        if session is not None:
            return RedirectResponse(target, status_code=303, headers=HEADERS)
        return self._login_page(request, target, None, 200)

    def _login_page(self, request: Request, target: str, error: str | None, status: int) -> Response:
        context = {**self._base(request, None, "login"), "next": target, "error": error,
                   "embedded": self.options.run_token is not None}
        return html(views.render("login.html", context), status)

    async def login_submit(self, request: Request) -> Response:
        try:
            form = await _read_form(request)
        except GpulayerError as exc:
            return self._login_page(request, root(request) + "/", str(exc), exc.status_code)
        target = safe_next(form.get("next"), root(request))
        if not _same_origin(request):
            return self._login_page(request, target, "This login form came from another site; log in here.", 403)
        secret = form.get("token", "").strip()
        if not secret:
            return self._login_page(request, target, "Enter an admin or a client token.", 400)
        try:
            who = await run_in_threadpool(self.login.verify, secret)
        except AuthError as exc:  # Forbidden too: a worker, join or bootstrap token
            # (the API's hint names the CLI's settings: nothing a browser has)
            said = str(exc).replace(" (check GPULAYER_TOKEN / --token)", "; paste an admin or a client token")
            return self._login_page(request, target, said, exc.status_code)
        old = request.cookies.get(COOKIE)
        if old:
            self.sessions.drop(old)  # a login always starts a new session (no fixation)
        session = self.sessions.create(who)
        response = RedirectResponse(target, status_code=303, headers=HEADERS)
        response.set_cookie(COOKIE, session.id, max_age=max(1, int(session.expires_at - time.time())),
                            path=root(request) + "/",
                            httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request, session: Session) -> Response:
        self.sessions.drop(session.id)
        response = RedirectResponse(f"{root(request)}/login", status_code=303, headers=HEADERS)
        response.delete_cookie(COOKIE, path=root(request) + "/", httponly=True, samesite="strict",
                               secure=request.url.scheme == "https")
        return response

    # ------------------------------------------------------------------ pages

    async def overview(self, request: Request, session: Session) -> Response:
        context = {**self._base(request, session, "overview"), "live": f"{root(request)}/live/overview"}
        return await self._page("overview.html", context, lambda: views.overview(self.control, session.identity))

    def _jobs_query(self, request: Request) -> ListJobsQuery:
        params = {k: v for k, v in request.query_params.items() if v != ""}  # the form's "any state"
        return build(ListJobsQuery, params, Spelling(where="query"))

    async def jobs(self, request: Request, session: Session) -> Response:
        context = {**self._base(request, session, "jobs"), **_LIMITS}
        try:
            query = self._jobs_query(request)
        except InvalidInput as exc:
            context.update(error=str(exc), state="", jobs=[], now=time.time(), more=False, limit=DEFAULT_LIMIT)
            return html(await run_in_threadpool(views.render, "jobs.html", context), exc.status_code)
        state = query.state.value if query.state else ""
        live_query = urllib.parse.urlencode({k: v for k, v in (("state", state), ("limit", query.limit),
                                                                ("before", query.before)) if v})
        context.update(error=None, state=state, live=f"{root(request)}/live/jobs?{live_query}", **_LIMITS)
        return await self._page("jobs.html", context, lambda: views.jobs(
            self.control, session.identity, state=query.state, limit=query.limit, before=query.before))

    async def job(self, request: Request, session: Session) -> Response:
        job_id = request.path_params["job_id"]

        def load() -> dict[str, Any]:
            data = views.job(self.control, session.identity, job_id)
            # an ended job's page streams too while its log goes on past what the page shows
            # (the stream sends the rest and ends)
            done = data["job"].state.terminal and not data["log_more"]
            live_url = None if done else f"{root(request)}/live/jobs/{urllib.parse.quote(job_id)}?after={data['log_after']}"
            return {**data, "live": live_url}

        return await self._page("job.html", self._base(request, session, "jobs"), load)

    async def cancel(self, request: Request, session: Session) -> Response:
        job_id = request.path_params["job_id"]

        def run() -> str:
            before = views.visible_job(self.control, session.identity, job_id)
            if before.state.terminal:
                return f"Job {job_id} had already ended ({before.state.value}); nothing to cancel."
            after = self.control.cancel(job_id)
            return f"Job {job_id} cancelled." if after.state.terminal else \
                f"Cancel requested for job {job_id}: its worker ends it at its next heartbeat."

        session.notice = await run_in_threadpool(run)
        return RedirectResponse(f"{root(request)}/jobs/{urllib.parse.quote(job_id)}", status_code=303, headers=HEADERS)

    async def rerun(self, request: Request, session: Session) -> Response:
        """Run an ended job again (gpulayer jobs rerun): the new job's page, or the job's with why not."""
        job_id = request.path_params["job_id"]

        def run() -> tuple[str, str]:
            before = views.visible_job(self.control, session.identity, job_id, arguments=False)
            if not before.state.terminal:
                return job_id, f"Job {job_id} is {before.state.value}: a job is run again once it has ended."
            new = self.control.rerun_jobs([job_id], owner=session.identity.owner).rerun.get(job_id)
            if new is None:  # (it ended and was deleted meanwhile)
                return job_id, f"Job {job_id} could not be run again."
            return new, f"Job {job_id} run again as {new}."

        shown, session.notice = await run_in_threadpool(run)
        return RedirectResponse(f"{root(request)}/jobs/{urllib.parse.quote(shown)}", status_code=303, headers=HEADERS)

    async def artifacts(self, request: Request, session: Session) -> Response:
        """One task's artifacts, as a zip to save (gpulayer jobs artifacts)."""
        job_id, task_id = request.path_params["job_id"], request.path_params["task_id"]

        def read() -> bytes:
            views.visible_job(self.control, session.identity, job_id, arguments=False)
            return self.control.get_artifacts(job_id, task_id)

        data = await run_in_threadpool(read)
        name = urllib.parse.quote(f"{job_id}-{task_id}-artifacts.zip")
        return Response(data, media_type="application/zip",
                        headers={**HEADERS, "content-disposition": f"attachment; filename*=UTF-8''{name}"})

    async def workers(self, request: Request, session: Session) -> Response:
        context = {**self._base(request, session, "workers"), "live": f"{root(request)}/live/workers"}
        return await self._page("workers.html", context, lambda: views.workers(self.control, session.identity))

    async def machines(self, request: Request, session: Session) -> Response:
        return await self._page("machines.html", self._base(request, session, "machines"),
                                lambda: views.machines(self.control, session.identity))

    # ------------------------------------------------------------------ live streams

    def _stream(self, session: Session, look: Callable[[], live.Frame], job_id: str | None = None) -> Response:
        async def alive() -> bool:
            return await self._still_valid(session)

        body = live.stream(self.server, look, alive=alive, recheck=self.options.recheck, job_id=job_id)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={**HEADERS, "x-accel-buffering": "no"})

    def _regions(self, request: Request, session: Session, template: str, current: str,
                 load: Callable[[], dict[str, Any]]) -> Callable[[], live.Frame]:
        base = self._base(request, session, current, stream=True)

        def look() -> live.Frame:
            return live.Frame(views.render_live(template, {**base, **load()}))

        return look

    async def live_overview(self, request: Request, session: Session) -> Response:
        return self._stream(session, self._regions(request, session, "overview.html", "overview",
                                                   lambda: views.overview(self.control, session.identity)))

    async def live_workers(self, request: Request, session: Session) -> Response:
        return self._stream(session, self._regions(request, session, "workers.html", "workers",
                                                   lambda: views.workers(self.control, session.identity)))

    async def live_jobs(self, request: Request, session: Session) -> Response:
        query = self._jobs_query(request)
        extra = {"error": None, "state": query.state.value if query.state else "", **_LIMITS}

        def load() -> dict[str, Any]:
            try:
                listed = views.jobs(self.control, session.identity, state=query.state, limit=query.limit,
                                    before=query.before)
            except NotFound:  # (the page's first load found it: it was deleted since)
                raise live.Gone(f"Job {query.before} was deleted: this page lists the jobs submitted before it. "
                                "Open the list of jobs again to see the newest.") from None
            return {**extra, **listed}

        return self._stream(session, self._regions(request, session, "jobs.html", "jobs", load))

    async def live_job(self, request: Request, session: Session) -> Response:
        job_id = request.path_params["job_id"]
        after = _after(request)
        await run_in_threadpool(functools.partial(views.visible_job, self.control, session.identity, job_id,
                                                  arguments=False))  # 404 before streaming
        base = self._base(request, session, "jobs", stream=True)

        def look() -> live.Frame:
            nonlocal after
            try:
                data = views.job(self.control, session.identity, job_id, logs=False, spec=False)
                parts, last, more = views.read_logs(self.control, data["job"], after)
            except NotFound:  # (it was there when the stream began)
                raise live.Gone(f"Job {job_id} was deleted; nothing more will change.") from None
            after = last
            ended = data["job"].state.terminal
            # an ended job's stream looks once more at once: for output that came with the end
            return live.Frame(views.render_live("job.html", {**base, **data}), log=parts, log_after=last,
                              more=more or ended, end=ended and not parts and not more)

        return self._stream(session, look, job_id)

    # ------------------------------------------------------------------ the route table

    def routes(self) -> list[BaseRoute]:
        """One Starlette route per path, for all its methods: a method the path does not
        serve is a 405 whose Allow header lists every one it does (a route per method would
        name those of the first route alone: ``DELETE /login`` said "GET, HEAD")."""
        by_path: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
        for r in ROUTES:
            endpoint: Callable[[Request], Awaitable[Response]]
            if r.access == "open":
                endpoint = self.login_form if r.method == "GET" else self.login_submit
            else:
                endpoint = self._guarded(r, getattr(self, r.name))
            by_path.setdefault(r.path, {})[r.method] = endpoint
        out: list[BaseRoute] = []
        for path, handlers in by_path.items():
            async def dispatch(request: Request, handlers: dict[str, Any] = handlers) -> Response:
                response: Response = await handlers["GET" if request.method == "HEAD" else request.method](request)
                return response

            out.append(Route(path, dispatch, methods=list(handlers), name=f"dashboard {path}"))
        out.append(Mount(STATIC, StaticFiles(packages=[("gpulayer.server.dashboard", "static")]), name="static"))
        return out


def _after(request: Request) -> int:
    """The last log chunk the page has: ``?after=`` or, when the browser reconnects, the id
    of the last ``log`` event it received (a header the browser sends back as it got it: one
    that is not such an id is ignored)."""
    after = request.query_params.get("after", "")
    if after and not _chunk_id(after):
        raise InvalidInput(f"query.after={after!r}: expected a whole number from 0 to {MAX_CHUNK_ID}")
    values = [after, request.headers.get("last-event-id", "")]
    return max((int(v) for v in values if _chunk_id(v)), default=0)


#: the largest log chunk id (the API's ``after`` takes no more)
MAX_CHUNK_ID = 2**62


def _chunk_id(text: str) -> bool:
    """Whether ``text`` is a log chunk id: ASCII digits (``str.isdigit`` also takes ``²``,
    which ``int`` refuses), at most :data:`MAX_CHUNK_ID` (19 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= MAX_CHUNK_ID
