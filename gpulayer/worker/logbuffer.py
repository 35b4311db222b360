"""A task's output on its way to the control plane: decoded as it arrives (a character cut
between two reads waits for its other half) and shipped in chunks, at most every
``interval`` seconds and at once past :data:`SHIP_AT` characters, by the worker agent
(:mod:`.agent`)."""

from __future__ import annotations

import codecs
import logging
import threading
import time
from collections.abc import Callable

from gpulayer.api import LogStream

log = logging.getLogger(__name__)

#: output waiting to be shipped goes at once past this many characters: each chunk is a write
#: transaction, and a task that writes fast fills one in milliseconds (at 64 kB, 200 MB of
#: output were 3,200 of them). Its JSON stays far below a server's request limit (16 MB): at
#: most 12 bytes a character, escaped.
SHIP_AT = 512 * 1024


class LogBuffer:
    """Collects a task's output and ships it in chunks, at most every ``interval`` seconds."""

    def __init__(self, send: Callable[[list[tuple[LogStream, str]]], None], interval: float = 0.1) -> None:
        self._send = send
        self._interval = interval
        self._lock = threading.Lock()
        # taken from taking chunks to having sent them, so chunks arrive in order
        self._send_lock = threading.Lock()
        #: what is not shipped yet: runs of one stream, each a list of pieces (joined when
        #: shipped: adding each read to one string copied the run again at every read)
        self._pending: list[tuple[LogStream, list[str]]] = []
        self._decoders: dict[LogStream, codecs.IncrementalDecoder] = {
            s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}
        self._size = 0
        self._last = time.monotonic()
        self._closed = threading.Event()
        # output that arrives in one burst and then nothing must still show up promptly:
        # a ticker ships it, started with the first output (a silent task needs none)
        self._ticker: threading.Thread | None = None

    def _tick(self) -> None:
        while not self._closed.wait(self._interval):
            if self._pending:
                self.flush()

    def close(self) -> None:
        """Stop the ticker and ship everything, including a character cut off at the end."""
        self._closed.set()
        with self._lock:
            ticker = self._ticker
        if ticker is not None:
            ticker.join(5)
        with self._lock:
            for stream, dec in self._decoders.items():
                tail = dec.decode(b"", final=True)
                if tail:
                    self._append(stream, tail)
        self.flush()

    def write(self, stream: str, data: bytes) -> None:
        with self._lock:
            # a multi-byte character split across two reads stays in the decoder until
            # its other half arrives
            name: LogStream = "stderr" if stream == "stderr" else "stdout"
            dec = self._decoders.setdefault(name, codecs.getincrementaldecoder("utf-8")("replace"))
            self._append(name, dec.decode(data))
            due = self._size > SHIP_AT or time.monotonic() - self._last >= self._interval
            if self._ticker is None and not self._closed.is_set():
                self._ticker = threading.Thread(target=self._tick, name="gpulayer-logs", daemon=True)
                self._ticker.start()
        if due:
            self.flush()

    def add(self, stream: LogStream, text: str) -> None:
        with self._lock:
            self._append(stream, text)

    def _append(self, stream: LogStream, text: str) -> None:
        if not text:
            return
        if self._pending and self._pending[-1][0] == stream:
            self._pending[-1][1].append(text)
        else:
            self._pending.append((stream, [text]))
        self._size += len(text)

    def flush(self) -> None:
        with self._send_lock:
            with self._lock:
                runs, self._pending, self._size = self._pending, [], 0
                self._last = time.monotonic()
            chunks = [(stream, "".join(pieces)) for stream, pieces in runs]
            if chunks:
                try:
                    self._send(chunks)
                except Exception as exc:  # logs are best effort; the result is what counts
                    log.warning("could not ship %d log chunk(s): %s", len(chunks), exc)
