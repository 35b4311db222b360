"""A server killed (SIGKILL) after it stored an upload of a task's output and before its
answer reached the worker: the worker sends the upload again, and it is stored once.

The moment is made exact by a TCP relay between the worker and the server: armed, it kills
the server as the answer to the next upload comes out of it (the upload is committed: the
answer is written after the commit) and closes the worker's connection without relaying it,
which is what the worker sees of a server killed at that moment."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpulayer.client import http_client
from gpulayer.records import JobState
from gpulayer.specs import CommandJob, Placement
from tests.server_support import Api, ServerProc, start_remote_worker, stop_proc, wait_workers

pytestmark = pytest.mark.timeout(300)

_REQUEST = re.compile(rb"[A-Z]+ /")
_UPLOAD = re.compile(rb"POST /v1/tasks/[^/ ]+/logs ")


class KillingRelay:
    """Relays 127.0.0.1:``port`` (a server); :meth:`arm` has the next upload's answer end in
    ``kill()`` instead of reaching the worker."""

    def __init__(self, port: int, kill: Callable[[], None]) -> None:
        self.port, self.kill = port, kill
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed, self.fired = threading.Event(), threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self) -> None:
        self.fired.clear()
        self.armed.set()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, worker: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.port))
        except OSError:  # the server is down: the worker's connection ends unanswered
            worker.close()
            return
        upload = [False]  # whether the last request on this connection is an upload (HTTP/1.1: one at a time)

        def requests() -> None:
            try:
                while data := worker.recv(65536):
                    if _REQUEST.match(data):
                        upload[0] = bool(_UPLOAD.match(data))
                    server.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    server.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=requests, daemon=True).start()
        try:
            while data := server.recv(65536):
                if upload[0] and self.armed.is_set():
                    self.armed.clear()
                    self.kill()  # (the answer is out of the server: the upload was committed)
                    self.fired.set()
                    break
                worker.sendall(data)
        except OSError:
            pass
        finally:
            for s in (worker, server):  # (a shutdown wakes the other thread's recv; a close would not)
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


def test_output_uploaded_again_after_the_server_was_killed_before_answering_is_stored_once(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "server", env={"GPULAYER_HEARTBEAT_TIMEOUT": "60"}).start()
    relay = KillingRelay(srv.port, lambda: srv.kill(signal.SIGKILL))
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
        relay.arm()  # the job's first upload is stored, then the server dies
        job = c.submit(CommandJob(command=[sys.executable, "-c", script],
                                  placement=Placement(target="remote", on_unschedulable="wait")))
        assert relay.fired.wait(120), srv.log()[-2000:]
        srv.start()
        relay.arm()  # and the first upload after the restart too
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
