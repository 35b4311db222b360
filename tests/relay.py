"""A TCP relay between a client and a server on 127.0.0.1, which a test makes fail at an
exact moment: :meth:`Relay.drop_next` has the answer to the next request of a kind not
reach the client (what the client sees of a server killed between its commit and its
answer, or of an answer lost on the way); :meth:`Relay.cut` ends every connection and
refuses new ones (a database server that went away)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable

_REQUEST = re.compile(rb"[A-Z]+ /")


class Relay:
    """Relays 127.0.0.1:``port`` (a server) at :attr:`port` (:attr:`url` for HTTP)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.fired = threading.Event()
        self._watch: re.Pattern[bytes] | None = None
        self._before: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_next(self, request: re.Pattern[bytes], before: Callable[[], None] | None = None) -> None:
        """The answer to the next HTTP request whose request line matches ``request`` does not
        reach the client: ``before()`` is called as it comes out of the server (the request
        was carried out), and the client's connection is closed without it."""
        with self._lock:
            self.fired.clear()
            self._watch, self._before = request, before

    def cut(self) -> None:
        """End every connection and refuse new ones, for good."""
        with contextlib.suppress(OSError):  # (wakes the accept: a close alone leaves it listening)
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    close = cut

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self.target))
        except OSError:  # the server is down: the client's connection ends unanswered
            client.close()
            return
        with self._lock:
            self._open.update((client, server))
        watched = [False]  # whether the last request on this connection is watched (HTTP/1.1: one at a time)

        def requests() -> None:
            try:
                while data := client.recv(65536):
                    if _REQUEST.match(data):
                        with self._lock:
                            watched[0] = bool(self._watch is not None and self._watch.match(data))
                    server.sendall(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    server.shutdown(socket.SHUT_RDWR)

        threading.Thread(target=requests, daemon=True).start()
        try:
            while data := server.recv(65536):
                if watched[0]:
                    with self._lock:  # (the first watched answer alone)
                        armed, before = self._watch is not None, self._before
                        self._watch = self._before = None
                    if armed:
                        if before is not None:
                            before()  # (the answer is out of the server: the request was carried out)
                        self.fired.set()
                        break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for s in (client, server):  # (a shutdown wakes the other thread's recv; a close would not)
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                self._open.difference_update((client, server))
