"""A server killed (SIGKILL) after it stored an upload of a task's output and before its
answer reached the worker: the worker sends the upload again, and it is stored once.

The moment is made exact by a TCP relay between the worker and the server (tests.relay): it
kills the server as the answer to the next upload comes out of it (the upload is committed:
the answer is written after the commit) and closes the worker's connection without relaying
it, which is what the worker sees of a server killed at that moment."""

from __future__ import annotations

import functools
import re
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from gpulayer.client import http_client
from gpulayer.records import JobState
from gpulayer.specs import CommandJob, Placement
from tests.relay import Relay
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers

pytestmark = pytest.mark.timeout(300)

_UPLOAD = re.compile(rb"POST /v1/tasks/[^/ ]+/logs ")


def test_output_uploaded_again_after_the_server_was_killed_before_answering_is_stored_once(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "60"}).start()
    relay = Relay(srv.port)
    kill = functools.partial(srv.kill, signal.SIGKILL)
    admin = Api(srv.url, srv.admin_token)
    go = tmp_path / "go"
    script = textwrap.dedent(f"""\
        import os, time
        for i in range(1, 1001):
            print(f"line {{i}}")
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        for i in range(1001, 2001):
            print(f"line {{i}}")
        """)
    worker = start_remote_worker(relay.url, admin.token_for("join")["token"], tmp_path / "w", cpu_slots=1)
    try:
        wait_workers(admin, 1)
        c = http_client(srv.url, token=srv.admin_token, retry_for=60)
        relay.drop_next(_UPLOAD, kill)  # the job's first upload is stored, then the server dies
        job = c.submit(CommandJob(command=[sys.executable, "-c", script],
                                  placement=Placement(target="remote", on_unschedulable="wait")))
        assert relay.fired.wait(120), srv.log()[-2000:]
        srv.start()
        relay.drop_next(_UPLOAD, kill)  # and the first upload after the restart too
        go.touch()
        assert relay.fired.wait(120), srv.log()[-2000:]
        srv.start()
        c = http_client(srv.url, token=srv.admin_token, retry_for=60)
        done = c.wait(job.id, timeout=120)
        assert done.state is JobState.SUCCEEDED, (done.state, done.error)
        lines = "".join(ch.data for ch in c.log_chunks(job.id)).splitlines()
        assert len(lines) == 2000 and lines == [f"line {i}" for i in range(1, 2001)], (
            len(lines), [line for line in set(lines) if lines.count(line) > 1][:5])
    finally:
        relay.close()
        stop_proc(worker, signal.SIGKILL)
        srv.stop()
