"""A TLS handshake that no retry can mend fails at once, saying why, instead of being retried
for GPULAYER_HTTP_RETRY_SECONDS (30 s by default) as an outage is: https:// to a server that
speaks plain HTTP, and a server certificate the client does not trust."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.errors import ConnectionFailed
from gpulayer.http_client import connect_http
from tests.server_support import ServerProc


@pytest.fixture
def plain_http() -> Iterator[tuple[int, list[int]]]:
    """A loopback server that answers every connection in plain HTTP: its port, and how many
    connections it took."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    taken = [0]

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            taken[0] += 1
            try:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1], taken
    sock.close()


def test_https_to_a_plain_http_server_fails_at_its_first_try(plain_http: tuple[int, list[int]]) -> None:
    port, taken = plain_http
    api = connect_http(f"https://127.0.0.1:{port}", token="t", retry_for=5)
    with pytest.raises(ConnectionFailed, match=r"the server does not speak TLS there: an http:// URL\?"):
        api.list_jobs()
    assert taken[0] == 1  # (retried, it connected again every 0.1-2 s for 5 s)


def test_a_certificate_the_client_does_not_trust_is_said(tmp_path: Path) -> None:
    server = ServerProc(tmp_path / "server", args=("--self-signed",)).start()
    try:
        api = connect_http(server.url, token=server.admin_token, retry_for=5)  # (no --ca: not trusted)
        with pytest.raises(ConnectionFailed, match=r"certificate is not one this client trusts: give its CA with "
                                                   r"--ca / GPULAYER_CA"):
            api.list_jobs()
    finally:
        server.stop()
