"""A function job's arguments after its submit: checked once, when they come from a caller,
and neither walked again nor sent where the reader wants the rest of the record.

Arguments may be a megabyte. :func:`gpulayer.specs.check_json` walks every value in Python;
a spec read back from the store or from a control plane's answer carries
:data:`gpulayer.specs.CHECKED`, so that walk is not repeated at every read (nor wherever a
record holds the spec). ``get_job`` and ``wait_job`` take ``arguments=False`` (a query field
over HTTP) for readers of the outcome: ``result()``, ``gpulayer jobs result`` and ``wait``, a
follower; ``get_job(brief=True)`` leaves out the tasks and the result too, for readers of the
state alone (``status()``, ``done()``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpulayer import client as client_mod
from gpulayer import specs
from gpulayer.control import ControlPlane
from gpulayer.errors import InvalidArgument, InvalidInput
from gpulayer.http_client import connect_http
from gpulayer.records import JobState
from gpulayer.server.app import create_app
from gpulayer.specs import FunctionJob, Placement
from gpulayer.store import Store
from tests.factories import make_capabilities
from tests.support import job_module

ARGS = [{"rows": [1, 2.5, "caf\u00e9", None, True]}, [[1], [2]]]
KWARGS = {"k": {"nested": ["x"]}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ControlPlane, TestClient, dict[str, str]]]:
    control = ControlPlane(Store(f"sqlite:///{tmp_path / 'server.db'}"), heartbeat_timeout=30)
    with TestClient(create_app(control, background=False)) as tc:
        yield control, tc, {"authorization": f"Bearer {control.create_token(scope='admin').token}"}


def _walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths :func:`gpulayer.specs.check_json` is asked to walk from now on."""
    walked: list[str] = []
    real = specs.check_json

    def counted(value: Any, path: str) -> None:
        walked.append(path)
        real(value, path)

    monkeypatch.setattr(specs, "check_json", counted)
    return walked


def test_stored_arguments_are_not_walked_again_by_any_read(
        served: tuple[ControlPlane, TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    control, tc, admin = served
    client = connect_http("http://testserver", token=admin["authorization"][7:], retry_for=0.5,
                          transport=tc._transport)
    reply = client.join_worker(make_capabilities(), join_token=control.create_token(scope="join").token)
    walked = _walks(monkeypatch)
    spec = FunctionJob(function="m:f", args=ARGS, kwargs=KWARGS, placement=Placement(target="remote"))
    assert walked == ["args", "kwargs"]  # the caller's spec is checked
    job = client.submit(spec)
    # ... and so is a submit's body: as the HTTP client builds it (a spec changed after it
    # was built is refused there, not sent as JSON would read it) and on the server (what a
    # client sends is not trusted)
    assert walked == ["args", "kwargs"] * 3
    worker = connect_http("http://testserver", token=reply.token, retry_for=0.5, transport=tc._transport)
    [task] = worker.poll_tasks(reply.worker_id)
    reads = [task.spec, client.get_job(job.id).spec, client.wait_job(job.id, timeout=0).spec,
             control.get_job(job.id).spec, client.submit(spec, idempotency_key="k").spec,
             client.submit(spec, idempotency_key="k").spec]
    for read in reads:
        assert (read.args, read.kwargs) == (ARGS, KWARGS)  # type: ignore[union-attr]
    for explained in (client.explain_job(job.id), control.explain_job(job.id)):  # (placement's view: no arguments)
        assert explained.spec.kind == "function" and explained.state is JobState.ASSIGNED
    # no read walked them: only the two submits above did, as the first one
    assert walked == ["args", "kwargs"] * 7


def test_a_submit_still_refuses_arguments_that_are_not_json(
        served: tuple[ControlPlane, TestClient, dict[str, str]]) -> None:
    """What a client sends is checked, whatever context a server's own reads use."""
    control, tc, admin = served
    deep: Any = 1
    for _ in range(specs.MAX_JSON_DEPTH + 1):
        deep = [deep]
    spec = '{"spec": {"kind": "function", "function": "m:f", "args": %s}}'
    for args, said in ((json.dumps([deep]), "nested more than 100 levels deep"),
                       ('[{"a": "\\udc80"}]', "lone surrogate"), ("[1, 1e400]", "infinities are not allowed")):
        bad = tc.post("/v1/jobs", headers={**admin, "content-type": "application/json"},
                      content=(spec % args).encode())
        assert bad.status_code in (400, 422) and said in bad.json()["error"]["message"], (args, bad.text)
    assert control.list_jobs() == []


@pytest.mark.parametrize(("bad", "said"), [
    (float("nan"), "NaN and infinities are not allowed"), ("a\udc80b", "lone surrogate"), ({1, 2}, "a set is not JSON"),
    ([[[[1]]]], "nested more than 3 levels deep")])
def test_an_in_process_submit_checks_arguments_changed_after_the_spec_was_built(
        cp: ControlPlane, monkeypatch: pytest.MonkeyPatch, bad: Any, said: str) -> None:
    """A spec's arguments are lists its caller holds: one changed after the spec was built
    (and checked) is refused by the submit, and nothing is stored, as a server refuses it in
    a request body."""
    monkeypatch.setattr(specs, "MAX_JSON_DEPTH", 3)
    spec = FunctionJob(function="m:f", args=[[1]], kwargs={"k": [2]})
    spec.args[0].append(bad)
    with pytest.raises(InvalidArgument, match=r"^args\[0\]"):
        cp.submit(spec)
    other = FunctionJob(function="m:f", kwargs={"k": []})
    other.kwargs["k"].append(bad)
    with pytest.raises(InvalidArgument, match=r"^specs\[1\]: kwargs\[\"k\"\]"):
        cp.submit_many([FunctionJob(function="m:f"), other])
    assert cp.list_jobs() == []
    with pytest.raises(InvalidArgument, match=said):
        cp.submit(spec)


def test_a_record_without_its_arguments_over_http(served: tuple[ControlPlane, TestClient, dict[str, str]]) -> None:
    control, tc, admin = served
    job = control.submit(FunctionJob(function="m:f", args=ARGS, kwargs=KWARGS,
                                     placement=Placement(target="remote", on_unschedulable="wait")))
    for path in (f"/v1/jobs/{job.id}", f"/v1/jobs/{job.id}/wait?timeout=0"):
        sep = "&" if "?" in path else "?"
        whole = tc.get(path, headers=admin).json()
        lean = tc.get(f"{path}{sep}arguments=false", headers=admin).json()
        assert (whole["spec"]["args"], whole["spec"]["kwargs"]) == (ARGS, KWARGS)
        assert (lean["spec"]["args"], lean["spec"]["kwargs"]) == ([], {})
        assert {k: v for k, v in lean.items() if k != "spec"} == {k: v for k, v in whole.items() if k != "spec"}
        assert tc.get(f"{path}{sep}arguments=true", headers=admin).json() == whole
        bad = tc.get(f"{path}{sep}arguments=maybe", headers=admin)
        assert bad.status_code in (400, 422) and "query.arguments" in bad.json()["error"]["message"], bad.text
    body = {"spec": {"kind": "function", "function": "m:f", "args": ARGS, "kwargs": KWARGS,
                     "placement": {"target": "remote", "on_unschedulable": "wait"}}}
    lean = tc.post("/v1/jobs?arguments=false", headers=admin, json=body)
    assert lean.status_code == 201 and (lean.json()["spec"]["args"], lean.json()["spec"]["kwargs"]) == ([], {})
    many = tc.post("/v1/jobs/batch?arguments=false", headers=admin, json={"specs": [body["spec"]] * 2})
    assert many.status_code == 201 and [j["spec"]["args"] for j in many.json()] == [[], []]
    for stored in (lean.json(), *many.json()):  # (stored whole)
        assert tc.get(f"/v1/jobs/{stored['id']}", headers=admin).json()["spec"]["args"] == ARGS
    brief = tc.get(f"/v1/jobs/{job.id}?brief=true", headers=admin).json()
    assert (brief["state"], brief["tasks"], brief["result"], brief["spec"]["args"]) == ("queued", [], None, [])
    bad = tc.get(f"/v1/jobs/{job.id}?brief=maybe", headers=admin)
    assert bad.status_code in (400, 422) and "query.brief" in bad.json()["error"]["message"], bad.text
    client = connect_http("http://testserver", token=admin["authorization"][7:], retry_for=0.5,
                          transport=tc._transport)
    assert client.get_job(job.id, arguments=False).spec.args == []  # type: ignore[union-attr]
    assert client.wait_job(job.id, timeout=0, arguments=False).spec.kwargs == {}  # type: ignore[union-attr]
    assert control.get_job(job.id).spec.args == ARGS  # type: ignore[union-attr]


MODULE = """
import gpulayer as gl


@gl.remote
def count(xs, **kw):
    return [len(xs), sorted(kw)]
"""


@pytest.fixture
def countmod(gpulayer_isolated: None, probes_seeded: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
             ) -> Iterator[Any]:
    with job_module(tmp_path, monkeypatch, "countmod", MODULE) as module:
        yield module


def test_result_reads_the_outcome_without_the_arguments_and_falls_back_where_not_known(
        countmod: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``result()`` asks for the record without the arguments. A control plane from before
    ``arguments`` refuses it (as a server words an unknown query field): it then asks as
    before, and does not try again. ``record()`` and ``wait()`` keep the whole record."""
    walked = _walks(monkeypatch)
    client = client_mod.connect()
    submits: list[object] = []
    real_submit = client.api.submit
    monkeypatch.setattr(client.api, "submit", lambda spec, **kw: submits.append(kw.get("arguments"))
                        or real_submit(spec, **kw))
    handle = countmod.count.remote(list(range(5)), b=1, a=2)
    # checked where .remote() was called, and by the submit (an in-process caller's spec
    # may change after it was built: see the test above)
    assert walked == ["count.remote(): args", "count.remote(): kwargs", "args", "kwargs"]
    assert submits == [False]  # (its answer without them: the handle needs its id and state)
    real = client.api.wait_job
    asked: list[object] = []

    def seen(job_id: str, **kw: Any) -> Any:
        asked.append(kw.get("arguments"))
        return real(job_id, **kw)

    monkeypatch.setattr(client.api, "wait_job", seen)
    assert handle.result(timeout=120) == [5, ["a", "b"]]
    assert asked and set(asked) == {False}
    assert handle.wait(timeout=120).spec.args == [list(range(5))]  # (the record, whole)
    assert handle.record().spec.kwargs == {"b": 1, "a": 2}
    assert asked[-1] is None
    assert walked == ["count.remote(): args", "count.remote(): kwargs", "args", "kwargs"]  # (no read walked them again)

    def older(job_id: str, **kw: Any) -> Any:
        asked.append(kw.get("arguments"))
        if "arguments" in kw:
            raise InvalidInput("query.arguments='false': no such field; accepted: timeout")
        return real(job_id, **kw)

    asked.clear()
    monkeypatch.setattr(client.api, "wait_job", older)
    for _ in range(2):
        assert handle.result(timeout=120) == [5, ["a", "b"]]
    assert asked == [False, None, None]  # refused once, then asked as before

    # status() and done() read the state alone: no tasks, result or arguments
    real_get = client.api.get_job
    gets: list[dict[str, Any]] = []
    monkeypatch.setattr(client.api, "get_job", lambda job_id, **kw: gets.append(kw) or real_get(job_id, **kw))
    assert (handle.status(), handle.done()) == (JobState.SUCCEEDED.value, True)
    assert handle.logs() == "" and list(handle.follow()) == []  # (their look at the spec's nodes too)
    # (and the follower's own looks, without the arguments where the control plane can)
    assert gets[:4] == [{"brief": True}] * 4 and not any("brief" in kw for kw in gets[4:])
    brief = real_get(handle.id, brief=True)
    assert (brief.result, brief.tasks, brief.spec.args) == (None, [], [])  # type: ignore[union-attr]
    # a control plane that refuses brief (as a server words an unknown query field): asked
    # once, then as without it (the arguments left out where it can)
    gets.clear()

    def older_get(job_id: str, **kw: Any) -> Any:
        gets.append(kw)
        if "brief" in kw:
            raise InvalidInput("query.brief='true': no such field; accepted: arguments")
        return real_get(job_id, **kw)

    monkeypatch.setattr(client.api, "get_job", older_get)
    for _ in range(2):
        assert (handle.status(), handle.done()) == (JobState.SUCCEEDED.value, True)
    assert gets[0] == {"brief": True} and len(gets) == 5 and not any("brief" in kw for kw in gets[1:])
    # an error about a field's value is not taken for an older control plane: it is raised
    monkeypatch.setattr(client.api, "wait_job", lambda job_id, **kw: (_ for _ in ()).throw(
        InvalidInput("query.arguments='maybe': not a boolean; accepted: true, false")))
    client._argument_free = True
    with pytest.raises(InvalidInput, match="not a boolean"):
        handle.result(timeout=120)
    assert client._argument_free
