"""The auth sweep (issue 13 §7), from the outside: every route and method of the route
tables (:data:`gpulayer.api.ROUTES` and the server's own :data:`SERVER_ROUTES`), called on a
real ``gpulayer server start`` process with no token, malformed tokens, revoked tokens of
each scope it accepts, and every scope it does not accept; a worker credential on another
worker's routes and tasks. Each must be refused with 401 or 403, never answered. The list
is derived from the tables, so a new route is swept without touching this file."""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from gpulayer import api, bundles
from gpulayer.server.app import SERVER_ROUTES
from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc

pytestmark = pytest.mark.timeout(300)

MALFORMED = ["Bearer", "Bearer glt_not-a-real-token", "Basic dXNlcjpwYXNz", "Bearer " + "x" * 5000, "glt_"]


def _caps() -> dict[str, Any]:
    return dict(json.loads(make_capabilities().model_dump_json()))


#: a valid body per request record, so a refusal that comes after the body is read (a
#: worker reporting on another worker's task) is reached
BODIES: dict[str, Any] = {
    "SubmitBody": {"spec": {"kind": "command", "command": ["true"]}},
    "SubmitManyBody": {"specs": [{"kind": "command", "command": ["true"]}]},
    "WaitJobsBody": {"job_ids": ["job-x"]},
    "CancelManyBody": {"job_ids": ["job-x"]},
    "ExplainBody": {"spec": {"kind": "command", "command": ["true"]}},
    "JoinBody": {"capabilities": None},
    "HeartbeatBody": {"running": []},
    "LogsBody": {"chunks": [["stdout", "x"]]},
    "FinishBody": {"state": "succeeded", "exit_code": 0},
    "TokenBody": {"scope": "client"},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    srv = ServerProc(tmp_path_factory.mktemp("sweep"), env={"GPULAYER_HEARTBEAT_TIMEOUT": "600"}).start()
    admin = Api(srv.url, srv.admin_token)
    t: dict[str, Any] = {"admin": srv.admin_token}
    for scope in ("client", "join", "bootstrap"):
        t[scope] = admin.token_for(scope)["token"]
    join = Api(srv.url, t["join"])
    workers = []
    for _ in range(3):
        r = join("POST", "/v1/workers/join", json={"capabilities": _caps(), "cpu_slots": 1})
        assert r.status_code == 201, r.text
        workers.append(r.json())
    mine, theirs, gone = workers
    t["worker"], t["worker_id"], t["other_worker_id"] = mine["token"], mine["worker_id"], theirs["worker_id"]
    # revoked tokens, one of each scope
    revoked = {"worker": gone["token"]}
    assert admin("DELETE", f"/v1/tokens/{gone['token_id']}").status_code == 200
    for scope in ("admin", "client", "join", "bootstrap"):
        made = admin.token_for(scope)
        assert admin("DELETE", f"/v1/tokens/{made['id']}").status_code == 200
        revoked[scope] = made["token"]
    # a job of the client, with a task on the *other* worker, and the client's bundle
    client = Api(srv.url, t["client"])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ok.py", "print('ok')\n")
    data = buf.getvalue()
    digest = bundles.compute_digest(data)
    assert client("PUT", f"/v1/bundles/{digest}", content=data).status_code == 201
    # drain this worker (the "gone" one left), so the task lands on the other one
    assert Api(srv.url, mine["token"])("POST", f"/v1/workers/{mine['worker_id']}/drain").status_code == 204
    r = client("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"], "bundle_digest": digest,
                                                  "placement": {"target": "remote", "on_unschedulable": "wait"}}})
    assert r.status_code == 201, r.text
    job = r.json()
    other = Api(srv.url, theirs["token"])
    tasks = other("GET", f"/v1/workers/{theirs['worker_id']}/tasks").json()
    assert [x["job_id"] for x in tasks] == [job["id"]], tasks
    t.update(job_id=job["id"], task_id=tasks[0]["task_id"], digest=digest, token_id=gone["token_id"])
    yield {"server": srv, "tokens": t, "revoked": revoked}
    srv.stop()


def _sweep_table() -> list[tuple[str, str, tuple[str, ...], Any]]:
    rows: list[tuple[str, str, tuple[str, ...], Any]] = [(r.method, r.path, r.scopes, r) for r in api.ROUTES]
    rows += [(r.method, r.path, r.scopes, None) for r in SERVER_ROUTES if r.auth]
    return rows


def _url(path: str, t: dict[str, Any], *, worker_id: str) -> str:
    url = (path.replace("{job_id}", t["job_id"]).replace("{worker_id}", worker_id)
           .replace("{task_id}", t["task_id"]).replace("{token_id}", t["token_id"])
           .replace("{digest}", t["digest"]))
    return re.sub(r"\{\w+\}", "x", url)  # a path argument this sweep has no value for


def _body(route: api.Route | None) -> dict[str, Any]:
    if route is None or route.body is None:
        return {}
    name = route.body.__name__
    if name not in BODIES:
        # the credential is refused before the body is read, except on a task's routes
        assert "task_id" not in route.path_params, f"add a minimal valid {name} to BODIES"
        return {"json": {}}
    body = dict(BODIES[name])
    if "capabilities" in body:
        body["capabilities"] = _caps()
    return {"json": body}


def test_every_route_refuses_every_wrong_credential(world: dict[str, Any]) -> None:
    srv: ServerProc = world["server"]
    t, revoked = world["tokens"], world["revoked"]
    refused: list[tuple[str, str, str, int]] = []
    answered: list[tuple[str, str, str, int, str]] = []

    def call(method: str, url: str, who: str, headers: dict[str, str], want: int, **kw: Any) -> None:
        r = Api(srv.url, None)(method, url, headers=headers, **kw)
        (refused if r.status_code == want else answered).append(
            (method, url, who, r.status_code) if r.status_code == want else (method, url, who, r.status_code, r.text[:200]))

    for method, path, scopes, route in _sweep_table():
        url = _url(path, t, worker_id=t["worker_id"])
        kw = _body(route) if method not in ("GET", "HEAD", "DELETE") else {}
        call(method, url, "no token", {}, 401, **kw)
        for bad in MALFORMED:
            call(method, url, f"malformed {bad[:12]!r}", {"authorization": bad}, 401, **kw)
        call(method, url, "token without a scheme", {"authorization": t["admin"]}, 401, **kw)
        for scope in scopes:
            if scope in revoked:
                call(method, url, f"revoked {scope}", {"authorization": f"Bearer {revoked[scope]}"}, 401, **kw)
        for scope in api.SCOPES:
            if scope not in scopes and scope in t:
                call(method, url, f"{scope} token", {"authorization": f"Bearer {t[scope]}"}, 403, **kw)
        # a worker credential on another worker's routes and on another worker's task
        if route is not None and "worker" in scopes and (route.own_worker or "task_id" in route.path_params):
            other_url = _url(path, t, worker_id=t["other_worker_id"])
            call(method, other_url, "another worker's credential", {"authorization": f"Bearer {t['worker']}"},
                 403, **kw)
    m = len(refused) + len(answered)
    print(f"\nauth sweep: {len(refused)} of {m} refused as due; "
          f"{sum(1 for a in answered if 200 <= a[3] < 300)} answered 2xx")
    assert answered == [], "\n".join(map(str, answered))
    assert m > 300


def test_another_clients_job_and_bundle_do_not_exist_for_it(world: dict[str, Any]) -> None:
    """Ownership of jobs and bundles is refused as 404 (as if absent), on every own-job route."""
    srv: ServerProc = world["server"]
    t = world["tokens"]
    stranger = Api(srv.url, Api(srv.url, t["admin"]).token_for("client")["token"])
    for r in api.ROUTES:
        if r.own_job or ("digest" in r.path_params and r.method != "PUT"):
            resp = stranger(r.method, _url(r.path, t, worker_id=t["worker_id"]))
            assert resp.status_code == 404, (r.op, resp.status_code, resp.text)
