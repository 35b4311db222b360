"""A worker from before jobs ran after others (schema 11) against a newer server, a real
``gpulayer server start`` process: what it is handed is a spec it can read (docs/server.md,
"Upgrading")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from gpulayer.specs import CommandJob
from tests.server_support import Api, ServerProc, joined_worker

pytestmark = pytest.mark.timeout(300)

#: a command job's spec as a worker from before schema 11 reads it: without ``after`` and
#: ``after_ended``, and a field it does not know is an error (it failed every poll that
#: handed it a job submitted with ``--after``: ``tasks.0.spec.command.after: Extra inputs
#: are not permitted``, and the task stayed assigned to it)
OlderCommandJob: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "OlderCommandJob", __config__=ConfigDict(extra="forbid"),
    **{name: (field.annotation, field) for name, field in CommandJob.model_fields.items()
       if name not in ("after", "after_ended")})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path / "server").start()
    yield srv
    srv.stop()


def test_a_job_that_runs_after_others_is_handed_to_workers_without_those_fields(server: ServerProc) -> None:
    admin = Api(server.url, server.admin_token)
    wid, worker = joined_worker(server.url, admin)

    def submit(**fields: Any) -> str:
        r = admin("POST", "/v1/jobs", json={"spec": {"kind": "command", "command": ["true"],
                                                     "placement": {"target": "remote"}, **fields}})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    first = submit()
    later, cleanup, more = submit(after=[first]), submit(after_ended=[first]), submit(after=[first])
    assert admin("GET", f"/v1/jobs/{later}").json()["spec"]["after"] == [first]  # (the server keeps them)
    with pytest.raises(ValidationError, match="after"):  # (the older model refuses the field)
        OlderCommandJob.model_validate({"kind": "command", "command": ["true"], "after": [first]})

    handed: dict[str, dict[str, dict[str, Any]]] = {}  # route -> job -> the spec it handed

    def read(route: str, tasks: list[dict[str, Any]]) -> str:
        [task] = tasks
        handed.setdefault(route, {})[task["job_id"]] = task["spec"]
        return str(task["task_id"])

    def finish(task: str) -> list[dict[str, Any]]:
        assert worker("POST", f"/v1/tasks/{task}/start").status_code == 204
        r = worker("POST", f"/v1/tasks/{task}/finish", json={"state": "succeeded", "exit_code": 0})
        assert r.status_code == 200, r.text
        return list(r.json())

    # one slot: the first; its end releases the others, and one is placed (the poll is woken)
    assert finish(read("poll", worker("GET", f"/v1/workers/{wid}/tasks", params={"wait": 10}).json())) == []
    task = read("poll", worker("GET", f"/v1/workers/{wid}/tasks", params={"wait": 10}).json())
    # the report's answer hands the next, as does the poll of the work to do
    read("report", finish(task))
    task = read("work", worker("POST", f"/v1/workers/{wid}/work", params={"wait": 10}, json={"running": []})
                .json()["tasks"])
    read("report", finish(task))
    assert finish(read("poll", worker("GET", f"/v1/workers/{wid}/tasks", params={"wait": 10}).json())) == []

    assert all(set(handed[route]) - {first} for route in ("poll", "report", "work"))  # (a job after it each)
    assert {*handed["poll"], *handed["report"], *handed["work"]} == {first, later, cleanup, more}
    for route, specs in handed.items():
        for job_id, spec in specs.items():
            assert "after" not in spec and "after_ended" not in spec, (route, job_id)
            assert OlderCommandJob.model_validate(spec).command == ["true"], (route, job_id)  # type: ignore[attr-defined]
