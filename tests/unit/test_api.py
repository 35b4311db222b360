"""The operation surface: the route table, the Protocols, the control plane and the HTTP
client agree, and errors cross HTTP as the same classes.

The HTTP client runs here in-process against the Starlette app (through Starlette's test
transport), over a real SQLite database; tests/integration/ runs the same against a real
server process.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from gpulayer import api, errors
from gpulayer.control import ControlPlane
from gpulayer.http_client import HttpAPI, RemoteAPI, connect_http
from gpulayer.records import JobError, JobState, TaskState
from gpulayer.server.app import SERVER_ROUTES, SPECIAL, create_app
from gpulayer.server.openapi import openapi_document
from gpulayer.specs import CommandJob, FunctionJob, Placement
from gpulayer.store import Store
from gpulayer.wire import ResultJSON
from tests.factories import make_capabilities, make_device

PROTOCOL_METHODS = {name for name, _ in inspect.getmembers(api.ControlAPI, inspect.isfunction)
                    if not name.startswith("_")}


# ---------------------------------------------------------------------------------- the table


def test_every_operation_has_exactly_one_route_and_every_route_an_operation() -> None:
    ops = [r.op for r in api.ROUTES]
    assert len(ops) == len(set(ops))
    assert set(ops) == PROTOCOL_METHODS


@pytest.mark.parametrize("route", api.ROUTES, ids=lambda r: r.op)
def test_each_route_places_every_argument_of_its_operation(route: api.Route) -> None:
    """Path, query, body, raw body and server-derived arguments together are exactly the
    Protocol method's parameters, so the generic client and server lose nothing."""
    params = set(inspect.signature(getattr(api.ControlAPI, route.op)).parameters) - {"self"}
    placed = set(route.path_params)
    placed |= set(route.query.model_fields) if route.query else set()
    placed |= set(route.body.model_fields) if route.body else set()
    placed |= {"data"} if route.raw_body else set()
    assert placed == params - set(route.context)
    assert not placed & set(route.context), "an argument is both sent and derived by the server"


@pytest.mark.parametrize("route", api.ROUTES, ids=lambda r: r.op)
def test_the_control_plane_takes_what_the_server_passes(route: api.Route) -> None:
    sig = inspect.signature(getattr(ControlPlane, route.op))
    passed = set(inspect.signature(getattr(api.ControlAPI, route.op)).parameters) - {"self"}
    passed |= set(route.context)
    assert passed <= set(sig.parameters), sorted(passed - set(sig.parameters))


def test_the_http_client_has_every_operation_with_its_protocol_signature() -> None:
    for name in PROTOCOL_METHODS:
        method = getattr(HttpAPI, name)
        assert inspect.signature(method) == inspect.signature(getattr(api.ControlAPI, name)), name


def test_raw_bodies_and_long_polls_have_their_own_server_handlers() -> None:
    for r in api.ROUTES:
        if r.raw_body or r.long_poll:
            assert r.op in SPECIAL, r.op


def test_importing_the_http_client_loads_no_database() -> None:
    code = ("import sys, gpulayer.http_client, gpulayer.api, gpulayer.client; "
            "print(sorted(m for m in ('sqlalchemy', 'sqlmodel', 'starlette', 'uvicorn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("exc", [
    errors.InvalidInput("--gpus: expected 0 or more"),
    errors.BundleError("bad bundle"),
    errors.TooLarge("too big"),
    errors.NotFound("job 'x': no such job"),
    errors.Conflict("task t is already lost"),
    errors.Unschedulable("scheduling: no eligible worker", job_id="job-1"),
    errors.JobFailed("job job-1 failed: exit code 3", job_id="job-1", state="failed", exit_code=3),
    errors.RemoteError("ValueError", "bad", "Traceback ...", job_id="job-1"),
    errors.AuthError("invalid token"),
    errors.Forbidden("wrong scope"),
], ids=lambda e: type(e).__name__)
def test_an_error_comes_back_over_the_wire_as_the_same_class(exc: errors.GpulayerError) -> None:
    wire = json.loads(json.dumps(exc.to_dict()))
    back = errors.error_from_wire(wire, status=exc.status_code)
    assert type(back) is type(exc)
    assert str(back) == str(exc) and back.details() == exc.details()
    if isinstance(exc, errors.JobFailed):  # (an Unschedulable too: a job that ended without success)
        assert isinstance(back, errors.JobFailed) and back.state == exc.state and back.job_id == exc.job_id


def test_a_remote_error_shows_the_remote_traceback_only_where_there_is_one() -> None:
    raised = errors.RemoteError("KeyError", "'k'", "Traceback (most recent call last):\n  ...\nKeyError: 'k'\n",
                                job_id="job-1")
    assert str(raised) == ("KeyError: 'k'\n\nRemote traceback (job job-1):\n"
                           "Traceback (most recent call last):\n  ...\nKeyError: 'k'\n")
    # the runner's own error (a result that is not JSON) has none: no empty section
    runner = errors.RemoteError("TypeError", "result of m:f is not JSON: a set at result", "", job_id="job-2")
    assert str(runner) == "TypeError: result of m:f is not JSON: a set at result (job job-2)"


def test_an_unknown_code_keeps_the_message() -> None:
    back = errors.error_from_wire({"code": "from_the_future", "message": "something new"}, status=418)
    assert type(back) is errors.GpulayerError and "something new" in str(back)
    assert type(errors.error_from_wire(None, status=401)) is errors.AuthError
    assert type(errors.error_from_wire("garbage", status=403)) is errors.Forbidden


def test_two_classes_cannot_share_a_code() -> None:
    with pytest.raises(TypeError, match="not_found"):
        type("Again", (errors.GpulayerError,), {"code": "not_found"})


# ---------------------------------------------------------------------------------- in-process HTTP


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient]]:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    app = create_app(control, background=False)
    with TestClient(app) as tc:
        yield control, tc


def remote(tc: TestClient, token: str | None) -> RemoteAPI:
    return connect_http("http://testserver", token=token, retry_for=0.5, transport=tc._transport)


def test_one_job_through_every_layer_in_process(served: tuple[ControlPlane, TestClient]) -> None:
    """A client submits, a worker joins, runs and reports, all through the generic HTTP
    client; every answer is the Protocol's record type."""
    control, tc = served
    admin = remote(tc, control.create_token(scope="admin").token)
    client = remote(tc, admin.create_token(scope="client").token)
    join = admin.create_token(scope="join", uses=1)
    worker = remote(tc, None)
    reply = worker.join_worker(make_capabilities(), join_token=join.token, name="w", cpu_slots=1, pid=1)
    assert isinstance(reply, api.JoinReply) and reply.worker.origin == "existing"
    worker.token = reply.token
    job = client.submit(CommandJob(command=["true"], placement=Placement(target="remote")), idempotency_key="k")
    assert client.submit(CommandJob(command=["true"], placement=Placement(target="remote")),
                         idempotency_key="k").id == job.id
    [task] = worker.poll_tasks(reply.worker_id, wait=0)
    assert isinstance(task, api.TaskAssignment) and task.job_id == job.id
    worker.start_task(task.task_id, worker_id=reply.worker_id)
    worker.start_task(task.task_id, worker_id=reply.worker_id)  # a retried start is success
    worker.append_logs(task.task_id, worker_id=reply.worker_id, chunks=[("stdout", "hi\n")])
    assert worker.heartbeat(reply.worker_id, running=[task.task_id]).cancel == []
    worker.finish_task(task.task_id, worker_id=reply.worker_id, state=TaskState.SUCCEEDED, exit_code=0)
    done = client.wait_job(job.id, timeout=5)
    assert done.state is JobState.SUCCEEDED
    assert [c.data for c in client.logs(job.id)] == ["hi\n"]
    assert [e.kind for e in client.events(job.id)][:2] == ["submitted", "assigned"]
    assert [j.id for j in client.list_jobs(state=JobState.SUCCEEDED)] == [job.id]
    assert client.worker_usage()[reply.worker_id].busy_cpu_slots == 0
    with pytest.raises(errors.Conflict, match="already succeeded"):
        worker.finish_task(task.task_id, worker_id=reply.worker_id, state=TaskState.FAILED,
                           error=JobError(type="failed", message="late"))
    assert {t.scope for t in admin.list_tokens()} >= {"admin", "client", "join", "worker"}
    worker.deregister_worker(reply.worker_id)
    with pytest.raises(errors.AuthError):  # leaving revokes the credential
        worker.heartbeat(reply.worker_id, running=[])


#: a field no record of this version has
NEWER_FIELD = "added_by_a_newer_server"


class NewerServer(httpx.BaseTransport):
    """The server's answers with a field its records do not have yet, in every record an
    answer holds (a job, its spec, requirements, placement and tasks; a worker, its
    capabilities and their devices; the records of a list): what a newer server sends."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.grown = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if response.status_code >= 300 or "json" not in response.headers.get("content-type", ""):
            return response
        body = json.loads(response.read())
        if isinstance(body, dict) and request.url.path.endswith("/usage"):
            body = {worker: self.grow(usage) for worker, usage in body.items()}
        elif isinstance(body, list):
            body = [self.grow(record) for record in body]
        else:
            body = self.grow(body)
        return httpx.Response(response.status_code, json=body)

    def grow(self, record: Any) -> Any:
        if not isinstance(record, dict):
            return record
        self.grown += 1
        record = {**record, NEWER_FIELD: {"any": ["value"]}}
        for key in ("spec", "requirements", "placement", "capabilities", "worker"):
            if isinstance(record.get(key), dict):
                record[key] = self.grow(record[key])
        for key in ("tasks", "devices"):
            if isinstance(record.get(key), list):
                record[key] = [self.grow(item) for item in record[key]]
        return record


def test_a_client_reads_a_newer_servers_records_leaving_out_what_it_does_not_know(
        served: tuple[ControlPlane, TestClient]) -> None:
    """A server that is newer than its client sends fields the client's records lack: the
    client reads what it knows, where it refused the whole answer; a request or a spec with
    a field this version does not know is still refused (it is most often misspelt)."""
    control, tc = served
    newer = NewerServer(tc._transport)
    admin = connect_http("http://testserver", token=control.create_token(scope="admin").token,
                         retry_for=0.5, transport=newer)
    client = connect_http("http://testserver", token=admin.create_token(scope="client").token,
                          retry_for=0.5, transport=newer)
    worker = connect_http("http://testserver", retry_for=0.5, transport=newer)
    join = admin.create_token(scope="join", uses=1)
    reply = worker.join_worker(make_capabilities(devices=[make_device()]), join_token=join.token, name="w", cpu_slots=1, pid=1)
    assert reply.worker.capabilities.devices and NEWER_FIELD not in reply.worker.model_dump()
    worker.token = reply.token
    job = client.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [task] = worker.poll_tasks(reply.worker_id, wait=0)
    worker.start_task(task.task_id, worker_id=reply.worker_id)
    worker.finish_task(task.task_id, worker_id=reply.worker_id, state=TaskState.SUCCEEDED, exit_code=0)
    done = client.wait_job(job.id, timeout=5)
    assert done.state is JobState.SUCCEEDED and done.spec.command == ["true"] and done.tasks
    assert [j.id for j in client.list_jobs()] == [job.id]
    assert client.events(job.id) and admin.list_workers()[0].id == reply.worker_id
    assert client.worker_usage()[reply.worker_id].busy_cpu_slots == 0
    assert client.explain(CommandJob(command=["true"])).spec.command == ["true"]
    assert newer.grown > 20
    refused = tc.post("/v1/jobs", json={"spec": {"kind": "command", "command": ["true"], NEWER_FIELD: 1}},
                      headers={"Authorization": f"Bearer {client.token}"})  # a request: still refused
    assert refused.status_code == 422 and NEWER_FIELD in refused.text
    with pytest.raises(errors.InvalidInput, match=NEWER_FIELD):  # what a user writes: still refused
        CommandJob(command=["true"], **{NEWER_FIELD: 1})


def test_a_join_that_fails_after_the_token_check_burns_no_use(served: tuple[ControlPlane, TestClient],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    control, tc = served
    once = control.create_token(scope="join", uses=1)

    def broken(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("disk full")

    monkeypatch.setattr(control, "_register", broken)
    with pytest.raises(errors.GpulayerError, match="internal"):
        remote(tc, None).join_worker(make_capabilities(), join_token=once.token)
    assert next(t for t in control.list_tokens() if t.id == once.id).uses_left == 1
    monkeypatch.undo()
    assert remote(tc, None).join_worker(make_capabilities(), join_token=once.token).worker.origin == "existing"
    assert next(t for t in control.list_tokens() if t.id == once.id).uses_left == 0


def test_scopes_and_ownership_in_process(served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    admin = remote(tc, control.create_token(scope="admin").token)
    mine = remote(tc, admin.create_token(scope="client").token)
    theirs = remote(tc, admin.create_token(scope="client").token)
    job = theirs.submit(CommandJob(command=["true"], placement=Placement(target="remote", on_unschedulable="wait")))
    with pytest.raises(errors.NotFound):
        mine.get_job(job.id)
    with pytest.raises(errors.NotFound):
        mine.cancel(job.id)
    assert mine.list_jobs() == []
    with pytest.raises(errors.Forbidden):
        mine.list_tokens()
    with pytest.raises(errors.AuthError):
        remote(tc, "glt_nope").list_jobs()
    assert admin.get_job(job.id).id == job.id


def test_a_refused_head_says_why_as_the_other_requests_do(served: tuple[ControlPlane, TestClient]) -> None:
    """A HEAD's answer has no body: a submit with a bad token, whose first request asks
    whether the server has its bundle, said only "HTTP 401"."""
    control, tc = served
    with pytest.raises(errors.AuthError) as info:
        remote(tc, "glt_nope").has_bundle("0" * 64)
    assert str(info.value) == "invalid token: no such token (check GPULAYER_TOKEN / --token)"
    client = remote(tc, control.create_token(scope="client").token)
    with pytest.raises(errors.InvalidInput, match=r"digest: 'abc' does not match"):
        client.has_bundle("abc")
    assert client.has_bundle("0" * 64) is False


def test_bad_query_and_path_values_name_the_parameter(served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    headers = {"authorization": f"Bearer {control.create_token(scope='admin').token}"}
    r = tc.get("/v1/jobs?limit=5000", headers=headers)
    assert r.status_code == 422
    assert r.json()["error"]["message"] == ("query.limit='5000': must be at most 1000; "
                                            "accepted: a whole number from 1 to 1000")
    r = tc.get("/v1/jobs?state=nope", headers=headers)
    assert r.json()["error"]["message"] == ("query.state='nope': not one of the choices; accepted: one of "
                                            "queued, assigned, running, succeeded, failed, cancelled, timed_out, "
                                            "unschedulable")
    r = tc.post("/v1/tokens", headers=headers, json={"scope": "client", "ttl": -1, "bogus": 1})
    message = r.json()["error"]["message"]
    assert r.status_code == 422 and "body.ttl=-1: must be more than 0" in message
    assert "body.bogus=1: no such field" in message or "body.bogus" in message
    assert "Input should" not in message and "pydantic" not in message
    # what a list or a choice accepts is said as such (a list of text was "accepted: text")
    for path, body, said in (
            ("/v1/jobs/cancel", {"job_ids": []}, "body.job_ids: must not be empty; accepted: a list of 1 to 1000 "
                                                 "text values"),
            ("/v1/jobs/wait", {"job_ids": "job-x"}, "body.job_ids='job-x': not a list; accepted: a list of 1 to 1000 "
                                                    "text values"),
            ("/v1/tokens", {"scope": "root"}, "body.scope='root': not one of the choices; accepted: one of admin, "
                                              "client, join, bootstrap"),
            # a field of a spec, in a batch too: its own bounds (it said "accepted: a list of 1 to
            # 1000 records" or "a value of the documented type"), its path without the union's tag
            ("/v1/jobs/batch", {"specs": [{"kind": "command", "command": ["true"], "retries": 500}]},
             "body.specs.0.retries=500: must be at most 100; accepted: a whole number from 0 to 100"),
            ("/v1/jobs/batch", {"specs": [{"kind": "nope"}]},
             "body.specs.0: kind 'nope' is not one of the choices; accepted: a record whose kind is one of "
             "'command', 'function', 'distributed'"),
            ("/v1/jobs", {"spec": {"kind": "command", "command": []}},
             "body.spec.command: must not be empty; accepted: a list of arguments such as ['python', 'train.py']"),
            ("/v1/jobs", {"spec": {"kind": "distributed", "entry": "x.py", "nodes": 0}},
             "body.spec.nodes=0: must be at least 1; accepted: a whole number from 1 to 1024")):
        r = tc.post(path, headers=headers, json=body)
        assert r.status_code == 422 and r.json()["error"]["message"] == said, r.text
    r = tc.head("/v1/bundles/not-hex", headers=headers)
    assert r.status_code == 422
    r = tc.get("/v1/bundles/" + "0" * 64, headers=headers)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_a_method_a_path_does_not_serve_is_405_with_that_paths_allow(
        served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    headers = {"authorization": f"Bearer {control.create_token(scope='admin').token}"}
    served_methods: dict[str, set[str]] = {}
    for r in (*api.ROUTES, *SERVER_ROUTES):
        served_methods.setdefault(r.path, set()).add(r.method)
    for path, methods in served_methods.items():
        allowed = methods | ({"HEAD"} if "GET" in methods else set())
        url = path.replace("{digest}", "0" * 64).replace("{", "").replace("}", "")
        for method in ("TRACE", "PATCH", "OPTIONS", "BREW"):
            r = tc.request(method, url, headers=headers)
            assert r.status_code == 405, (method, path, r.status_code)
            assert set(r.headers["allow"].split(", ")) == allowed, (method, path, r.headers.get("allow"))
            assert r.json()["error"]["code"] == "method_not_allowed"



def test_a_method_a_dashboard_path_does_not_serve_is_405_like_the_apis(
        served: tuple[ControlPlane, TestClient]) -> None:
    """``GET /logout`` (a link typed or bookmarked) or ``PUT /jobs/x``: the API's 405, its code
    and its Allow header, not a bare ``HTTP 405`` with the code ``error``."""
    from gpulayer.server.dashboard import ROUTES as DASHBOARD

    _, tc = served
    served_methods: dict[str, set[str]] = {}
    for d in DASHBOARD:
        served_methods.setdefault(d.path, set()).add(d.method)
    for path, methods in served_methods.items():
        allowed = methods | ({"HEAD"} if "GET" in methods else set())
        url = path.replace("{job_id}", "job-000000000001")
        for method in sorted({"GET", "POST", "PUT", "DELETE"} - methods):
            r = tc.request(method, url)
            assert r.status_code == 405, (method, path, r.status_code)
            assert set(r.headers["allow"].split(", ")) == allowed, (method, path, r.headers.get("allow"))
            error = r.json()["error"]
            assert error["code"] == "method_not_allowed", (method, path, error)
            assert error["message"] == f"{method} {url}: not allowed here; allowed: {r.headers['allow']}"


# ---------------------------------------------------------------------------------- OpenAPI


def test_the_openapi_document_is_valid_openapi_3_1() -> None:
    from openapi_spec_validator import validate

    doc = openapi_document()
    validate(doc)
    assert doc["openapi"].startswith("3.1")


def test_the_openapi_document_lists_every_route_with_its_constraints() -> None:
    doc = openapi_document()
    listed = {(m.upper(), p) for p, methods in doc["paths"].items() for m in methods}
    assert listed == {(r.method, r.path) for r in api.ROUTES} | {(r.method, r.path) for r in SERVER_ROUTES}
    limit = next(p for p in doc["paths"]["/v1/jobs"]["get"]["parameters"] if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 1000)
    digest = doc["paths"]["/v1/bundles/{digest}"]["get"]["parameters"][0]
    assert digest["schema"]["pattern"] == api.DIGEST_PATTERN
    assert "404" in doc["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]
    assert "413" in doc["paths"]["/v1/bundles/{digest}"]["put"]["responses"]
    refs = json.dumps(doc)
    assert "#/x-" not in refs and "#/$defs" not in refs


def test_reports_are_validated_before_anything_is_stored(served: tuple[ControlPlane, TestClient]) -> None:
    """A report whose error fields are not text, or that holds NaN, is refused; the job
    stays readable through every read."""
    control, tc = served
    admin = {"authorization": f"Bearer {control.create_token(scope='admin').token}"}
    reply = remote(tc, None).join_worker(make_capabilities(), join_token=control.create_token(scope="join").token)
    worker = {"authorization": f"Bearer {reply.token}"}
    job = control.submit(CommandJob(command=["true"], placement=Placement(target="remote")))
    [task] = control.poll_tasks(reply.worker_id)
    assert tc.post(f"/v1/tasks/{task.task_id}/start", headers=worker).status_code == 204
    bad = tc.post(f"/v1/tasks/{task.task_id}/finish", headers=worker,
                  content=b'{"state": "failed", "error": {"message": NaN, "type": 5}}')
    assert bad.status_code == 400 and "NaN" in bad.json()["error"]["message"]
    bad = tc.post(f"/v1/tasks/{task.task_id}/finish", headers=worker,
                  json={"state": "failed", "error": {"message": "x", "type": 5}})
    assert bad.status_code == 422 and "body.error.type" in bad.json()["error"]["message"]
    for path in (f"/v1/jobs/{job.id}", f"/v1/jobs/{job.id}/events", f"/v1/jobs/{job.id}/logs",
                 f"/v1/jobs/{job.id}/wait?timeout=0"):
        assert tc.get(path, headers=admin).status_code == 200, path
    ok = tc.post(f"/v1/tasks/{task.task_id}/finish", headers=worker, json={"state": "succeeded", "exit_code": 0})
    assert ok.status_code == 200 and ok.json() == []  # (nothing else was assigned to the worker)
    assert control.get_job(job.id).state is JobState.SUCCEEDED


def test_a_result_is_stored_and_answered_as_the_json_text_it_was_reported_as(tmp_path: Path) -> None:
    """A server keeps a reported result's text (not parsed and written again) and writes it
    into its answers as it is; in-process callers of the same database get the value."""
    store = Store(f"sqlite:///{tmp_path / 'server.db'}")
    control = ControlPlane(store, heartbeat_timeout=30, results_as_text=True)
    with TestClient(create_app(control, background=False)) as tc:
        admin = {"authorization": f"Bearer {control.create_token(scope='admin').token}"}
        reply = remote(tc, None).join_worker(make_capabilities(), join_token=control.create_token(scope="join").token)
        job = control.submit(FunctionJob(function="m:f", placement=Placement(target="remote")))
        [task] = control.poll_tasks(reply.worker_id)
        worker = {"authorization": f"Bearer {reply.token}"}
        assert tc.post(f"/v1/tasks/{task.task_id}/start", headers=worker).status_code == 204
        text = '{"rows" : [1,  2.50, "caf\\u00e9"], "n": null}'
        body = f'{{"state": "succeeded", "exit_code": 0, "result":  {text} }}'.encode()
        assert tc.post(f"/v1/tasks/{task.task_id}/finish", headers=worker, content=body).status_code == 200
        for method, path, kw in (("GET", f"/v1/jobs/{job.id}", {}), ("GET", f"/v1/jobs/{job.id}/wait?timeout=0", {}),
                                 ("POST", "/v1/jobs/wait", {"json": {"job_ids": [job.id]}})):
            got = tc.request(method, path, headers=admin, **kw)
            assert got.status_code == 200 and f'"result":{text}'.encode() in got.content, (path, got.content)
        assert remote(tc, admin["authorization"][7:]).get_job(job.id).result == json.loads(text)
        brief = tc.post("/v1/jobs/wait?brief=true", headers=admin, json={"job_ids": [job.id]})
        assert brief.status_code == 200 and brief.json()[0]["result"] is None, brief.text
    # the stored text; and the same database read in process gives the value
    assert ControlPlane(store).get_job(job.id).result == {"rows": [1, 2.5, "caf\u00e9"], "n": None}
    assert control.get_job(job.id).result == ResultJSON(text)


@pytest.mark.parametrize("result, stored", [
    # a lone surrogate (json.loads lets it through from bytes): written again, escaped, and stored
    (b'"\xed\xa0\x80"', '"\\ud800"'),
    # a number out of a float's range: refused, as any result that is not JSON (the task fails)
    (b"[1, 2e400]", None),
])
def test_a_result_text_that_cannot_be_stored_as_it_is_is_checked_as_a_value(
        tmp_path: Path, result: bytes, stored: str | None) -> None:
    store = Store(f"sqlite:///{tmp_path / 'server.db'}")
    control = ControlPlane(store, heartbeat_timeout=30, results_as_text=True)
    with TestClient(create_app(control, background=False)) as tc:
        reply = remote(tc, None).join_worker(make_capabilities(), join_token=control.create_token(scope="join").token)
        job = control.submit(FunctionJob(function="m:f", placement=Placement(target="remote")))
        [task] = control.poll_tasks(reply.worker_id)
        worker = {"authorization": f"Bearer {reply.token}"}
        assert tc.post(f"/v1/tasks/{task.task_id}/start", headers=worker).status_code == 204
        answer = tc.post(f"/v1/tasks/{task.task_id}/finish", headers=worker,
                         content=b'{"state": "succeeded", "exit_code": 0, "result": ' + result + b"}")
    if stored is None:
        assert answer.status_code == 422 and "is not JSON" in answer.json()["error"]["message"], answer.text
        assert control.get_job(job.id).state is JobState.RUNNING  # (nothing stored; the worker fails it)
    else:
        assert answer.status_code == 200, answer.text
        assert control.get_job(job.id).result == ResultJSON(stored)


def test_a_submit_too_large_for_the_argument_limit_is_refused_while_streaming(
        served: tuple[ControlPlane, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    control, tc = served
    headers = {"authorization": f"Bearer {control.create_token(scope='admin').token}"}
    monkeypatch.setenv("GPULAYER_MAX_ARGS_MB", "0.5")  # the body may be 1.5 MB
    body = json.dumps({"spec": {"kind": "function", "function": "m:f", "args": [0] * 1_000_000}})
    r = tc.post("/v1/jobs", headers=headers, content=body.encode())
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    r = tc.post("/v1/jobs", headers=headers, json={"spec": {
        "kind": "function", "function": "m:f", "args": [0] * 200_000, "placement": {"on_unschedulable": "wait"}}})
    assert r.status_code == 422 and "GPULAYER_MAX_ARGS_VALUES" in r.json()["error"]["message"]
    assert control.list_jobs() == []


def test_a_serving_app_runs_the_full_collections_itself(tmp_path: Path) -> None:
    """While an app serves, Python runs no full garbage collection on its own (at 10,000
    workers each one held every answer for 0.5-0.9 s): the app runs them on a schedule; two
    apps in one process give the collector its settings back when the last one stops."""
    import gc

    before = gc.get_threshold()
    apps = [create_app(ControlPlane(Store(f"sqlite:///{tmp_path}/{n}.db")), background=False) for n in ("a", "b")]
    with TestClient(apps[0]):
        assert gc.get_threshold()[2] >= 1_000_000
        assert gc.get_freeze_count() > 0  # what start-up built is not walked again
        with TestClient(apps[1]):
            assert gc.get_threshold()[2] >= 1_000_000
        assert gc.get_threshold()[2] >= 1_000_000  # the first one still serves
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_wait_for_a_job_reads_its_state_while_it_waits_and_its_record_once(
        served: tuple[ControlPlane, TestClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """A record holds a function's arguments (up to GPULAYER_MAX_ARGS_MB), parsed at each
    read: a long poll on a running job reads its state at each look, the record at the end."""
    control, tc = served
    admin = {"authorization": f"Bearer {control.create_token(scope='admin').token}"}
    w = control.register_worker(make_capabilities(), cpu_slots=1)
    job = control.submit(FunctionJob(function="m:f", args=[list(range(1000))]))
    [task] = control.poll_tasks(w.id)
    control.start_task(task.task_id, worker_id=w.id)
    reads: list[str] = []
    for name in ("get_job", "state_of"):
        real = getattr(control, name)
        monkeypatch.setattr(control, name, lambda job_id, _real=real, _name=name, **kw: reads.append(_name)
                            or _real(job_id, **kw))
    got = tc.get(f"/v1/jobs/{job.id}/wait?timeout=1.5", headers=admin)  # (its looks: at the start, then each second)
    assert got.status_code == 200 and got.json()["state"] == "running"
    assert got.json()["spec"]["args"] == [list(range(1000))]
    assert reads.count("get_job") == 1 and reads[-1] == "get_job" and reads.count("state_of") >= 2, reads
    assert tc.get("/v1/jobs/job-000000000000/wait?timeout=0", headers=admin).status_code == 404


def test_a_list_of_jobs_pages_over_http_and_a_cursor_is_the_callers_own(
        served: tuple[ControlPlane, TestClient]) -> None:
    control, tc = served
    admin = remote(tc, control.create_token(scope="admin").token)
    mine = remote(tc, admin.create_token(scope="client").token)
    theirs = remote(tc, admin.create_token(scope="client").token)
    waits = Placement(target="remote", on_unschedulable="wait")
    jobs = [mine.submit(CommandJob(command=["true"], placement=waits)).id for _ in range(3)]
    other = theirs.submit(CommandJob(command=["true"], placement=waits)).id
    first = [j.id for j in mine.list_jobs(limit=2)]
    rest = [j.id for j in mine.list_jobs(limit=2, before=first[-1])]
    assert first + rest == [j.id for j in mine.list_jobs()] and sorted(first + rest) == sorted(jobs)
    with pytest.raises(errors.NotFound):
        mine.list_jobs(before=other)
    with pytest.raises(errors.InvalidInput, match="before"):
        mine.list_jobs(before="")
