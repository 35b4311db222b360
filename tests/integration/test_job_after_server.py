"""Jobs that run after one whose worker went silent, against a real ``gpulayer server start``
process on SQLite and on PostgreSQL: the late report that it succeeded after all puts them
back to wait (docs/concepts.md, "Jobs that run after others"; the cases one by one:
tests/unit/test_job_after.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.server_support import Api, ServerProc, joined_worker
from tests.support import wait_for

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_late_success_puts_the_chain_after_a_lost_job_back_to_wait(
        database: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("postgres_url") if database == "postgresql" else None
    srv = ServerProc(tmp_path / "server", database=url, env={"GPULAYER_HEARTBEAT_TIMEOUT": "2"}).start()
    try:
        admin = Api(srv.url, srv.admin_token)
        wid, worker = joined_worker(srv.url, admin)

        def submit(**fields: Any) -> str:
            r = admin("POST", "/v1/jobs", json={"spec": {
                "kind": "command", "command": ["true"],
                "placement": {"target": "remote", "on_unschedulable": "wait"}, **fields}})
            assert r.status_code == 201, r.text
            return str(r.json()["id"])

        def job(job_id: str) -> dict[str, Any]:
            return dict(admin("GET", f"/v1/jobs/{job_id}").json())

        lost = submit()
        following = submit(after=[lost])
        second = submit(after=[following])
        cleanup = submit(after_ended=[following])
        [task] = worker("GET", f"/v1/workers/{wid}/tasks", params={"wait": 10}).json()
        assert worker("POST", f"/v1/tasks/{task['task_id']}/start").status_code == 204
        # the worker is cut off: no heartbeat; the server writes the task off, and the job with it
        wait_for(lambda: job(lost)["state"] == "failed", 60, "the job to be lost")
        assert job(lost)["error"]["type"] == "lost"
        assert [job(j)["error"]["type"] for j in (following, second)] == ["dependency", "dependency"]
        assert job(cleanup)["state"] == "queued" and not job(cleanup)["tasks"]  # (released: no worker is online)

        r = worker("POST", f"/v1/tasks/{task['task_id']}/finish", json={"state": "succeeded", "exit_code": 0})
        assert r.status_code == 200, r.text

        assert job(lost)["state"] == "succeeded"
        assert job(following)["state"] in ("queued", "assigned") and job(following)["error"] is None
        events = [(e["kind"], e["message"]) for e in admin("GET", f"/v1/jobs/{following}/events").json()]
        assert ("waits_again", f"waits again: {lost}, which it runs after, succeeded after all (a late report)") \
            in events
        for waiting, summary in ((second, f"waiting for {following} to succeed first (it runs after it)"),
                                 (cleanup, f"waiting for {following} to end first (it runs after it)")):
            record = job(waiting)
            assert record["state"] == "queued" and record["decision"]["summary"] == summary, record
    finally:
        srv.stop()
