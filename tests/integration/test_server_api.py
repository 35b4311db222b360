"""The server's HTTP API against a real ``gpulayer server start`` process on loopback:
token scopes and ownership, token lifetimes, bundles, bad input, metrics. The sweep of every
route with every wrong credential is tests/integration/test_auth_sweep.py; the fuzzer
(schemathesis) is tests/integration/test_server_fuzz.py."""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import ssl
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.client import http_client
from gpulayer.errors import AuthError, BundleError, Conflict, Forbidden, InvalidInput, NotFound
from gpulayer.specs import CommandJob, Placement, Requirements
from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_for

pytestmark = pytest.mark.timeout(300)

MAX_MB = 0.25


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    home = tmp_path_factory.mktemp("server-home")
    srv = ServerProc(home, env={"GPULAYER_MAX_BUNDLE_MB": str(MAX_MB), "GPULAYER_HEARTBEAT_TIMEOUT": "3"})
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def admin(server: ServerProc) -> Api:
    return Api(server.url, server.admin_token)


def caps_json() -> dict[str, Any]:
    return json.loads(make_capabilities().model_dump_json())


def join(server: ServerProc, join_token: str) -> Any:
    return Api(server.url, join_token)("POST", "/v1/workers/join", json={"capabilities": caps_json(), "cpu_slots": 1})


@pytest.fixture(scope="module")
def tokens(server: ServerProc, admin: Api) -> dict[str, Any]:
    """One token of each scope, plus a registered worker and a job owned by the admin."""
    client = admin.token_for("client")["token"]
    other_client = admin.token_for("client")["token"]
    join_tok = admin.token_for("join")["token"]
    bootstrap = admin.token_for("bootstrap")["token"]
    r = join(server, join_tok)
    assert r.status_code == 201, r.text
    worker = r.json()
    r2 = join(server, join_tok)
    assert r2.status_code == 201
    job = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"],
                                                   "placement": {"on_unschedulable": "wait"}}})
    assert job.status_code == 201, job.text
    return {"admin": server.admin_token, "client": client, "other_client": other_client, "join": join_tok,
            "bootstrap": bootstrap, "worker": worker["token"], "worker_id": worker["worker_id"],
            "other_worker_id": r2.json()["worker_id"], "job_id": job.json()["id"]}


def _ops(admin: Api) -> list[tuple[str, str, dict[str, Any]]]:
    doc = admin("GET", "/v1/openapi.json").json()
    return [(method.upper(), path, item) for path, methods in doc["paths"].items() for method, item in methods.items()]


def test_openapi_lists_every_route(admin: Api) -> None:
    ops = {(m, p) for m, p, _ in _ops(admin)}
    expected = {
        ("POST", "/v1/jobs"), ("POST", "/v1/jobs/batch"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{job_id}"),
        ("POST", "/v1/jobs/{job_id}/cancel"), ("GET", "/v1/jobs/{job_id}/logs"),
        ("GET", "/v1/jobs/{job_id}/wait"), ("GET", "/v1/jobs/{job_id}/events"), ("POST", "/v1/jobs/wait"),
        ("HEAD", "/v1/bundles/{digest}"), ("GET", "/v1/bundles/{digest}"), ("PUT", "/v1/bundles/{digest}"),
        ("POST", "/v1/workers/join"), ("POST", "/v1/workers/{worker_id}/heartbeat"),
        ("GET", "/v1/workers/{worker_id}/tasks"), ("POST", "/v1/tasks/{task_id}/start"),
        ("POST", "/v1/tasks/{task_id}/logs"), ("POST", "/v1/tasks/{task_id}/finish"),
        ("POST", "/v1/workers/{worker_id}/drain"), ("DELETE", "/v1/workers/{worker_id}"),
        ("GET", "/v1/workers"), ("GET", "/v1/workers/usage"), ("POST", "/v1/tokens"),
        ("GET", "/v1/tokens"), ("DELETE", "/v1/tokens/{token_id}"), ("GET", "/metrics"),
        ("GET", "/healthz"), ("GET", "/v1/openapi.json"),
    }
    assert expected <= ops


def test_healthz_is_the_only_open_route_and_reveals_nothing(server: ServerProc) -> None:
    r = Api(server.url, None)("GET", "/healthz")
    assert r.status_code == 200 and r.json() == {"ok": True}


# every route against every wrong credential: tests/integration/test_auth_sweep.py;
# generated requests against the OpenAPI document: tests/integration/test_server_fuzz.py


def test_worker_credential_acts_only_for_its_own_worker(server: ServerProc, tokens: dict[str, Any]) -> None:
    w = Api(server.url, tokens["worker"])
    other = tokens["other_worker_id"]
    for method, path, body in [("POST", f"/v1/workers/{other}/heartbeat", {"running": []}),
                               ("GET", f"/v1/workers/{other}/tasks", None),
                               ("POST", f"/v1/workers/{other}/drain", None),
                               ("DELETE", f"/v1/workers/{other}", None),
                               ("POST", f"/v1/workers/{other}/register", {"capabilities": caps_json()})]:
        r = w(method, path, json=body)
        assert r.status_code == 403, (path, r.text)
    assert w("POST", f"/v1/workers/{tokens['worker_id']}/heartbeat", json={"running": []}).status_code == 200
    # it cannot submit, read jobs or join again
    spec = {"spec": {"kind": "command", "command": ["true"]}}
    assert w("POST", "/v1/jobs", json=spec).status_code == 403
    assert w("GET", "/v1/jobs").status_code == 403
    assert w("POST", "/v1/workers/join", json={"capabilities": caps_json()}).status_code == 403


def test_client_reads_only_its_own_jobs_and_cannot_register(server: ServerProc, tokens: dict[str, Any]) -> None:
    c = Api(server.url, tokens["client"])
    spec = {"kind": "command", "command": ["true"], "placement": {"on_unschedulable": "wait"}}
    r = c("POST", "/v1/jobs", json={"spec": spec, "idempotency_key": "k1"})
    assert r.status_code == 201, r.text
    mine = r.json()["id"]
    # the same key gives the same job back
    assert c("POST", "/v1/jobs", json={"spec": spec, "idempotency_key": "k1"}).json()["id"] == mine
    # another client's same key is another job: keys are per token
    other = Api(server.url, tokens["other_client"])
    theirs = other("POST", "/v1/jobs", json={"spec": spec, "idempotency_key": "k1"}).json()["id"]
    assert theirs != mine
    assert [j["id"] for j in c("GET", "/v1/jobs").json()] == [mine]
    for path in (f"/v1/jobs/{theirs}", f"/v1/jobs/{theirs}/logs", f"/v1/jobs/{theirs}/events",
                 f"/v1/jobs/{tokens['job_id']}", f"/v1/jobs/{theirs}/wait?timeout=0"):
        assert c("GET", path).status_code == 404, path
    assert c("POST", f"/v1/jobs/{theirs}/cancel").status_code == 404
    assert c("GET", f"/v1/jobs/{mine}").status_code == 200
    assert c("POST", "/v1/workers/join", json={"capabilities": caps_json()}).status_code == 403
    assert c("GET", "/v1/tokens").status_code == 403
    assert c("GET", "/metrics").status_code == 403
    # admin sees everything
    admin = Api(server.url, tokens["admin"])
    assert admin("GET", f"/v1/jobs/{theirs}").status_code == 200
    for j in (mine, theirs):
        assert admin("POST", f"/v1/jobs/{j}/cancel").json()["state"] == "cancelled"


def test_join_tokens_expire_get_used_up_and_are_revoked(server: ServerProc, admin: Api) -> None:
    short = admin.token_for("join", ttl=1)
    once = admin.token_for("join", uses=1)
    boot = admin.token_for("bootstrap")
    revoked = admin.token_for("join")
    assert join(server, once["token"]).status_code == 201
    r = join(server, once["token"])
    assert r.status_code == 401 and "used up" in r.json()["error"]["message"]
    b = join(server, boot["token"])
    assert b.status_code == 201 and b.json()["worker"]["origin"] == "provider"
    r = join(server, boot["token"])
    assert r.status_code == 401 and "used up" in r.json()["error"]["message"]
    assert admin("DELETE", f"/v1/tokens/{revoked['id']}").status_code == 200
    r = join(server, revoked["token"])
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
    time.sleep(1.2)
    r = join(server, short["token"])
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    listed = {t["id"]: t for t in admin("GET", "/v1/tokens").json()}
    assert listed[once["id"]]["uses_left"] == 0 and listed[revoked["id"]]["revoked"]
    assert all("token" not in t and "hash" not in t for t in listed.values())
    # a join token defaults to a 24 h lifetime
    j = admin.token_for("join")
    assert 23.9 * 3600 < j["expires_at"] - j["created_at"] <= 24 * 3600


def test_revoked_client_token_is_refused(server: ServerProc, admin: Api) -> None:
    t = admin.token_for("client")
    c = Api(server.url, t["token"])
    assert c("GET", "/v1/jobs").status_code == 200
    admin("DELETE", f"/v1/tokens/{t['id']}")
    time.sleep(2.1)  # verification results are cached for at most 2 s
    assert c("GET", "/v1/jobs").status_code == 401


def test_tokens_are_stored_only_as_hashes(server: ServerProc, admin: Api) -> None:
    import sqlite3

    t = admin.token_for("client")
    con = sqlite3.connect(server.home / "gpulayer.db")
    rows = con.execute("SELECT hash FROM gl_tokens").fetchall()
    con.close()
    assert t["token"].startswith("glt_") and len(t["token"]) >= 40
    assert all(t["token"] not in r[0] for r in rows)
    assert (hashlib.sha256(t["token"].encode()).hexdigest(),) in rows
    assert (server.home / "admin.token").stat().st_mode & 0o777 == 0o600


def test_bundle_upload_dedupe_mismatch_and_limit(server: ServerProc, admin: Api, tokens: dict[str, Any]) -> None:
    c = http_client(server.url, token=tokens["client"], retry_for=2).api
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("noise.bin", random.randbytes(10_000))
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    assert not c.has_bundle(digest)
    assert c.put_bundle(digest, data).stored is True
    assert c.put_bundle(digest, data).stored is False  # stored once
    assert c.has_bundle(digest)
    assert c.get_bundle(digest) == data
    # a worker reads it only while it has a task of a job that uses it (tests/unit/test_tenancy.py)
    w = http_client(server.url, token=tokens["worker"], retry_for=2).api
    with pytest.raises(NotFound):
        w.get_bundle(digest)
    # not a zip: 422, nothing stored
    junk = b"PK" + random.randbytes(1000)
    r = admin("PUT", f"/v1/bundles/{hashlib.sha256(junk).hexdigest()}", content=junk)
    assert r.status_code == 422 and "not a valid zip archive" in r.json()["error"]["message"]
    # content that does not hash to its address: 422, nothing stored
    other = random.randbytes(5000)
    wrong = hashlib.sha256(b"something else").hexdigest()
    r = admin("PUT", f"/v1/bundles/{wrong}", content=other)
    assert r.status_code == 422 and "does not match" in r.json()["error"]["message"]
    assert admin("HEAD", f"/v1/bundles/{wrong}").status_code == 404
    with pytest.raises(BundleError):
        c.put_bundle(wrong, other)
    # over GPULAYER_MAX_BUNDLE_MB: 413 while streaming (no content-length), nothing stored
    big = random.randbytes(int(MAX_MB * 1024 * 1024) + 1)
    big_digest = hashlib.sha256(big).hexdigest()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 32_000):
            yield big[i:i + 32_000]

    r = admin("PUT", f"/v1/bundles/{big_digest}", content=chunks())
    assert r.status_code == 413, r.text
    r = admin("PUT", f"/v1/bundles/{big_digest}", content=big)
    assert r.status_code == 413 and "GPULAYER_MAX_BUNDLE_MB" in r.json()["error"]["message"]
    assert admin("HEAD", f"/v1/bundles/{big_digest}").status_code == 404
    assert admin("PUT", "/v1/bundles/not-a-digest", content=b"x").status_code == 422
    with pytest.raises(NotFound):
        w.get_bundle(big_digest)


def test_bad_input_is_4xx_naming_the_field(server: ServerProc, admin: Api) -> None:
    r = admin("POST", "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = admin("POST", "/v1/jobs", json=[1, 2])
    assert r.status_code == 400
    r = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": "echo hi"}})
    assert r.status_code == 422 and "command" in r.json()["error"]["message"]
    r = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"]}, "bogus": 1})
    assert r.status_code == 422 and "bogus" in r.json()["error"]["message"]
    r = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"], "retries": -1}})
    assert r.status_code == 422 and "retries" in r.json()["error"]["message"]
    r = admin("GET", "/v1/jobs?limit=abc")
    assert r.status_code == 422 and "limit" in r.json()["error"]["message"]
    r = admin("GET", "/v1/jobs?state=nope")
    assert r.status_code == 422 and "state" in r.json()["error"]["message"]
    r = admin("POST", "/v1/tokens", json={"scope": "worker"})
    assert r.status_code == 422 and "scope" in r.json()["error"]["message"]
    r = admin("GET", "/v1/jobs/job-nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = admin("PATCH", "/v1/jobs")
    assert r.status_code == 405
    r = admin("GET", "/v1/nowhere")
    assert r.status_code == 404


def test_http_client_errors(server: ServerProc, tokens: dict[str, Any]) -> None:
    with pytest.raises(AuthError) as e:
        http_client(server.url, token="glt_wrong", retry_for=1).api.list_jobs()
    assert type(e.value) is AuthError and e.value.status_code == 401
    with pytest.raises(Forbidden) as f:
        http_client(server.url, token=tokens["worker"], retry_for=1).api.list_jobs()
    assert f.value.status_code == 403
    with pytest.raises(NotFound):
        http_client(server.url, token=tokens["client"], retry_for=1).api.get_job("job-nope")
    # an id the server would route elsewhere once it decodes the path: no such job, as embedded
    # (an opaque 'HTTP 307', 'GET is not allowed here', 'no such route' before)
    c = http_client(server.url, token=tokens["client"], retry_for=1)
    for job_id in ("", "job-3d7c690c6297/cancel", "../workers", ".."):
        with pytest.raises(NotFound, match=re.escape(f"job {job_id!r}: no such job")):
            c.api.get_job(job_id)
    with pytest.raises(NotFound, match="worker '': no such worker"):
        http_client(server.url, token=server.admin_token, retry_for=1).api.drain_worker("")


def test_submit_is_idempotent_through_http_client(server: ServerProc, tokens: dict[str, Any]) -> None:
    c = http_client(server.url, token=tokens["client"], retry_for=2)
    # the fixture's joined workers (CPU only) may still be online: ask for a GPU none has
    spec = CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", gpus=1),
                      placement=Placement(target="remote", on_unschedulable="wait"))
    a = c.submit(spec, idempotency_key="same")
    b = c.submit(spec, idempotency_key="same")
    assert a.id == b.id
    assert c.wait(a.id, timeout=0.5).state.value == "queued"  # no worker can serve it yet
    c.api.cancel(a.id)


def test_a_cancel_s_reason_reaches_the_jobs_through_a_server(server: ServerProc, tokens: dict[str, Any]) -> None:
    """What a cancelled task's process says of the jobs it submitted: through a server they read
    only 'cancelled' before; a request without a reason sends no such field (a server from
    before reasons would refuse one)."""
    c = http_client(server.url, token=tokens["client"], retry_for=2)
    spec = CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", gpus=1),
                      placement=Placement(target="remote", on_unschedulable="wait"))
    a, b = c.submit(spec), c.submit(spec)
    done = c.cancel_jobs([a.id], reason="the job that submitted it was cancelled")
    assert done[a.id].state.value == "cancelled"  # type: ignore[union-attr]
    error = c.job(a.id).error
    assert error is not None and error.message == "the job that submitted it was cancelled (before it started)"
    c.cancel_jobs([b.id])
    assert c.job(b.id).error.message == "cancelled before it started"  # type: ignore[union-attr]
    r = Api(server.url, tokens["client"])("POST", "/v1/jobs/cancel", json={"job_ids": [a.id], "reason": ""})
    assert r.status_code == 422 and "reason" in r.text, r.text


def test_metrics(server: ServerProc, admin: Api) -> None:
    r = admin("GET", "/metrics")
    assert r.status_code == 200
    text = r.text
    for needle in ('gpulayer_jobs{state="queued"}', "gpulayer_workers_online", "gpulayer_queue_depth",
                   "gpulayer_placement_seconds_bucket", "gpulayer_placement_seconds_count"):
        assert needle in text


def test_review_findings_on_bad_input(server: ServerProc, admin: Api) -> None:
    # deeply nested JSON is bad input (400), not a 500
    r = admin("POST", "/v1/jobs", content=b"[" * 100_000 + b"]" * 100_000,
              headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "nested too deeply" in r.json()["error"]["message"]
    # a number of uses means something only for join tokens
    r = admin("POST", "/v1/tokens", json={"scope": "client", "uses": 1})
    assert r.status_code == 422, r.text
    assert "only join tokens have a number of uses" in r.json()["error"]["message"]


def test_a_pin_or_ca_with_a_plain_http_url_is_refused() -> None:
    from gpulayer.errors import InvalidInput
    from gpulayer.http_client import tls_verify

    for ca in ("sha256:AB:CD", "/etc/ssl/certs/ca.pem"):
        with pytest.raises(InvalidInput, match="not an https:// URL"):
            tls_verify("http://10.0.0.5:8765", ca)
    # plain HTTP: no CA bundle is read; a context that trusts no certificate, should TLS come up
    bare = tls_verify("http://127.0.0.1:8765", None)
    assert isinstance(bare, ssl.SSLContext) and bare.verify_mode == ssl.CERT_REQUIRED and bare.check_hostname
    assert bare.cert_store_stats()["x509_ca"] == 0 and bare.get_ca_certs() == []


# --------------------------------------------------------------------------- POST /v1/jobs/batch

#: a spec no worker of this module can run (they have no GPU): it stays queued
QUEUED_SPEC: dict[str, Any] = {"kind": "command", "command": ["true"],
                               "requirements": {"accelerator": "cuda", "gpus": 1},
                               "placement": {"target": "remote", "on_unschedulable": "wait"}}


def _batch(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{**QUEUED_SPEC, "name": f"batch-{i}", **extra} for i in range(n)]


def _cancel_all(api: Api, job_ids: list[str]) -> None:
    for job_id in job_ids:
        assert api("POST", f"/v1/jobs/{job_id}/cancel").status_code == 200


def test_a_batch_is_stored_in_order_idempotent_and_owned_by_its_token(server: ServerProc, admin: Api) -> None:
    c = Api(server.url, admin.token_for("client")["token"])
    other = Api(server.url, admin.token_for("client")["token"])
    body = {"specs": _batch(3), "idempotency_key": "b-1"}
    r = c("POST", "/v1/jobs/batch", json=body)
    assert r.status_code == 201, r.text
    jobs = r.json()
    assert isinstance(jobs, list) and [j["spec"]["name"] for j in jobs] == ["batch-0", "batch-1", "batch-2"]
    assert {j["state"] for j in jobs} == {"queued"}
    mine = [j["id"] for j in jobs]
    # the same key and batch again: the same jobs, none stored twice
    again = c("POST", "/v1/jobs/batch", json=body)
    assert again.status_code == 201 and [j["id"] for j in again.json()] == mine
    assert sorted(j["id"] for j in c("GET", "/v1/jobs").json()) == sorted(mine)
    # the key with a batch of another size is a conflict
    r = c("POST", "/v1/jobs/batch", json={"specs": _batch(2), "idempotency_key": "b-1"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", r.text
    # another client's same key is another batch, and it cannot see these jobs
    theirs = other("POST", "/v1/jobs/batch", json=body)
    assert theirs.status_code == 201 and not {j["id"] for j in theirs.json()} & set(mine)
    for job_id in mine:
        assert other("GET", f"/v1/jobs/{job_id}").status_code == 404
        assert other("POST", f"/v1/jobs/{job_id}/cancel").status_code == 404
        assert c("GET", f"/v1/jobs/{job_id}").status_code == 200
    _cancel_all(c, mine)
    _cancel_all(other, [j["id"] for j in theirs.json()])


def test_a_batch_as_admin_and_scopes_that_may_not_submit_one(server: ServerProc, admin: Api,
                                                             tokens: dict[str, Any]) -> None:
    r = admin("POST", "/v1/jobs/batch", json={"specs": _batch(2)})
    assert r.status_code == 201, r.text
    _cancel_all(admin, [j["id"] for j in r.json()])
    for scope in ("worker", "join", "bootstrap"):
        assert Api(server.url, tokens[scope])("POST", "/v1/jobs/batch",
                                              json={"specs": _batch(1)}).status_code == 403, scope


def test_bad_batch_bodies_are_4xx_naming_the_field(server: ServerProc, admin: Api) -> None:
    c = Api(server.url, admin.token_for("client")["token"])

    def refused(body: Any, *words: str) -> None:
        r = c("POST", "/v1/jobs/batch", json=body)
        assert r.status_code in (400, 422), (body if not isinstance(body, dict) else list(body), r.status_code, r.text)
        message = r.json()["error"]["message"]
        for word in words:
            assert re.search(word, message), (word, message)

    refused({"specs": []}, r"\bspecs\b", "empty")
    refused({"specs": "not a list"}, r"\bspecs\b", "not a list")
    refused({"specs": {"kind": "command", "command": ["true"]}}, r"\bspecs\b")
    refused({}, r"\bspecs\b", "missing")
    refused([QUEUED_SPEC], "JSON object")
    refused({"specs": _batch(1001)}, r"\bspecs\b", "1000")
    refused({"specs": _batch(1), "bogus": 1}, "bogus")
    refused({"specs": _batch(1), "idempotency_key": "k" * 201}, "idempotency_key")
    # a bad spec in position 2 is named by its index
    bad = _batch(3)
    bad[2] = {**bad[2], "command": "echo hi"}
    refused({"specs": bad}, r"specs(\.2|\[2\])\.", "command")
    assert c("GET", "/v1/jobs").json() == []  # none of them was stored


def test_a_batch_with_a_spec_the_control_plane_refuses_stores_none(server: ServerProc, admin: Api) -> None:
    c = Api(server.url, admin.token_for("client")["token"])
    missing = hashlib.sha256(b"never uploaded").hexdigest()
    specs = _batch(3)
    specs[2] = {**specs[2], "bundle_digest": missing}
    r = c("POST", "/v1/jobs/batch", json={"specs": specs, "idempotency_key": "bad-2"})
    assert r.status_code == 422, r.text
    assert c("GET", "/v1/jobs").json() == []
    # the key was not spent: the batch made good is stored under it
    good = c("POST", "/v1/jobs/batch", json={"specs": _batch(3), "idempotency_key": "bad-2"})
    assert good.status_code == 201, good.text
    _cancel_all(c, [j["id"] for j in good.json()])
    message = r.json()["error"]["message"]
    assert missing in message and "no bundle with that address" in message
    assert message.startswith("specs[2]: "), message


def test_submit_many_through_the_http_client(server: ServerProc, admin: Api) -> None:
    token = admin.token_for("client")["token"]
    c = http_client(server.url, token=token, retry_for=2)
    specs = [CommandJob(command=["echo", str(i)], requirements=Requirements(accelerator="cuda", gpus=1),
                        placement=Placement(target="remote", on_unschedulable="wait")) for i in range(4)]
    records = c.api.submit_many(specs, idempotency_key="wire")
    assert [r.spec.command for r in records] == [["echo", str(i)] for i in range(4)]  # type: ignore[union-attr]
    assert [r.id for r in c.api.submit_many(specs, idempotency_key="wire")] == [r.id for r in records]
    # the Client prepares and splits; the same key gives the same jobs again
    more = c.submit_many(specs, idempotency_key="client-key")
    assert [r.spec.command for r in more] == [["echo", str(i)] for i in range(4)]  # type: ignore[union-attr]
    assert [r.id for r in c.submit_many(specs, idempotency_key="client-key")] == [r.id for r in more]
    assert not {r.id for r in more} & {r.id for r in records}
    assert {j.id for j in c.api.list_jobs()} == {r.id for r in [*records, *more]}
    # the server's refusal comes back as the same error class
    with pytest.raises(Conflict, match="idempotency_key 'wire': a batch of another size"):
        c.api.submit_many(specs[:2], idempotency_key="wire")
    for r in [*records, *more]:
        c.api.cancel(r.id)


def test_the_client_keeps_each_batch_request_within_the_servers_body_limit(server: ServerProc, admin: Api) -> None:
    """Specs a server takes one by one (100 kB of environment each) are taken as a list:
    the client splits it into requests the server accepts (200 x 100 kB is over 16 MiB)."""
    c = http_client(server.url, token=admin.token_for("client")["token"], retry_for=2)
    spec = CommandJob(command=["true"], env={"BIG": "x" * 100_000},
                      requirements=Requirements(accelerator="cuda", gpus=1),
                      placement=Placement(target="remote", on_unschedulable="wait"))
    records = c.submit_many([spec] * 200)
    assert len(records) == 200 and len({r.id for r in records}) == 200
    for r in records:
        c.api.cancel(r.id)


def test_an_empty_batch_through_the_http_client_is_refused_naming_the_argument(server: ServerProc,
                                                                              admin: Api) -> None:
    """Refused before it is sent, naming the operation and the argument as the caller wrote it."""
    c = http_client(server.url, token=admin.token_for("client")["token"], retry_for=2)
    with pytest.raises(InvalidInput) as info:
        c.api.submit_many([])
    assert str(info.value).startswith("submit_many: specs: "), str(info.value)
    assert "at least 1 item" in str(info.value)
    assert c.api.list_jobs() == []


# --------------------------------------------------------------------------- POST /v1/jobs/wait


def _wait(api: Api, job_ids: Any, query: str = "timeout=0") -> Any:
    """``POST /v1/jobs/wait``. A wait that should answer at once is sent with ``timeout=30``:
    the request gives up after 20 s, so one that waited the whole 30 s fails (a hang guard;
    nothing here measures time)."""
    return api("POST", f"/v1/jobs/wait?{query}", json={"job_ids": job_ids}, timeout=20)


def test_a_wait_for_many_jobs_answers_those_ended_in_the_order_given(server: ServerProc, admin: Api) -> None:
    c = Api(server.url, admin.token_for("client")["token"])
    r = c("POST", "/v1/jobs/batch", json={"specs": _batch(3)})
    assert r.status_code == 201, r.text
    a, b, d = (j["id"] for j in r.json())
    # none has ended: a look that does not wait answers none
    r = _wait(c, [a, b, d])
    assert r.status_code == 200, r.text
    assert r.json() == []
    # a cancelled job has ended; the others are still queued
    assert c("POST", f"/v1/jobs/{d}/cancel").status_code == 200
    r = _wait(c, [d, a, b], "count=1&timeout=30")
    assert r.status_code == 200, r.text
    assert [(j["id"], j["state"]) for j in r.json()] == [(d, "cancelled")]
    assert c("POST", f"/v1/jobs/{a}/cancel").status_code == 200
    # in the order of the ids, not of the ends; duplicates answered once
    r = _wait(c, [b, d, a, d], "count=2&timeout=30")
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()] == [d, a]
    # a count larger than the ids means all of them: [a, d] have all ended
    r = _wait(c, [a, d], "count=1000&timeout=30")
    assert r.status_code == 200 and [j["id"] for j in r.json()] == [a, d], r.text
    # but not all of [a, b, d]: after the timeout, those that ended
    r = _wait(c, [a, b, d], "count=3&timeout=0.2")
    assert r.status_code == 200 and [j["id"] for j in r.json()] == [a, d], r.text
    # the admin may wait for any client's jobs
    r = _wait(admin, [a, b, d], "count=1")
    assert r.status_code == 200 and [j["id"] for j in r.json()] == [a, d], r.text
    _cancel_all(c, [b])


def test_a_wait_for_many_jobs_is_woken_by_a_job_that_ends_while_it_waits(server: ServerProc, admin: Api) -> None:
    import threading

    token = admin.token_for("client")["token"]
    c = Api(server.url, token)
    a, b, d = (j["id"] for j in c("POST", "/v1/jobs/batch", json={"specs": _batch(3)}).json())
    answers: list[int] = []

    def cancel_soon() -> None:
        time.sleep(0.3)  # (so that the wait is waiting; nothing is measured)
        answers.append(Api(server.url, token)("POST", f"/v1/jobs/{b}/cancel").status_code)

    t = threading.Thread(target=cancel_soon)
    t.start()
    try:
        r = _wait(c, [a, b, d], "count=1&timeout=30")
    finally:
        t.join(30)
    assert answers == [200]
    assert r.status_code == 200, r.text
    assert [(j["id"], j["state"]) for j in r.json()] == [(b, "cancelled")]
    _cancel_all(c, [a, d])


def test_a_client_cannot_wait_for_another_clients_job(server: ServerProc, admin: Api,
                                                       tokens: dict[str, Any]) -> None:
    c = Api(server.url, admin.token_for("client")["token"])
    other = Api(server.url, admin.token_for("client")["token"])
    mine = c("POST", "/v1/jobs", json={"spec": QUEUED_SPEC}).json()["id"]
    theirs = other("POST", "/v1/jobs", json={"spec": QUEUED_SPEC}).json()["id"]
    for ask in ([theirs], [mine, theirs], [tokens["job_id"]], ["job-nope"]):
        r = _wait(c, ask)
        assert r.status_code == 404, (ask, r.text)
        assert r.json()["error"]["code"] == "not_found"
    assert f"job '{theirs}': no such job" in _wait(c, [mine, theirs]).json()["error"]["message"]
    assert _wait(c, [mine]).status_code == 200
    for scope in ("worker", "join", "bootstrap"):
        assert _wait(Api(server.url, tokens[scope]), [mine]).status_code == 403, scope
    _cancel_all(c, [mine])
    _cancel_all(other, [theirs])


def test_bad_waits_for_many_jobs_are_4xx_naming_the_field(server: ServerProc, admin: Api) -> None:
    c = Api(server.url, admin.token_for("client")["token"])
    [job] = [j["id"] for j in c("POST", "/v1/jobs/batch", json={"specs": _batch(1)}).json()]

    def refused(body: Any, query: str, *words: str) -> None:
        r = c("POST", f"/v1/jobs/wait?{query}", json=body)
        assert r.status_code in (400, 422), (query, r.status_code, r.text)
        message = r.json()["error"]["message"]
        for word in words:
            assert re.search(word, message), (word, message)

    refused({"job_ids": []}, "timeout=0", r"\bjob_ids\b")
    refused({"job_ids": job}, "timeout=0", r"\bjob_ids\b")
    refused({"job_ids": {"id": job}}, "timeout=0", r"\bjob_ids\b")
    refused({}, "timeout=0", r"\bjob_ids\b", "missing")
    refused([job], "timeout=0", "JSON object")
    refused({"job_ids": [job] * 1001}, "timeout=0", r"\bjob_ids\b", "1000")
    refused({"job_ids": [job], "bogus": 1}, "timeout=0", "bogus")
    refused({"job_ids": [job]}, "count=0&timeout=0", r"\bcount\b")
    refused({"job_ids": [job]}, "count=1001&timeout=0", r"\bcount\b")
    refused({"job_ids": [job]}, "count=abc&timeout=0", r"\bcount\b")
    refused({"job_ids": [job]}, "timeout=31", r"\btimeout\b")
    refused({"job_ids": [job]}, "timeout=-1", r"\btimeout\b")
    refused({"job_ids": [job]}, "timeout=soon", r"\btimeout\b")
    # the limits themselves are taken
    assert _wait(c, [job] * 1000, "count=1000&timeout=0").json() == []
    _cancel_all(c, [job])


def test_wait_jobs_through_the_http_client(server: ServerProc, admin: Api) -> None:
    import gpulayer as gl

    c = http_client(server.url, token=admin.token_for("client")["token"], retry_for=2)
    spec = CommandJob(command=["true"], requirements=Requirements(accelerator="cuda", gpus=1),
                      placement=Placement(target="remote", on_unschedulable="wait"))
    a, b = (r.id for r in c.api.submit_many([spec, spec]))
    assert c.api.wait_jobs([a, b], count=1, timeout=0) == []
    c.api.cancel(b)
    [ended] = c.api.wait_jobs([a, b], count=1, timeout=0)
    assert (ended.id, ended.state.value) == (b, "cancelled")
    with pytest.raises(NotFound, match="job 'job-nope': no such job"):
        c.api.wait_jobs([a, "job-nope"], count=1, timeout=0)
    # gl.wait and gl.as_completed over HTTP
    ha, hb = gl.JobHandle(a, c), gl.JobHandle(b, c)
    with pytest.raises(TimeoutError, match=rf"^job {a} is still queued after 0\.2 s$"):
        gl.wait([hb, ha], timeout=0.2)
    seen: list[str] = []
    with pytest.raises(TimeoutError, match=r"^1 job\(s\) still running after 0\.2 s$"):
        for h in gl.as_completed([ha, hb], timeout=0.2):
            seen.append(h.id)
    assert seen == [b]
    c.api.cancel(a)
    assert [r.id for r in gl.wait([ha, hb, ha], timeout=30)] == [a, b, a]


def test_a_long_poll_for_logs_is_answered_by_the_output_and_followed_through_the_http_client(
        server: ServerProc, admin: Api) -> None:
    """``GET /v1/jobs/{id}/logs?wait=S``: answered the moment the job's output is stored (or
    its state changes), the follower's long poll over HTTP."""
    import threading

    label = {"test": "follow-logs"}  # (only this worker serves the job)
    r = Api(server.url, admin.token_for("join")["token"])(
        "POST", "/v1/workers/join", json={"capabilities": json.loads(make_capabilities(labels=label).model_dump_json()),
                                          "cpu_slots": 1})
    assert r.status_code == 201, r.text
    wid = r.json()["worker_id"]
    worker = Api(server.url, r.json()["token"])
    client = http_client(server.url, token=admin.token_for("client")["token"], retry_for=2)
    job = client.submit(CommandJob(command=["x"], requirements=Requirements(labels=label),
                                   placement=Placement(target="remote")))
    c = Api(server.url, client.api.token)  # type: ignore[attr-defined]
    [task_id] = [t["task_id"] for t in worker("GET", f"/v1/workers/{wid}/tasks", params={"wait": 10}).json()]

    def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
        out: list[Any] = []
        t = threading.Thread(target=lambda: out.append(call()), daemon=True)
        t.start()
        return t, out

    # the start ends a wait (the state changed), empty (a poll that began after the start
    # waits its 10 s out, empty too: the sleeps only make the wake-up the likely case)
    t, out = in_thread(lambda: c("GET", f"/v1/jobs/{job.id}/logs", params={"wait": 10}))
    time.sleep(0.3)  # (so that it waits; nothing is measured)
    assert worker("POST", f"/v1/tasks/{task_id}/start").status_code == 204
    t.join(20)
    assert not t.is_alive() and out[0].status_code == 200 and out[0].json() == []
    # output ends one (or is there at once for a poll that began after it)
    t, out = in_thread(lambda: c("GET", f"/v1/jobs/{job.id}/logs", params={"wait": 10}))
    time.sleep(0.3)
    r = worker("POST", f"/v1/tasks/{task_id}/logs", json={"chunks": [["stdout", "one\n"]]})
    assert r.status_code == 204, r.text
    t.join(20)
    assert not t.is_alive(), "the output did not end the long poll"
    [first] = out[0].json()
    assert first["data"] == "one\n"
    # and the follower gets the rest, to the end
    follower, got = in_thread(lambda: "".join(ch.data for ch in client.follow(job.id)))
    for i in range(5):
        assert worker("POST", f"/v1/tasks/{task_id}/logs", json={"chunks": [["stdout", f"{i}\n"]]}).status_code == 204
    assert worker("POST", f"/v1/tasks/{task_id}/finish",
                  json={"state": "succeeded", "exit_code": 0}).status_code == 200
    follower.join(20)
    assert got == ["one\n0\n1\n2\n3\n4\n"]
    # an ended job's page comes at once; bad waits are refused naming the field
    assert c("GET", f"/v1/jobs/{job.id}/logs", params={"after": first["id"], "wait": 30}).json()[0]["data"] == "0\n"
    for bad in ("-1", "31", "soon"):
        r = c("GET", f"/v1/jobs/{job.id}/logs", params={"wait": bad})
        assert r.status_code == 422 and re.search(r"\bwait\b", r.json()["error"]["message"]), (bad, r.text)
    r = c("GET", "/v1/jobs/job-nope/logs", params={"wait": 5})
    assert r.status_code == 404


def test_a_result_reported_as_its_json_text_goes_into_the_request_as_it_is(server: ServerProc, admin: Api) -> None:
    """A worker's HttpAPI sends a ResultJSON's text in the report's body without parsing it
    (the rest of the body around it); the caller reads the value, whatever the text holds."""
    from gpulayer.api import ResultJSON
    from gpulayer.records import TaskState
    from gpulayer.specs import FunctionJob

    label = {"test": "result-json"}
    r = Api(server.url, admin.token_for("join")["token"])(
        "POST", "/v1/workers/join", json={"capabilities": json.loads(make_capabilities(labels=label).model_dump_json()),
                                          "cpu_slots": 1})
    assert r.status_code == 201, r.text
    wid = r.json()["worker_id"]
    worker = http_client(server.url, token=r.json()["token"], retry_for=2).api
    client = http_client(server.url, token=admin.token_for("client")["token"], retry_for=2)
    job = client.submit(FunctionJob(function="m:f", requirements=Requirements(labels=label),
                                    placement=Placement(target="remote")))
    [task] = worker.poll_tasks(wid, wait=10)
    worker.start_task(task.task_id, worker_id=wid)
    text = '{"marker": "\\u0000gpulayer-json-text:00", "n": [1, 2.5, null], "s": "caf\\u00e9"}'
    worker.finish_task(task.task_id, worker_id=wid, state=TaskState.SUCCEEDED, exit_code=0, result=ResultJSON(text))
    done = client.wait(job.id, timeout=30)
    assert done.state.value == "succeeded"
    assert done.result == {"marker": "\0gpulayer-json-text:00", "n": [1, 2.5, None], "s": "caf\u00e9"}
    # a list of jobs leaves results out (a result may be megabytes); the job's record has it
    [listed] = [j for j in client.api.list_jobs() if j.id == job.id]
    assert (listed.state.value, listed.result) == ("succeeded", None)
    assert client.api.get_job(job.id).result == done.result


def test_a_worker_whose_token_was_revoked_stops(server: ServerProc, admin: Api, tmp_path: Path) -> None:
    """The server let the worker go (its token revoked: by an admin, or for an idle machine
    the server ends): no heartbeat of it would be heard again, so it stops by itself, exit
    1, saying why, rather than beat for ever; and it does not warn that it could not
    deregister (there is nothing to deregister)."""
    before = {t["id"] for t in admin("GET", "/v1/tokens").json()}
    proc = start_remote_worker(server.url, admin.token_for("join")["token"], tmp_path / "w")
    try:
        wait_for(lambda: [t for t in admin("GET", "/v1/tokens").json()
                          if t["id"] not in before and t["scope"] == "worker"], 60, "the worker's own token")
        [mine] = [t for t in admin("GET", "/v1/tokens").json() if t["id"] not in before and t["scope"] == "worker"]
        assert admin("DELETE", f"/v1/tokens/{mine['id']}").status_code == 200
        assert proc.wait(60) == 1  # (verification results are cached for at most 2 s)
    finally:
        stop_proc(proc)
    log = (tmp_path / "w" / "worker.log").read_text()
    assert "could not deregister" not in log and "heartbeat failed" not in log, log
    assert f"the control plane refused this worker's token (token {mine['id']} was revoked): stopping" in log
    assert f"worker: stopped: the control plane refused its token (token {mine['id']} was revoked)" in log


def test_more_labels_or_frameworks_than_accepted_are_refused_before_placement_looks_at_them(
        server: ServerProc, tokens: dict[str, Any]) -> None:
    """A client's ``POST /v1/explain`` with 500,000 labels (8 MB, under the body limit) kept a
    server's core busy for hours: the explanation tries each label left out against the
    fleet. 100 labels and 100 frameworks are accepted, no more."""
    client = Api(server.url, tokens["client"])
    labels = {f"k{i}": "v" for i in range(500_000)}
    started = time.monotonic()
    r = client("POST", "/v1/explain", json={"spec": {"kind": "command", "command": ["x"],
                                                      "requirements": {"labels": labels}}})
    assert r.status_code == 422, r.text[:300]
    assert time.monotonic() - started < 30
    assert r.json()["error"]["message"] == ("body.spec.requirements.labels: 500000 labels; accepted: at most 100 "
                                            "KEY=VALUE pairs")
    frameworks = {f"fw{i}": "" for i in range(101)}
    r = client("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["x"],
                                                   "requirements": {"frameworks": frameworks}}})
    assert r.status_code == 422 and "101 frameworks; accepted: at most 100 frameworks" in r.text, r.text[:300]
    r = client("POST", "/v1/explain", json={"spec": {"kind": "command", "command": ["x"], "requirements": {
        "labels": dict(list(labels.items())[:100]), "frameworks": dict(list(frameworks.items())[:100])}}})
    assert r.status_code == 200, r.text[:300]
