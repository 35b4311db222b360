"""The dashboard over plain HTTP against a real ``gpulayer server start`` process: every
route needs a session, the login and its cookie, CSRF on forms, who sees which job, bad
input, escaping, and the live stream of a job. (The browser tests are in tests/browser/.)"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer.server.dashboard import ROUTES
from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc, until
from tests.support import cli

pytestmark = pytest.mark.timeout(300)

#: a job that waits in the queue whatever joins this module's server (some tests join
#: workers: a job any of them could run was assigned to it, and a test that found its job no
#: longer queued failed or not by the order in which pytest-xdist handed out the tests)
QUEUED = {"kind": "command", "command": ["true"], "requirements": {"cpus": 4096},
          "placement": {"target": "remote", "on_unschedulable": "wait"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path_factory.mktemp("dashboard-home")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def admin(server: ServerProc) -> Api:
    return Api(server.url, server.admin_token)


def submit(api: Api, spec: dict[str, Any] | None = None) -> str:
    """A job that waits in the queue (:data:`QUEUED`: no worker has its CPUs)."""
    r = api("POST", "/v1/jobs", json={"spec": spec or QUEUED})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def browser(server: ServerProc) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=30, verify=False, follow_redirects=False)


def login(server: ServerProc, token: str) -> httpx.Client:
    c = browser(server)
    r = c.post("/login", data={"token": token})
    assert r.status_code == 303, r.text
    assert "gpulayer_session" in c.cookies
    return c


def csrf_of(c: httpx.Client, path: str = "/jobs") -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', c.get(path).text)
    assert m, "no CSRF token on the page"
    return m.group(1)


def fill(path: str, job_id: str) -> str:
    return path.replace("{job_id}", job_id)


def test_no_dashboard_route_is_an_api_operation(admin: Api) -> None:
    documented = set(admin("GET", "/v1/openapi.json").json()["paths"])
    assert documented, "the OpenAPI document lists no paths"
    assert not documented & {r.path for r in ROUTES}
    assert not any(p == "/" or p.startswith(("/jobs", "/login", "/live", "/static")) for p in documented)


def test_every_dashboard_route_needs_a_session(server: ServerProc, admin: Api) -> None:
    job_id = submit(admin)
    guarded = [r for r in ROUTES if r.access != "open"]
    assert {r.access for r in guarded} == {"page", "form", "live"}
    # no cookie; a made-up session; the admin token itself where the session id goes; the
    # API's way (a bearer token) instead of a session
    attempts: list[dict[str, Any]] = [
        {}, {"cookies": {"gpulayer_session": "not-a-session"}},
        {"cookies": {"gpulayer_session": server.admin_token}},
        {"headers": {"authorization": f"Bearer {server.admin_token}"}},
    ]
    for r in guarded:
        for kw in attempts:
            c = browser(server)
            for k, v in kw.get("cookies", {}).items():
                c.cookies.set(k, v)
            data = {"csrf": "x"} if r.method == "POST" else None
            resp = c.request(r.method, fill(r.path, job_id), data=data, headers=kw.get("headers"))
            if r.access == "live":
                assert resp.status_code == 401, (r.path, kw, resp.status_code)
            else:
                assert resp.status_code == 303, (r.path, kw, resp.status_code, resp.text[:200])
                assert resp.headers["location"].startswith("/login"), (r.path, resp.headers["location"])
    # a page remembers where it was going; a form does not (it is never replayed)
    assert browser(server).get("/jobs?state=queued").headers["location"] == "/login?next=%2Fjobs%3Fstate%3Dqueued"
    assert admin("GET", f"/v1/jobs/{job_id}").json()["state"] == "queued"  # no cancel went through


def test_login_and_static_files_are_the_only_open_routes(server: ServerProc) -> None:
    c = browser(server)
    page = c.get("/login")
    assert page.status_code == 200
    assert '<label for="token">' in page.text and 'type="password"' in page.text
    css = c.get("/static/dashboard.css")
    assert css.status_code == 200 and "text/css" in css.headers["content-type"]
    assert c.get("/static/dashboard.js").status_code == 200
    assert c.get("/static/../app.py").status_code == 404


def test_login_sets_a_strict_httponly_cookie_that_is_not_the_token(server: ServerProc) -> None:
    c = browser(server)
    r = c.post("/login", data={"token": server.admin_token, "next": "/workers"})
    assert r.status_code == 303 and r.headers["location"] == "/workers"
    cookie = r.headers["set-cookie"]
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path", "max-age"} <= attrs
    assert "samesite=strict" in cookie.lower()
    assert "secure" not in attrs  # plain HTTP on loopback (HTTPS: the next test's server)
    sid = c.cookies["gpulayer_session"]
    assert sid != server.admin_token and server.admin_token not in str(r.headers)
    page = c.get("/workers")
    assert page.status_code == 200 and "admin token tok-" in page.text
    assert server.admin_token not in page.text
    assert page.headers["cache-control"] == "no-store"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    # already logged in: the login form sends you on
    again = c.get("/login?next=/jobs")
    assert again.status_code == 303 and again.headers["location"] == "/jobs"
    # a second login starts a new session and ends the old one
    c.post("/login", data={"token": server.admin_token})
    assert c.cookies["gpulayer_session"] != sid
    old = browser(server)
    old.cookies.set("gpulayer_session", sid)
    assert old.get("/jobs").status_code == 303


def test_secure_cookie_over_https(tmp_path_factory: pytest.TempPathFactory) -> None:
    srv = ServerProc(tmp_path_factory.mktemp("dashboard-tls"), args=("--self-signed",)).start()
    try:
        r = browser(srv).post("/login", data={"token": srv.admin_token})
        assert r.status_code == 303
        assert "secure" in {a.strip().lower() for a in r.headers["set-cookie"].split(";")}
    finally:
        srv.stop()


def _token_uses(admin: Api, token_id: str) -> Any:
    return next(t for t in admin("GET", "/v1/tokens").json() if t["id"] == token_id)["uses_left"]


def test_login_refuses_unusable_tokens_and_other_scopes_with_a_clear_error(server: ServerProc, admin: Api) -> None:
    revoked = admin.token_for("client")
    assert admin("DELETE", f"/v1/tokens/{revoked['id']}").status_code == 200
    join = admin.token_for("join", uses=1)
    worker = Api(server.url, join["token"])("POST", "/v1/workers/join", json={"capabilities": _caps()})
    assert worker.status_code == 201, worker.text
    join2 = admin.token_for("join", uses=1)
    cases = [
        ("", 400, "Enter an admin or a client token"),
        ("glt_not-a-real-token", 401, "invalid token: no such token; paste an admin or a client token"),
        (revoked["token"], 401, "was revoked"),
        (worker.json()["token"], 403, "has scope 'worker'; the dashboard takes an admin or a client token"),
        (join2["token"], 403, "has scope 'join'"),
        (admin.token_for("bootstrap")["token"], 403, "has scope 'bootstrap'"),
        ("gld_" + "x" * 43, 401, "works only there"),
    ]
    for token, status, words in cases:
        r = browser(server).post("/login", data={"token": token})
        assert r.status_code == status, (token, r.status_code)
        assert words in r.text.replace("&#39;", "'"), (token, r.text[:500])
        assert 'role="alert"' in r.text and "set-cookie" not in r.headers
        assert "GPULAYER_TOKEN" not in r.text  # (the CLI's settings: nothing a browser has)
    assert _token_uses(admin, join2["id"]) == 1  # looking at a join token does not spend it
    # (the worker leaves: the tests after this one on the module's server count its workers)
    assert admin("DELETE", f"/v1/workers/{worker.json()['worker_id']}").status_code == 204
    # not a form at all
    r = browser(server).post("/login", json={"token": server.admin_token})
    assert r.status_code == 400 and "application/x-www-form-urlencoded" in r.text
    r = browser(server).post("/login", data={"token": "x" * 20_000})
    assert r.status_code == 413


def _caps() -> dict[str, Any]:
    from tests.factories import make_capabilities

    return dict(json.loads(make_capabilities().model_dump_json()))


@pytest.mark.parametrize(("target", "where"), [
    ("/jobs?state=queued", "/jobs?state=queued"), ("//evil.example/x", "/"), ("https://evil.example/", "/"),
    ("/\\evil.example", "/"), ("jobs", "/"), ("", "/"),
])
def test_login_goes_on_to_a_local_path_only(server: ServerProc, target: str, where: str) -> None:
    r = browser(server).post("/login", data={"token": server.admin_token, "next": target})
    assert r.status_code == 303 and r.headers["location"] == where


def test_cancel_needs_the_sessions_csrf_token(server: ServerProc, admin: Api) -> None:
    job_id = submit(admin)
    c = login(server, server.admin_token)
    other = login(server, server.admin_token)
    token = csrf_of(c)
    refused: list[tuple[dict[str, str], dict[str, str]]] = [
        ({}, {}), ({"csrf": ""}, {}), ({"csrf": token[:-2] + "xx"}, {}), ({"csrf": csrf_of(other)}, {}),
        ({"csrf": token}, {"origin": "http://evil.example"}),
    ]
    for data, headers in refused:
        r = c.post(f"/jobs/{job_id}/cancel", data=data, headers=headers)
        assert r.status_code == 403, (data, headers, r.status_code)
        assert "CSRF token" in r.text
        assert admin("GET", f"/v1/jobs/{job_id}").json()["state"] == "queued"
    r = c.post(f"/jobs/{job_id}/cancel", data={"csrf": token}, headers={"origin": server.url})
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{job_id}"
    assert admin("GET", f"/v1/jobs/{job_id}").json()["state"] == "cancelled"
    page = c.get(f"/jobs/{job_id}").text
    assert f"Job {job_id} cancelled." in page and 'role="status"' in page
    assert f"Job {job_id} cancelled." not in c.get(f"/jobs/{job_id}").text  # shown once
    r = c.post(f"/jobs/{job_id}/cancel", data={"csrf": token})
    assert "had already ended (cancelled)" in c.get(r.headers["location"]).text
    assert c.post("/jobs/job-000000000000/cancel", data={"csrf": token}).status_code == 404


def test_logout_needs_the_csrf_token_and_ends_the_session(server: ServerProc) -> None:
    c = login(server, server.admin_token)
    assert c.post("/logout", data={}).status_code == 403
    assert c.get("/jobs").status_code == 200
    r = c.post("/logout", data={"csrf": csrf_of(c)})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert "gpulayer_session" not in c.cookies
    assert c.get("/jobs").status_code == 303


def test_a_client_session_sees_only_its_own_jobs(server: ServerProc, admin: Api) -> None:
    mine, theirs = Api(server.url, admin.token_for("client")["token"]), Api(server.url, admin.token_for("client")["token"])
    job_id = submit(mine, {**QUEUED, "name": "mine-only"})
    me, them, root = login(server, str(mine.token)), login(server, str(theirs.token)), login(server, server.admin_token)
    assert job_id in me.get("/jobs").text and job_id in me.get("/").text
    assert me.get(f"/jobs/{job_id}").status_code == 200
    assert job_id in root.get("/jobs").text and root.get(f"/jobs/{job_id}").status_code == 200
    assert job_id not in them.get("/jobs").text and job_id not in them.get("/").text
    for path in (f"/jobs/{job_id}", f"/live/jobs/{job_id}"):
        r = them.get(path)
        assert r.status_code == 404 and "no such job" in r.text, path
    assert them.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf_of(them)}).status_code == 404
    assert admin("GET", f"/v1/jobs/{job_id}").json()["state"] == "queued"
    assert them.get("/machines").status_code == 200 and "shown to admin tokens" in them.get("/machines").text
    assert "No providers configured" in root.get("/machines").text


def test_a_state_filter_that_is_not_a_state_is_a_clear_error(server: ServerProc, admin: Api) -> None:
    c = login(server, server.admin_token)
    r = c.get("/jobs?state=bogus")
    assert r.status_code == 422  # as the API answers the same query
    assert "query.state=&#39;bogus&#39;: not one of the choices; accepted: one of queued, assigned" in r.text
    assert 'role="alert"' in r.text and '<label for="state">' in r.text
    assert c.get("/jobs?limit=0").status_code == 422
    assert c.get("/jobs?colour=blue").status_code == 422
    live = c.get("/live/jobs?state=bogus")
    assert live.status_code == 422 and "query.state" in live.text
    assert c.get("/live/jobs/x?after=-1").status_code == 422
    queued_id, cancelled_id = submit(admin), submit(admin)
    admin("POST", f"/v1/jobs/{cancelled_id}/cancel")
    page = c.get("/jobs?state=queued").text
    assert queued_id in page and cancelled_id not in page
    assert '<option value="queued" selected>' in page
    assert cancelled_id in c.get("/jobs?state=").text  # the form's "any state"


def test_a_revoked_token_ends_its_session(server: ServerProc, admin: Api) -> None:
    client = admin.token_for("client")
    c = login(server, client["token"])
    assert c.get("/jobs").status_code == 200
    assert admin("DELETE", f"/v1/tokens/{client['id']}").status_code == 200
    until(lambda: c.get("/jobs").status_code == 303, 30, "the session of a revoked token to end")
    assert c.get("/live/jobs").status_code == 401


def test_markup_in_a_command_is_shown_as_text(server: ServerProc, admin: Api) -> None:
    job_id = submit(admin, {**QUEUED, "command": ["echo", "<script>alert(1)</script>"], "name": "<b>x</b>"})
    c = login(server, server.admin_token)
    for path in (f"/jobs/{job_id}", "/jobs", "/"):
        text = c.get(path).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, path
        assert "<script>alert" not in text and "<b>x</b>" not in text, path


def test_the_live_stream_of_an_ended_job_sends_its_state_and_ends(server: ServerProc, admin: Api) -> None:
    job_id = submit(admin)
    admin("POST", f"/v1/jobs/{job_id}/cancel")
    c = login(server, server.admin_token)
    events: list[tuple[str, Any]] = []
    with c.stream("GET", f"/live/jobs/{job_id}") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():  # the stream ends by itself: the job has ended
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((str(name), json.loads(line[6:])))
    assert [n for n, _ in events] == ["regions", "end"]
    assert 'data-state="cancelled"' in events[0][1]["live_job_state"]
    actions = events[0][1]["live_job_actions"]
    assert "/cancel" not in actions and f'action="/jobs/{job_id}/rerun"' in actions  # an ended job runs again


def test_a_waiting_job_shows_its_nearest_miss(server: ServerProc, admin: Api) -> None:
    """The job page ends its placement section with what `gpulayer jobs explain` ends with."""
    caps = json.loads(make_capabilities(cpu_count=2).model_dump_json())
    join = admin.token_for("join")["token"]
    r = Api(server.url, join)("POST", "/v1/workers/join", json={"capabilities": caps, "cpu_slots": 1})
    assert r.status_code == 201, r.text
    worker = r.json()["worker_id"]
    job_id = submit(admin, {"kind": "command", "command": ["true"], "requirements": {"cpus": 4},
                            "placement": {"target": "remote", "on_unschedulable": "wait"}})
    page = login(server, server.admin_token).get(f"/jobs/{job_id}").text
    section = page[page.index('id="placement-heading"'):page.index('id="tasks-heading"')]
    assert f"closest: {worker} has 2 of 4 CPUs" in section, section


class StrippingProxy(httpx.BaseTransport):
    """What a reverse proxy serving the server under ``prefix`` does to a request: it takes
    the prefix off the path (nginx's ``location /gl/ { proxy_pass http://server/; }``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.encode()
        self.inner = httpx.HTTPTransport(verify=False)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path
        if not path.startswith(self.prefix + b"/"):
            return httpx.Response(404, text=f"the proxy serves only {self.prefix.decode()}/")
        request.url = request.url.copy_with(raw_path=path[len(self.prefix):])
        return self.inner.handle_request(request)


def test_the_dashboard_behind_a_proxy_under_a_root_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Behind a proxy that serves it under /gl, every link, form, redirect, stream and cookie
    of the dashboard started with / and led out of the proxy's prefix (a 404 at the first
    click); with --root-path /gl they stay under it, and the API is served there too."""
    srv = ServerProc(tmp_path_factory.mktemp("root-path-home"), args=("--root-path", "/gl/")).start()
    try:
        admin = Api(srv.url, srv.admin_token)
        job_id = submit(admin)
        c = httpx.Client(base_url=srv.url, transport=StrippingProxy("/gl"), timeout=30, follow_redirects=False)
        r = c.get(f"/gl/jobs/{job_id}")
        assert r.status_code == 303 and r.headers["location"] == f"/gl/login?next=%2Fgl%2Fjobs%2F{job_id}"
        r = c.post("/gl/login", data={"token": srv.admin_token, "next": f"/gl/jobs/{job_id}"})
        assert r.status_code == 303 and r.headers["location"] == f"/gl/jobs/{job_id}"
        assert "Path=/gl/" in r.headers["set-cookie"]
        assert c.post("/gl/login", data={"token": srv.admin_token, "next": "/elsewhere"}).headers["location"] == "/gl/"
        for page in ("/gl/", "/gl/jobs", f"/gl/jobs/{job_id}", "/gl/workers"):
            text = c.get(page).text
            links = re.findall(r'(?:href|action|src|data-live)="([^"]*)"', text)
            assert links and 'data-root="/gl"' in text, page
            for link in links:
                if not link.startswith(("#", "data:")):
                    assert link.startswith("/gl/"), (page, link)
                    if not link.startswith("/gl/live/"):  # (a stream: it goes on)
                        assert c.get(html.unescape(link).split("#")[0]).status_code in (200, 405), (page, link)
        assert c.get("/gl/static/dashboard.js").status_code == 200
        live = html.unescape(re.findall(r'data-live="([^"]*)"', c.get("/gl/jobs").text)[0])
        with c.stream("GET", live) as stream:
            assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        r = c.post(f"/gl/jobs/{job_id}/cancel", data={"csrf": csrf_of(c, "/gl/jobs")}, headers={"origin": srv.url})
        assert r.status_code == 303 and r.headers["location"] == f"/gl/jobs/{job_id}"
        assert admin("GET", f"/v1/jobs/{job_id}").json()["state"] == "cancelled"
        api = c.get("/gl/v1/jobs", headers={"authorization": f"Bearer {srv.admin_token}"})
        assert api.status_code == 200 and [j["id"] for j in api.json()] == [job_id]
        r = c.post("/gl/logout", data={"csrf": csrf_of(c, "/gl/jobs")})
        assert r.status_code == 303 and r.headers["location"] == "/gl/login"
    finally:
        srv.stop()


# ("/gl;v=1": the cookie's "Path=/gl;v=1/" ended at the ';', and no page under the root
# path matched "/gl": every login led back to the login page)
@pytest.mark.parametrize("given", ["gl", "/a b", "/gl?x=1", "/gl/../x", "/gl#x", "/gl;v=1"])
def test_a_root_path_that_is_not_a_url_path_is_refused(given: str, tmp_path: Path) -> None:
    out = cli("server", "start", "--port", "0", "--root-path", given, env={"GPULAYER_HOME": str(tmp_path)})
    assert out.returncode == 2
    assert f"Invalid value for --root-path: {given!r}: accepted: a URL path such as /gpulayer" in out.stderr


def test_a_job_that_runs_after_others_links_them_and_says_it_waits(server: ServerProc, admin: Api) -> None:
    first = submit(admin)
    second = submit(admin)
    later = submit(admin, {**QUEUED, "after": [first], "after_ended": [second]})
    page = login(server, server.admin_token).get(f"/jobs/{later}").text
    assert f'<dt>Runs after</dt><dd><a href="/jobs/{first}">{first}</a> (once each has succeeded)</dd>' in page
    assert (f'<dt>Runs after the end of</dt><dd><a href="/jobs/{second}">{second}</a> (whatever their outcome)</dd>'
            in page)
    assert f"waiting for {first} to succeed and {second} to end first (it runs after them)" in page


def test_an_ended_job_runs_again_from_its_page(server: ServerProc, admin: Api) -> None:
    ended = submit(admin)
    admin("POST", f"/v1/jobs/{ended}/cancel")
    c = login(server, server.admin_token)
    page = c.get(f"/jobs/{ended}").text
    assert f'action="/jobs/{ended}/rerun"' in page and "Run again" in page
    csrf = page.split('name="csrf" value="')[1].split('"')[0]
    r = c.post(f"/jobs/{ended}/rerun", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303
    new = r.headers["location"].rsplit("/", 1)[1]
    assert new != ended and new.startswith("job-")
    shown = c.get(f"/jobs/{new}").text
    assert f"Job {ended} run again as {new}." in shown
    assert f'action="/jobs/{new}/cancel"' in shown  # (queued: it can be cancelled, not run again)
    waiting = c.post(f"/jobs/{new}/rerun", data={"csrf": csrf}, follow_redirects=False)
    assert waiting.headers["location"].endswith(f"/jobs/{new}")
    assert f"Job {new} is queued: a job is run again once it has ended." in c.get(f"/jobs/{new}").text
