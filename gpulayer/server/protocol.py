"""The HTTP/1.1 connection of ``gpulayer server start`` and ``gpulayer dashboard``: uvicorn's
httptools protocol, with bounds on a request's head (its request line and headers).

uvicorn's httptools protocol takes a head of any size, however long it takes: the parser
gathers a header's value by concatenation, so one client without a token that sent a
150 MB header held the event loop for minutes (``/healthz`` took 7-22 s meanwhile, every
worker's heartbeat and poll timed out), and a connection that sent nothing, or a head a byte
at a time, stayed open for good (1,100 of them made a server with ``ulimit -n 1024`` answer
nobody). Here a head is refused past :data:`MAX_HEAD_BYTES` (431, the connection closed),
and a connection is closed that has not sent a whole head within the header timeout
(``GPULAYER_SERVER_HEADER_TIMEOUT``) of opening, or of the first byte of a later request;
between requests, uvicorn's keep-alive timeout applies as before. What comes after the head
is the routes' business (bodies have their limits there, and are read after the token was
checked).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpulayer import config

#: the largest request head taken (a client's is well under a KiB; a browser's cookies a few KiB)
MAX_HEAD_BYTES = 64 * 1024


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` with a size and a time bound on each request's head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout = config.settings().server_header_timeout
        #: a head is being received (or awaited on a new connection)
        self._in_head = False
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True  # (a new connection owes its first request's head)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        # (the chunk may also hold the end of the request before: counted whole, a chunk
        # is at most a read's buffer)
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._cancel_head_timer()
            self._refuse(431, "Request Header Fields Too Large",
                         f"request line and headers over the limit of {MAX_HEAD_BYTES} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        if self._head_timer is None:  # (a new connection's timer runs from when it opened)
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self._head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a request before this one is still being answered (a client that pipelines):
            # its answer is not cut off; the head it waits behind gets another period
            self._arm_head_timer()
            return
        if self._head_bytes:
            self._refuse(408, "Request Timeout",
                         f"request line and headers not received within {self._head_timeout:g} s")
        else:
            self.transport.close()  # (a connection that never sent anything is not answered)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        body = message.encode("ascii")
        self.transport.write(b"".join([
            f"HTTP/1.1 {status} {reason}\r\n".encode("ascii"),
            b"content-type: text/plain; charset=utf-8\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n\r\n", body]))
        self.transport.close()
