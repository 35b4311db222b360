"""Helpers for the dashboard's browser tests (and its screenshot script): the server the
browser looks at, and what a test does to it through the API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.server_support import Api, ServerProc, until

CHROMIUM = os.environ.get("GPULAYER_TEST_CHROMIUM", "/usr/bin/chromium")
# without the background-networking flags Chromium keeps dialling Google's services, and this
# machine's closed network refuses them; /dev/shm is small in containers
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: how long the browser waits for something a job does (it runs on a real worker)
JOB_WAIT_MS = 60_000


class Dash:
    """The server the browser looks at, and what the tests do to it through the API."""

    def __init__(self, server: ServerProc, scratch: Path) -> None:
        self.server = server
        self.url = server.url
        self.api = Api(server.url, server.admin_token)
        self.scratch = scratch
        self._held = 0

    @property
    def admin_token(self) -> str:
        return self.server.admin_token

    def submit(self, command: list[str], **spec: Any) -> str:
        body = {"kind": "command", "command": command, "timeout": 120,
                "placement": {"target": "remote", "on_unschedulable": "wait"}, **spec}
        r = self.api("POST", "/v1/jobs", json={"spec": body})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def state(self, job_id: str) -> str:
        return str(self.api("GET", f"/v1/jobs/{job_id}").json()["state"])

    def wait_state(self, job_id: str, state: str) -> None:
        until(lambda: self.state(job_id) == state, 60, f"job {job_id} to be {state}")

    def gate(self) -> Path:
        """A file a job can wait for: the test creates it to let the job go on."""
        self._held += 1
        return self.scratch / f"release-{self._held}"

    def hold_the_worker(self) -> tuple[str, Path]:
        """A running job that keeps the worker's only CPU slot until its gate opens."""
        gate = self.gate()
        job_id = self.submit(["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done"], name="holds the slot")
        self.wait_state(job_id, "running")
        return job_id, gate
