"""Malicious bundles against a real ``gpulayer server start`` and a real remote worker
(issue 13 §7): every upload is refused before it is stored, and a job naming it is refused;
a bundle that reached the database some other way (written there directly, as an older
server would have stored it) fails its job on the worker with a clear error, and nothing
is written outside the worker's extraction folder. The library, in-process server and CLI
paths: tests/unit/test_bundle_attacks.py."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer import bundles
from tests.bundle_attacks import COUNT_LIMIT, ESCAPE_NAME, attacks
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, until, wait_workers

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("attacks")
    env = {"GPULAYER_MAX_BUNDLE_FILES": COUNT_LIMIT}
    srv = ServerProc(root / "server", env=env).start()
    admin = Api(srv.url, srv.admin_token)
    worker = start_remote_worker(srv.url, admin.token_for("join")["token"], root / "worker", env=env)
    try:
        wait_workers(admin, 1)
        yield {"root": root, "server": srv, "admin": admin,
               "client": Api(srv.url, admin.token_for("client")["token"])}
    finally:
        stop_proc(worker)
        srv.stop()


def test_every_attack_is_refused_at_upload_and_on_the_worker(setup: dict[str, Any]) -> None:
    root: Path = setup["root"]
    client: Api = setup["client"]
    absolute = root / "abs" / ESCAPE_NAME
    jobs = {}
    for name, (make, phrase) in attacks(absolute).items():
        data = make()
        digest = bundles.compute_digest(data)
        r = client("PUT", f"/v1/bundles/{digest}", content=data)
        assert r.status_code == 422, (name, r.status_code, r.text)
        assert phrase.strip("'") in r.json()["error"]["message"], (name, r.text)
        spec = {"kind": "command", "command": ["python", "ok.py"], "bundle_digest": digest,
                "placement": {"target": "remote"}}
        r = client("POST", "/v1/jobs", json={"spec": spec})
        assert r.status_code == 422 and "no bundle with that address was uploaded" in r.text, (name, r.text)
        # stored behind the server's back, readable by this client: the worker must refuse it
        db = sqlite3.connect(setup["server"].home / "gpulayer.db", timeout=30)
        token_id = next(t["id"] for t in setup["admin"]("GET", "/v1/tokens").json()
                        if t["scope"] == "client" and not t["revoked"])
        db.execute("INSERT INTO gl_bundles (digest, size, data, created_at) VALUES (?, ?, ?, ?)",
                   (digest, len(data), data, time.time()))
        db.execute("INSERT INTO gl_bundle_readers (digest, reader, created_at) VALUES (?, ?, 0)", (digest, token_id))
        db.commit()
        db.close()
        r = client("POST", "/v1/jobs", json={"spec": spec})
        assert r.status_code == 201, (name, r.text)
        jobs[name] = (r.json()["id"], phrase.strip("'"))
    for name, (job_id, phrase) in jobs.items():
        job = until(lambda job_id=job_id: (j := client("GET", f"/v1/jobs/{job_id}").json())["state"]
                    in ("failed", "succeeded") and j, 120, f"job {job_id} ({name}) to end")
        assert job["state"] == "failed", (name, job)
        assert job["error"]["type"] == "bundle" and phrase in job["error"]["message"], (name, job["error"])
    cache = root / "worker" / "bundles"
    assert not absolute.exists()
    assert not any(p.name == ESCAPE_NAME for p in root.rglob("*"))
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [] if cache.exists() else True
