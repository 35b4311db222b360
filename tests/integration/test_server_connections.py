"""What a real ``gpulayer server start`` does with connections that never finish a request's
head (request line and headers): too large, too slow, or nothing at all. Anyone who can reach
the port can open one, token or not (gpulayer.server.protocol)."""

from __future__ import annotations

import re
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpulayer.server.protocol import MAX_HEAD_BYTES
from tests.server_support import ServerProc

pytestmark = pytest.mark.timeout(120)

HEAD_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    home = tmp_path_factory.mktemp("server-home")
    # started at a soft limit of 1,024 open files, the usual default
    srv = ServerProc(home, env={"GPULAYER_SERVER_HEADER_TIMEOUT": str(HEAD_TIMEOUT)}, open_files=1024).start()
    yield srv
    srv.stop()


def _connect(server: ServerProc) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def _answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (a reset, where it closed with
    bytes of ours unread, ends it too)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _status(answer: bytes) -> int | None:
    m = re.match(rb"HTTP/1.1 (\d{3}) ", answer)
    return int(m.group(1)) if m else None


def test_a_request_head_over_the_limit_is_refused_and_holds_nobody_up(server: ServerProc) -> None:
    """A 150 MB header from a client without a token held the event loop for minutes (the
    parser gathers a value by concatenation): /healthz took 7-22 s meanwhile, workers' calls
    timed out."""
    with _connect(server) as sock:
        sock.settimeout(10)  # (before, the server waited for the rest of the head: a timeout here)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(2 * MAX_HEAD_BYTES // 4096):
                sock.sendall(b"a" * 4096)
                time.sleep(0.001)
        except OSError:  # (refused before all of it was sent: the server closed)
            pass
        answer = _answer(sock)
    # the refusal, or a reset where the server closed with bytes of the head unread
    assert answer == b"" or _status(answer) == 431, answer[:200]
    assert answer == b"" or f"over the limit of {MAX_HEAD_BYTES} bytes".encode() in answer
    started = time.monotonic()
    assert httpx.get(f"{server.url}/healthz", timeout=5).json() == {"ok": True}
    assert time.monotonic() - started < 2


def test_a_head_that_does_not_come_in_time_is_answered_408_and_closed(server: ServerProc) -> None:
    """A connection that sent part of a head and then nothing stayed open for good."""
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answer = _answer(sock)
        took = time.monotonic() - started
    assert _status(answer) == 408, answer[:200]
    assert f"not received within {HEAD_TIMEOUT:g} s".encode() in answer
    assert HEAD_TIMEOUT - 0.5 < took < HEAD_TIMEOUT + 5


def test_connections_that_send_nothing_are_closed_and_do_not_use_up_the_server(server: ServerProc) -> None:
    """1,100 connections that sent nothing (or a head a byte at a time) left a server with a
    soft limit of 1,024 open files answering nobody, and they were never closed."""
    pid = server.proc.pid if server.proc else 0
    limits = Path(f"/proc/{pid}/limits").read_text()
    soft, hard = re.search(r"Max open files\s+(\S+)\s+(\S+)", limits).groups()  # type: ignore[union-attr]
    assert soft == hard  # (raised to the hard limit at the start)
    mine_soft, mine_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = min(1100, mine_hard - 100)
    resource.setrlimit(resource.RLIMIT_NOFILE, (mine_hard, mine_hard))
    socks = []
    try:
        for _ in range(count):
            socks.append(_connect(server))
        assert httpx.get(f"{server.url}/healthz", timeout=5).json() == {"ok": True}
        time.sleep(HEAD_TIMEOUT + 1)
        for sock in socks:
            sock.settimeout(5)
            assert _answer(sock) == b""  # closed, without an answer: it asked nothing
    finally:
        for sock in socks:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (mine_soft, mine_hard))


def test_the_head_timeout_bounds_a_head_only(server: ServerProc) -> None:
    """A connection kept alive between requests for longer than the header timeout, a
    request answered after it (a long poll) and a body sent slowly are all served."""
    token = server.admin_token
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=30) as http:
        job = http.post("/v1/jobs", json={"spec": {"kind": "command", "command": ["true"],
                                                   "placement": {"target": "remote", "on_unschedulable": "wait"}}})
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        time.sleep(HEAD_TIMEOUT + 1)  # (idle on the connection the client keeps)
        started = time.monotonic()
        waited = http.get(f"/v1/jobs/{job_id}/wait", params={"timeout": HEAD_TIMEOUT + 1})
        assert waited.status_code == 200 and waited.json()["state"] == "queued"
        assert time.monotonic() - started >= HEAD_TIMEOUT + 1
    body = b'{"job_ids": ["%s"]}' % job_id.encode()
    with _connect(server) as sock:
        sock.sendall(b"POST /v1/jobs/cancel HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token.encode()
                     + b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n")
        for i in range(0, len(body), 4):
            sock.sendall(body[i:i + 4])
            time.sleep((HEAD_TIMEOUT + 1) / (len(body) / 4))
        answer = _answer(sock)
    assert _status(answer) == 200, answer[:300]
    assert b'"state":"cancelled"' in answer
