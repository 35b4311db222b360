"""What a server does for a large fleet stays correct: heartbeats answered before they are
written are written soon and a silent worker still goes offline; a worker poll hears of work
another server placed; a credential revoked through one server is refused by another within
the cache's bound (see docs/server.md, "Fleets")."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.factories import make_capabilities
from tests.server_support import Api, ServerProc
from tests.support import wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> str | None:
    return str(request.getfixturevalue("postgres_url")) if request.param == "postgresql" else None


@pytest.fixture
def server(tmp_path: Path, database: str | None) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path / "s", database=database, env={"GPULAYER_HEARTBEAT_TIMEOUT": "3"}).start()
    yield srv
    srv.stop()


def join(url: str, admin: Api) -> tuple[str, Api]:
    token = admin.token_for("join")["token"]
    r = Api(url, token)("POST", "/v1/workers/join",
                        json={"capabilities": json.loads(make_capabilities().model_dump_json()), "cpu_slots": 1})
    assert r.status_code == 201, r.text
    return r.json()["worker_id"], Api(url, r.json()["token"])


def worker(admin: Api, wid: str) -> dict[str, Any]:
    return next(w for w in admin("GET", "/v1/workers").json() if w["id"] == wid)


def beat(w: Api, wid: str) -> dict[str, Any]:
    r = w("POST", f"/v1/workers/{wid}/heartbeat", json={"running": []})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_heartbeats_answered_at_once_are_written_and_silence_still_counts(server: ServerProc) -> None:
    admin = Api(server.url, server.admin_token)
    wid, w = join(server.url, admin)
    assert beat(w, wid) == {"known": True, "cancel": []}
    first = worker(admin, wid)["last_heartbeat"]
    # answered at once (a worker this server knows, running nothing) and written soon after
    assert beat(w, wid) == {"known": True, "cancel": []}
    wait_for(lambda: beat(w, wid) and worker(admin, wid)["last_heartbeat"] > first, 30, "a later heartbeat written")
    # silent: offline after the timeout, as before
    wait_for(lambda: not worker(admin, wid)["online"], 60, "the silent worker to go offline")
    # and a heartbeat brings it back
    assert beat(w, wid)["known"] is True
    # (beating while it looks: online lasts one heartbeat timeout after each, and a look
    # after a slow moment would otherwise find it gone again)
    wait_for(lambda: beat(w, wid) and worker(admin, wid)["online"], 30, "the worker to be online again")
    # a worker that left: its credential is refused at once
    assert w("DELETE", f"/v1/workers/{wid}").status_code == 204
    r = w("POST", f"/v1/workers/{wid}/heartbeat", json={"running": []})
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]


def poll_hears_a_new_job(w: Api, wid: str, submit_with: Api, *, settle: float = 0.0) -> None:
    """A long poll of worker ``wid`` is answered with the remote command job that
    ``submit_with`` submits while it waits (``settle`` seconds after it was sent)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        poll = pool.submit(w, "POST", f"/v1/workers/{wid}/work", params={"wait": 25}, json={"running": []})
        time.sleep(settle)
        job = submit_with("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"],
                                                             "placement": {"target": "remote"}}})
        assert job.status_code == 201, job.text
        r = poll.result(60)
    assert r.status_code == 200, r.text
    assert [t["job_id"] for t in r.json()["tasks"]] == [job.json()["id"]]


def test_a_poll_that_hears_of_nothing_answers_empty_and_an_assignment_wakes_one(server: ServerProc) -> None:

    admin = Api(server.url, server.admin_token)
    wid, w = join(server.url, admin)
    # nothing to do: answered empty when its (spread) wait runs out
    for _ in range(2):
        r = w("POST", f"/v1/workers/{wid}/work", params={"wait": 1}, json={"running": []})
        assert r.status_code == 200 and r.json() == {"tasks": [], "cancel": []}, r.text
    # a waiting poll is woken by the task this server assigns it (given time to reach its
    # wait: else its first look finds the task, and it passes too)
    poll_hears_a_new_job(w, wid, admin, settle=0.5)


@pytest.mark.postgres
def test_two_servers_share_polls_and_revocations(postgres_url: str, tmp_path: Path) -> None:
    s1 = ServerProc(tmp_path / "s1", database=postgres_url).start()
    s2 = ServerProc(tmp_path / "s2", database=postgres_url).start()
    try:
        a1, a2 = Api(s1.url, s1.admin_token), Api(s2.url, s1.admin_token)
        wid, w = join(s1.url, a1)
        beat(w, wid)
        # a poll waiting on s1 hears of a task s2 placed (s1 made no change of its own)
        poll_hears_a_new_job(w, wid, a2)
        # the worker's credential, revoked through s2, is refused by s1 (which had it cached)
        beat(w, wid)
        assert a2("DELETE", f"/v1/workers/{wid}").status_code == 204
        wait_for(lambda: w("POST", f"/v1/workers/{wid}/heartbeat", json={"running": []}).status_code == 401,
                 30, "s1 to refuse the revoked credential")
    finally:
        s1.stop()
        s2.stop()
